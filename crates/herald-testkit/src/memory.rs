//! How much memory the test process holds: the peak of its resident set
//! while a test runs, for tests that bound what a client can make a node
//! (running in the same process) hold.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Resident bytes of this process now: the second field of
/// `/proc/self/statm` (proc(5)), in pages of 4096 bytes.
///
/// # Panics
/// Where `/proc/self/statm` cannot be read (not Linux).
pub fn rss_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: usize = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("resident pages in /proc/self/statm");
    pages * 4096
}

/// The largest resident memory of this process seen while it runs, read
/// every 2 ms by a thread of its own.
pub struct PeakRss {
    peak: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    start: usize,
}

impl PeakRss {
    /// Starts watching, from the resident memory now.
    pub fn start() -> Self {
        let start = rss_bytes();
        let peak = Arc::new(AtomicUsize::new(start));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (peak, stop) = (peak.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    peak.fetch_max(rss_bytes(), Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(2));
                }
            })
        };
        Self {
            peak,
            stop,
            thread: Some(thread),
            start,
        }
    }

    /// How much the resident memory grew above its level at the start, at
    /// its peak, in bytes; stops watching.
    pub fn growth(mut self) -> usize {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        self.peak
            .load(Ordering::SeqCst)
            .max(rss_bytes())
            .saturating_sub(self.start)
    }
}

//! A normal build has no fault switches and says so: `herald serve` with
//! `HERALD_FAULT_SWITCHES` set refuses to start (exit status 1, "start-up
//! failed") instead of running without the fault a test asked for.
//!
//! Built with the cargo feature `fault-switches` (as the test command does
//! once, to make the binary the fault-injection tests use), the same file
//! checks the opposite: that build takes the variable and says which
//! switches are active.

use std::process::{Command, Stdio};

#[cfg(not(feature = "fault-switches"))]
#[test]
fn a_build_without_fault_switches_refuses_the_variable() {
    use std::time::{Duration, Instant};

    let data = tempfile::tempdir().expect("a temp dir");
    let mut child = Command::new(env!("CARGO_BIN_EXE_herald"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data.path())
        .env("HERALD_FAULT_SWITCHES", "drop_notify")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start herald serve");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for herald") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("herald serve started despite HERALD_FAULT_SWITCHES");
        }
        // std offers no wait with a timeout: poll the exit.
        std::thread::sleep(Duration::from_millis(20));
    };
    let stderr = std::io::read_to_string(child.stderr.take().expect("stderr")).unwrap();
    assert_eq!(status.code(), Some(1), "stderr:\n{stderr}");
    assert!(
        stderr.contains("HERALD_FAULT_SWITCHES") && stderr.contains("fault-switches"),
        "stderr:\n{stderr}"
    );
}

#[cfg(feature = "fault-switches")]
#[test]
fn a_build_with_fault_switches_takes_the_variable() {
    use std::io::{BufRead, BufReader};

    let data = tempfile::tempdir().expect("a temp dir");
    let mut child = Command::new(env!("CARGO_BIN_EXE_herald"))
        .args(["serve", "--listen", "127.0.0.1:0", "--log-format", "json"])
        .arg("--data-dir")
        .arg(data.path())
        .env("HERALD_FAULT_SWITCHES", "drop_notify")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start herald serve");
    // Read the log until the server listens (or the process ends).
    let stderr = BufReader::new(child.stderr.take().expect("stderr"));
    let mut log = Vec::new();
    for line in stderr.lines() {
        let line = line.expect("a log line");
        let listening = line.contains("\"listening\"");
        log.push(line);
        if listening {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let log = log.join("\n");
    assert!(
        log.contains("\"listening\""),
        "the switched build did not start:\n{log}"
    );
    assert!(
        log.contains("fault switches active") && log.contains("drop_notify"),
        "the switched build did not say which switches are active:\n{log}"
    );
}

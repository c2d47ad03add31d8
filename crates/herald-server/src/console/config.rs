//! The web console's settings (`[console]` in the config file,
//! `--console-*` flags).

use std::time::Duration;

/// The console's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsoleConfig {
    /// Whether the pages are served at `/console/` (default: off). The
    /// admin routes they use are served either way.
    pub enabled: bool,
    /// This node's lease safety margin (`--lease-safety-margin`, default
    /// 5 s): a standby estimates the holder's safety deadline as the lease
    /// row's time left − this margin.
    pub lease_safety_margin: Duration,
}

impl Default for ConsoleConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            lease_safety_margin: Duration::from_secs(5),
        }
    }
}

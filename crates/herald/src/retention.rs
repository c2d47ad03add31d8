//! `herald serve`'s retention settings: the policies from the config
//! file's `[retention]` section (a default and `[retention.namespaces.<name>]`),
//! the default-policy flags over it, and the reload of that section on
//! SIGHUP.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use herald_server::{RetentionConfig, RetentionHandle, TrimPacing};
use serde::Deserialize;
use tracing::{error, info};

use crate::duration::parse_duration;
use crate::toml_syntax::syntax_error;

/// Retention flags of `herald serve`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct RetentionArgs {
    /// Default retention: keep at most this many newest messages per
    /// channel (default: unbounded).
    #[arg(long, env = "HERALD_RETENTION_MAX_MESSAGES", value_parser = clap::value_parser!(u64).range(1..))]
    retention_max_messages: Option<u64>,
    /// Default retention: remove messages older than this, e.g. `7d`,
    /// `12h` (default: unbounded).
    #[arg(long, env = "HERALD_RETENTION_MAX_AGE", value_parser = parse_max_age)]
    retention_max_age: Option<Duration>,
    /// Default retention: keep at most this many bytes of message data per
    /// channel (default: unbounded).
    #[arg(long, env = "HERALD_RETENTION_MAX_BYTES", value_parser = clap::value_parser!(u64).range(1..))]
    retention_max_bytes: Option<u64>,
    /// Time between two sweeps of the holder's trimming task.
    #[arg(long, env = "HERALD_RETENTION_TRIM_INTERVAL", default_value = "1s", value_parser = parse_duration)]
    retention_trim_interval: Duration,
    /// Most messages one trim transaction removes.
    #[arg(long, env = "HERALD_RETENTION_TRIM_BATCH", default_value_t = 500)]
    retention_trim_batch: usize,
    /// Pause after each trim transaction that removed something.
    #[arg(long, env = "HERALD_RETENTION_TRIM_PAUSE", default_value = "10ms", value_parser = parse_duration)]
    retention_trim_pause: Duration,
}

/// The config file as the reload reads it: only its `[retention]` section
/// (the whole file was checked at the start).
#[derive(Deserialize)]
struct PolicyFile {
    #[serde(default)]
    retention: RetentionConfig,
}

impl RetentionArgs {
    /// How the trimming task paces itself.
    pub(crate) fn pacing(&self) -> TrimPacing {
        TrimPacing {
            interval: self.retention_trim_interval,
            batch: self.retention_trim_batch,
            pause: self.retention_trim_pause,
        }
    }

    /// The policies: the `[retention]` section of the config file
    /// `config_file` (if any), with the default-policy flags applied over
    /// its default.
    ///
    /// # Errors
    /// The file cannot be read or its `[retention]` section is not valid.
    pub(crate) fn load(&self, config_file: Option<&Path>) -> anyhow::Result<RetentionConfig> {
        let mut config = match config_file {
            Some(path) => read_file(path)?,
            None => RetentionConfig::default(),
        };
        if let Some(n) = self.retention_max_messages {
            config.default.max_messages = Some(n);
        }
        if let Some(age) = self.retention_max_age {
            config.default.max_age = Some(age);
        }
        if let Some(bytes) = self.retention_max_bytes {
            config.default.max_bytes = Some(bytes);
        }
        Ok(config)
    }

    /// Re-reads the policies of the config file `config_file` on every
    /// SIGHUP and puts them in force through `handle`; a file that does
    /// not read or parse is logged and the policies in force stay. Runs
    /// until the process ends.
    pub(crate) fn reload_on_sighup(self, config_file: Option<PathBuf>, handle: RetentionHandle) {
        let mut hangups =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
                Ok(s) => s,
                Err(e) => {
                    error!(error = %e, "cannot watch SIGHUP; retention policies will not reload");
                    return;
                }
            };
        tokio::spawn(async move {
            while hangups.recv().await.is_some() {
                match self.load(config_file.as_deref()) {
                    Ok(config) => {
                        info!(policies = %config, "retention policies reloaded");
                        handle.replace(config);
                    }
                    Err(e) => {
                        error!(error = %format!("{e:#}"), "retention policies not reloaded; the previous ones stay in force");
                    }
                }
            }
        });
    }
}

/// `--retention-max-age`: a duration longer than 0, as the file's
/// `max_age` (a bound of 0 would remove every message; docs/retention.md).
fn parse_max_age(s: &str) -> Result<Duration, String> {
    let age = parse_duration(s)?;
    if age.is_zero() {
        return Err("must be longer than 0 (leave it out for no bound)".to_owned());
    }
    Ok(age)
}

/// Reads the `[retention]` section of the config file at `path`.
fn read_file(path: &Path) -> anyhow::Result<RetentionConfig> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the config file {}", path.display()))?;
    // Parsed in two steps so that neither error quotes the file: a syntax
    // error anywhere in it (a line that may hold a secret) is reported by
    // place and reason only.
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
        anyhow::anyhow!(
            "config file {}: {}",
            path.display(),
            syntax_error(&text, &e)
        )
    })?;
    let file = PolicyFile::deserialize(table).map_err(|e| {
        anyhow::anyhow!(
            "invalid [retention] section in {}: {}",
            path.display(),
            e.message().trim()
        )
    })?;
    Ok(file.retention)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_max_age_of_zero_is_refused() {
        assert!(parse_max_age("0s").is_err());
        assert_eq!(parse_max_age("7d"), Ok(Duration::from_secs(7 * 86_400)));
    }

    #[test]
    fn the_file_gives_namespaces_and_flags_override_its_default() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("herald.toml");
        std::fs::write(
            &path,
            "[retention]\nmax_messages = 10\nmax_age = \"1h\"\n\n\
             [retention.namespaces.chat]\nmax_bytes = 2048\n",
        )
        .unwrap();
        let args = RetentionArgs {
            retention_max_messages: Some(5),
            retention_max_age: None,
            retention_max_bytes: None,
            retention_trim_interval: Duration::from_secs(1),
            retention_trim_batch: 500,
            retention_trim_pause: Duration::from_millis(10),
        };
        let config = args.load(Some(&path)).unwrap();
        assert_eq!(config.default.max_messages, Some(5));
        assert_eq!(config.default.max_age, Some(Duration::from_secs(3600)));
        assert_eq!(config.namespaces["chat"].max_bytes, Some(2048));
        assert_eq!(config.namespaces["chat"].max_messages, None);

        std::fs::write(&path, "[retention]\nmax_mesages = 1\n").unwrap();
        let error = format!("{:#}", args.load(Some(&path)).unwrap_err());
        assert!(error.contains("max_mesages"), "{error}");
    }

    /// A reload on SIGHUP logs its error at ERROR: a syntax error in
    /// another line of the file (an unquoted database URL) must not put
    /// that line, and its password, into the log.
    #[test]
    fn a_syntax_error_elsewhere_in_the_file_is_reported_without_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("herald.toml");
        std::fs::write(
            &path,
            "[retention]\nmax_messages = 10\n\n[other]\ndatabase_url = postgres://herald:Tr0ub4dor-3@db/herald\n",
        )
        .unwrap();
        let args = RetentionArgs {
            retention_max_messages: None,
            retention_max_age: None,
            retention_max_bytes: None,
            retention_trim_interval: Duration::from_secs(1),
            retention_trim_batch: 500,
            retention_trim_pause: Duration::from_millis(10),
        };
        let error = format!("{:#}", args.load(Some(&path)).unwrap_err());
        assert!(error.contains("line 5"), "{error}");
        assert!(!error.contains("Tr0ub4dor"), "{error}");
        assert!(!error.contains("postgres://"), "{error}");
    }
}

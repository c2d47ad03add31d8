//! Access control without a restart: on SIGHUP, `herald serve` reads its
//! config file again.
//!
//! - `[auth]` or `[namespaces]` changed: the node's access control is
//!   rebuilt from them and replaces the one in force (API keys, JWT keys
//!   and their files, namespace rules, publish rates, `protect_metrics`,
//!   `history_resume_window`), logged as INFO `access control reloaded`.
//!   A file that does not parse, a setting the start would refuse, one
//!   that turns access control off, or one that turns it on over
//!   PostgreSQL on a node started without a cluster secret keeps the
//!   settings in force and logs an ERROR. `cluster_secret` is the exception: the forwarder keeps the
//!   one it started with, so a new one is a WARN naming it, in force at
//!   the next restart.
//! - Unchanged: the `[auth.jwt]` key files are read again
//!   (`rsa_public_key_pem`, `ec_public_key_pem`, `jwks_file`), so that a
//!   key added for a rotation (a new `kid` in the JWKS file) is accepted
//!   at once, and the next token fetches `jwks_url` again; a reload that
//!   fails keeps the keys in force and logs an ERROR.
//! - Any other setting of the file that changed (`listen`, `[cors]`,
//!   `[tls]` paths, limits ...) is in force only after a restart: one WARN
//!   names each. `[retention]` is reloaded by `retention.rs`, and the TLS
//!   certificate files by `tls_reload.rs`.

use std::collections::BTreeSet;
use std::path::PathBuf;

use herald_auth::{AuthConfig, AuthReload, NamespacesConfig};
use tokio::signal::unix::{signal, SignalKind};
use tracing::{error, info, warn};

use crate::config_file::{self, ConfigFile};
use crate::serve::settings::serve_command;

/// The settings the node started with, which a reload compares the file
/// with.
#[derive(Debug, Clone)]
pub(crate) struct Started {
    /// The file's flag settings, by clap id.
    pub(crate) flags: std::collections::BTreeMap<String, Vec<String>>,
    /// `[auth]` (default: off).
    pub(crate) auth: AuthConfig,
    /// `[namespaces]`.
    pub(crate) namespaces: NamespacesConfig,
    /// `true` on PostgreSQL (`--database`), which other nodes may share.
    pub(crate) shared_database: bool,
}

/// Starts watching SIGHUP (at once, so a SIGHUP from now on no longer
/// ends the process) and, at each one, reloads the access control of the
/// node through `handle` from the config file `config_file` as the module
/// describes, for as long as the process runs.
pub(crate) fn reload_on_sighup(handle: AuthReload, config_file: Option<PathBuf>, started: Started) {
    let mut hangups = match signal(SignalKind::hangup()) {
        Ok(hangups) => hangups,
        Err(e) => {
            error!(error = %e, "cannot watch SIGHUP; access control will not reload");
            return;
        }
    };
    tokio::spawn(async move {
        let mut in_force = (started.auth.clone(), started.namespaces.clone());
        while hangups.recv().await.is_some() {
            let file = match &config_file {
                Some(path) => match config_file::load(path, &serve_command()) {
                    Ok(file) => file,
                    Err(e) => {
                        error!(
                            error = %crate::logging::one_line(&e),
                            "config file not reloaded; the access control in force stays"
                        );
                        continue;
                    }
                },
                None => ConfigFile::default(),
            };
            for setting in needs_restart(&started, &file) {
                warn!(
                    setting = %setting,
                    "a setting changed in the config file; it takes effect at the next restart"
                );
            }
            let next = (
                file.auth.unwrap_or_default(),
                file.namespaces.unwrap_or_default(),
            );
            if next == in_force {
                reload_jwt_keys(&handle, &in_force.0);
                continue;
            }
            if let Some(why) = needs_a_cluster_secret(&started, &next.0) {
                error!(
                    error = %why,
                    "access control not reloaded; the settings in force stay"
                );
                continue;
            }
            match handle.replace(&next.0, &next.1) {
                Ok(_) => {
                    info!(
                        access_control = next.0.enabled(),
                        api_keys = next.0.api_keys.len(),
                        jwt = next.0.jwt.is_some(),
                        namespaces = next.1.len(),
                        "access control reloaded"
                    );
                    in_force = next;
                }
                Err(e) => error!(
                    error = %e,
                    "access control not reloaded; the settings in force stay"
                ),
            }
        }
    });
}

/// Why `next` cannot be put in force by a reload on a node that started
/// with `started`: access control turned on, on a shared database, by a
/// node that started without a cluster secret. The holder would refuse
/// every forwarded publish, and a cluster secret takes effect only at a
/// restart (as `herald serve` refuses such a start).
fn needs_a_cluster_secret(started: &Started, next: &AuthConfig) -> Option<String> {
    (started.shared_database && next.enabled() && started.auth.cluster_secret.is_none()).then(
        || {
            "access control on PostgreSQL needs [auth] cluster_secret, which takes effect at a \
         restart: restart the node with the new file"
                .to_owned()
        },
    )
}

/// Reads the `[auth.jwt]` key files again, when there are some.
fn reload_jwt_keys(handle: &AuthReload, auth: &AuthConfig) {
    if auth.jwt.is_none() {
        return;
    }
    match handle.reload_jwt_keys() {
        Ok(keys) => info!(file_keys = keys, "JWT keys reloaded"),
        Err(e) => error!(
            error = %e,
            "JWT key reload failed; the keys in force stay"
        ),
    }
}

/// The config file's keys whose value in `file` differs from the one the
/// node started with and that a reload cannot put in force: every flag
/// setting, and `auth.cluster_secret`. Sorted, each named as the file
/// spells it (`cors.allowed_origins`).
fn needs_restart(started: &Started, file: &ConfigFile) -> BTreeSet<String> {
    let serve = serve_command();
    let ids: BTreeSet<&String> = started.flags.keys().chain(file.flags.keys()).collect();
    let mut changed: BTreeSet<String> = ids
        .into_iter()
        .filter(|id| started.flags.get(*id) != file.flags.get(*id))
        .map(|id| {
            serve
                .get_arguments()
                .find(|arg| arg.get_id().as_str() == id.as_str())
                .and_then(config_file::key_for_flag)
                .unwrap_or_else(|| id.clone())
        })
        .collect();
    let secret = |auth: Option<&AuthConfig>| auth.and_then(|a| a.cluster_secret.clone());
    if secret(Some(&started.auth)) != secret(file.auth.as_ref()) {
        changed.insert("auth.cluster_secret".to_owned());
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_flag_setting_or_cluster_secret_needs_a_restart_and_auth_does_not() {
        let serve = serve_command();
        let before = config_file::parse(
            "listen = \"127.0.0.1:7700\"\n[cors]\nallowed_origins = [\"https://a.example\"]\n\
             [auth]\ncluster_secret = \"0123456789abcdef\"\n",
            &serve,
        )
        .unwrap();
        let started = Started {
            flags: before.flags.clone(),
            auth: before.auth.clone().unwrap_or_default(),
            namespaces: NamespacesConfig::new(),
            shared_database: false,
        };
        assert!(needs_restart(&started, &before).is_empty());
        let after = config_file::parse(
            "listen = \"127.0.0.1:7700\"\n[cors]\nallowed_origins = [\"https://b.example\"]\n\
             [auth]\ncluster_secret = \"0123456789abcdef-new\"\npublish_rate_per_s = 5\n\
             [[auth.api_keys]]\nname = \"k\"\nsha256 = \"{}\"\npermissions = [\"publish\"]\n"
                .replace("{}", &"a".repeat(64))
                .as_str(),
            &serve,
        )
        .unwrap();
        assert_eq!(
            needs_restart(&started, &after)
                .into_iter()
                .collect::<Vec<_>>(),
            ["auth.cluster_secret", "cors.allowed_origins"]
        );
    }

    #[test]
    fn turning_access_control_on_over_postgres_without_a_cluster_secret_waits_for_a_restart() {
        let serve = serve_command();
        let keyed = config_file::parse(
            &format!(
                "[[auth.api_keys]]\nname = \"k\"\nsha256 = \"{}\"\npermissions = [\"publish\"]\n",
                "a".repeat(64)
            ),
            &serve,
        )
        .unwrap()
        .auth
        .unwrap();
        let open = |shared_database| Started {
            flags: Default::default(),
            auth: AuthConfig::default(),
            namespaces: NamespacesConfig::new(),
            shared_database,
        };
        let why = needs_a_cluster_secret(&open(true), &keyed).unwrap();
        assert!(why.contains("cluster_secret"), "{why}");
        assert_eq!(needs_a_cluster_secret(&open(false), &keyed), None);
        assert_eq!(
            needs_a_cluster_secret(&open(true), &AuthConfig::default()),
            None
        );
    }
}

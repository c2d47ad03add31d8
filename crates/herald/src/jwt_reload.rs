//! JWT key rotation without a restart: on SIGHUP, `herald serve` reads its
//! `[auth.jwt]` key files again (`rsa_public_key_pem`,
//! `ec_public_key_pem`, `jwks_file`), so that a key added for a rotation
//! (a new `kid` in the JWKS file) is accepted at once, and has the next
//! token fetch `jwks_url` again. A reload that fails keeps the keys in
//! force and logs an ERROR.

use herald_server::JwtKeyReload;
use tokio::signal::unix::{signal, SignalKind};
use tracing::{error, info};

/// Starts watching SIGHUP (at once, so a SIGHUP from now on no longer
/// ends the process) and reloads the node's JWT keys through `handle` at
/// each one, for as long as the process runs. It logs `JWT keys reloaded`
/// (INFO, with the number of keys the files hold) or `JWT key reload
/// failed` (ERROR, with the reason, which names the file and never a
/// key).
pub(crate) fn reload_on_sighup(handle: JwtKeyReload) {
    let mut hangups = match signal(SignalKind::hangup()) {
        Ok(hangups) => hangups,
        Err(e) => {
            error!(error = %e, "cannot watch SIGHUP; JWT keys will not reload");
            return;
        }
    };
    tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            match handle.reload() {
                Ok(keys) => info!(file_keys = keys, "JWT keys reloaded"),
                Err(e) => error!(
                    error = %e,
                    "JWT key reload failed; the keys in force stay"
                ),
            }
        }
    });
}

//! Certificate rotation without a restart: on SIGHUP, `herald serve` reads
//! its `--tls-cert` and `--tls-key` files again. New connections get the
//! new certificate; open ones keep theirs. A reload that fails keeps the
//! certificate in use and logs an ERROR.

use herald_server::TlsCertificates;
use tokio::signal::unix::{signal, SignalKind};
use tracing::{error, info};

/// Starts watching SIGHUP (at once, so a SIGHUP from now on no longer
/// ends the process) and returns the task that reloads `tls` at each one,
/// for as long as it runs. It logs `TLS certificate reloaded` (INFO) or
/// `TLS certificate reload failed` (ERROR, with the reason).
///
/// # Errors
/// SIGHUP cannot be watched.
pub(crate) fn reload_on_sighup(
    tls: TlsCertificates,
) -> anyhow::Result<impl std::future::Future<Output = ()>> {
    let mut hangups = signal(SignalKind::hangup())
        .map_err(|e| anyhow::anyhow!("cannot watch SIGHUP to reload the TLS certificate: {e}"))?;
    Ok(async move {
        while hangups.recv().await.is_some() {
            let cert = tls.cert_path().display().to_string();
            match tls.reload() {
                Ok(()) => info!(cert = %cert, "TLS certificate reloaded"),
                Err(e) => error!(
                    cert = %cert,
                    error = %e,
                    "TLS certificate reload failed; the certificate in use is kept"
                ),
            }
        }
    })
}

//! WebSocket helpers shared by the protocol wings (API v1's `api/ws.rs`
//! and Centrifugo's `centrifugo/session.rs`).

use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message as Frame, WebSocket};
use futures::stream::{SplitSink, SplitStream};
use futures::{SinkExt, StreamExt};

/// How long the server waits for a client to answer its Close frame, or to
/// take a frame, while closing.
pub(crate) const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);

/// Sends a Close frame and waits (bounded, [`CLOSE_TIMEOUT`] each way)
/// for the client's Close reply: ends API v1's WebSocket sessions and
/// Centrifugo's.
pub(crate) async fn close(
    mut tx: SplitSink<WebSocket, Frame>,
    mut rx: SplitStream<WebSocket>,
    code: u16,
    reason: &'static str,
) {
    let frame = Frame::Close(Some(CloseFrame {
        code,
        reason: reason.into(),
    }));
    if !matches!(
        tokio::time::timeout(CLOSE_TIMEOUT, tx.send(frame)).await,
        Ok(Ok(()))
    ) {
        return;
    }
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, async {
        while let Some(Ok(frame)) = rx.next().await {
            if matches!(frame, Frame::Close(_)) {
                break;
            }
        }
    })
    .await;
}

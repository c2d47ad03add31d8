//! The WebSocket client of the tests: `tokio-tungstenite`, with a connect
//! that expects the upgrade and a read that yields message frames' JSON
//! and notes the close code.

use futures::StreamExt;
use serde_json::Value;
use tokio_tungstenite::tungstenite::Message as Frame;

use crate::{within, NODE_WAIT};

/// A WebSocket client connection.
pub type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Opens a WebSocket to `url` (`ws://…`), expecting the upgrade (101).
///
/// # Panics
/// When the handshake fails, takes longer than [`NODE_WAIT`], or is
/// answered with another status.
pub async fn ws_connect(url: &str) -> Ws {
    let (ws, response) = within(
        "WebSocket connect",
        NODE_WAIT,
        tokio_tungstenite::connect_async(url),
    )
    .await
    .expect("WebSocket handshake");
    assert_eq!(response.status().as_u16(), 101);
    ws
}

/// The next message frame's JSON; `None` when the socket closed (the close
/// frame's code, if any, is returned through `closed`). Pings are answered
/// (tungstenite does it while reading) and skipped.
///
/// # Panics
/// When a text frame is not JSON.
pub async fn ws_next(ws: &mut Ws, closed: &mut Option<u16>) -> Option<Value> {
    loop {
        match ws.next().await? {
            Ok(Frame::Text(text)) => {
                return Some(serde_json::from_str(&text).expect("frame is JSON"))
            }
            Ok(Frame::Close(frame)) => {
                *closed = frame.map(|f| u16::from(f.code));
                // Keep reading: that sends the protocol's Close reply and
                // sees the server end the connection.
                while let Some(Ok(_)) = ws.next().await {}
                return None;
            }
            Ok(_) => continue,
            Err(_) => return None,
        }
    }
}

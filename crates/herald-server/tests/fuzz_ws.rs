//! Property-based test of the WebSocket route's frame parser (proptest,
//! stable toolchain): after a valid handshake, any sequence of frames (well
//! formed or not: any opcode, masked or not, fragmented, oversized control
//! frames) and any raw bytes end the session without a panic, the
//! connection is closed once the client stops sending, the node goes on
//! answering, and nothing is stored.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Once;

use herald_server::ServerConfig;
use herald_testkit::node::{Node, Role};
use herald_testkit::{within, NODE_WAIT};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Set by the panic hook: a panic anywhere in the process, a server task's
/// included (tokio catches those, so the test would not see them).
static PANICKED: AtomicBool = AtomicBool::new(false);

fn watch_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICKED.store(true, Ordering::SeqCst);
            previous(info);
        }));
    });
}

/// One frame as a client could write it (RFC 6455 §5.2), any field allowed.
#[derive(Debug, Clone)]
struct RawFrame {
    fin: bool,
    rsv: u8,
    opcode: u8,
    mask: Option<[u8; 4]>,
    payload: Vec<u8>,
}

impl RawFrame {
    fn encode(&self, out: &mut Vec<u8>) {
        out.push(u8::from(self.fin) << 7 | (self.rsv & 0x7) << 4 | (self.opcode & 0xF));
        let masked = u8::from(self.mask.is_some()) << 7;
        let len = self.payload.len();
        if len < 126 {
            out.push(masked | len as u8);
        } else if len <= 0xFFFF {
            out.push(masked | 126);
            out.extend_from_slice(&(len as u16).to_be_bytes());
        } else {
            out.push(masked | 127);
            out.extend_from_slice(&(len as u64).to_be_bytes());
        }
        match self.mask {
            Some(mask) => {
                out.extend_from_slice(&mask);
                out.extend(
                    self.payload
                        .iter()
                        .enumerate()
                        .map(|(i, b)| b ^ mask[i % 4]),
                );
            }
            None => out.extend_from_slice(&self.payload),
        }
    }
}

fn frame() -> impl Strategy<Value = RawFrame> {
    let opcode = prop_oneof![
        4 => proptest::sample::select(vec![0x0u8, 0x1, 0x2, 0x8, 0x9, 0xA]),
        1 => 0u8..16,
    ];
    let payload = prop_oneof![
        4 => proptest::collection::vec(any::<u8>(), 0..140),
        1 => (1000usize..3000).prop_map(|n| vec![b'x'; n]),
    ];
    (
        any::<bool>(),
        prop_oneof![6 => Just(0u8), 1 => 0u8..8],
        opcode,
        prop_oneof![6 => any::<[u8; 4]>().prop_map(Some), 1 => Just(None)],
        payload,
    )
        .prop_map(|(fin, rsv, opcode, mask, payload)| RawFrame {
            fin,
            rsv,
            opcode,
            mask,
            payload,
        })
}

/// What the client sends after the handshake.
fn traffic() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => proptest::collection::vec(frame(), 0..6).prop_map(|frames| {
            let mut out = Vec::new();
            for f in &frames {
                f.encode(&mut out);
            }
            out
        }),
        1 => proptest::collection::vec(any::<u8>(), 0..200),
    ]
}

const HANDSHAKE: &[u8] = b"GET /v1/channels/c/ws HTTP/1.1\r\nHost: herald\r\n\
    Upgrade: websocket\r\nConnection: Upgrade\r\n\
    Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";

async fn one_session(node: &Node, bytes: &[u8]) -> Result<(), TestCaseError> {
    let addr = node.base.trim_start_matches("http://");
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.write_all(HANDSHAKE).await.unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte).await.unwrap() == 0 {
            break;
        }
        head.push(byte[0]);
    }
    prop_assert!(
        head.starts_with(b"HTTP/1.1 101 "),
        "{}",
        String::from_utf8_lossy(&head)
    );
    // The server may close before it has read everything: a failed write
    // is an answer too.
    let _ = stream.write_all(bytes).await;
    let _ = stream.shutdown().await;
    // The session must end once the client stops: read to the end.
    let mut rest = Vec::new();
    within("the server ends the session", NODE_WAIT, async {
        let _ = stream.read_to_end(&mut rest).await;
    })
    .await;
    let (status, _) = node.get("/healthz").await;
    prop_assert_eq!(status, 200);
    prop_assert_eq!(node.head("c").await, 1, "nothing stored");
    prop_assert!(!PANICKED.load(Ordering::SeqCst), "a panic");
    Ok(())
}

#[test]
fn websocket_frames_never_break_the_server() {
    watch_panics();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = ServerConfig {
        ws_max_message_bytes: 2048,
        ..ServerConfig::default()
    };
    let node = rt.block_on(Node::start(dir.path(), "node-a", Role::Holder, config));
    let (status, _) = rt.block_on(node.publish("c", serde_json::json!(1)));
    assert_eq!(status, 201);
    let mut runner = TestRunner::new(Config {
        cases: 64,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&traffic(), |bytes| rt.block_on(one_session(&node, &bytes)))
        .unwrap();
    rt.block_on(node.stop());
    assert!(!PANICKED.load(Ordering::SeqCst), "a panic");
}

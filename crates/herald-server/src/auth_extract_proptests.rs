//! Property tests of the credential parsers: whatever `Authorization`,
//! `X-API-Key` and `?token=` a request carries, the answer is 2xx, 401 or
//! 403 in the JSON error shape, never a panic or a 5xx.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{HeaderValue, Request};
use herald_auth::{
    api_key_sha256, generate_api_key, ApiKeyConfig, AuthConfig, JwtConfig, OneOrMany, Permission,
    Secret,
};
use herald_core::FencingToken;
use jsonwebtoken::{encode, EncodingKey, Header};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::app;
use crate::config::ServerConfig;
use crate::state::AppState;
use herald_node::testing::{FakeLease, MemoryStorage};

/// Cases per run: enough to reach every branch, bounded in time.
const CASES: u32 = 256;

/// A credential: arbitrary text, a near-miss of a valid key or token, or
/// the valid ones.
fn credential(key: String, token: String) -> impl Strategy<Value = String> {
    let near_key = key.clone();
    let near_token = token.clone();
    prop_oneof![
        any::<String>(),
        "[ -~]{0,120}",
        "[A-Za-z0-9_-]{0,40}\\.[A-Za-z0-9_-]{0,60}\\.[A-Za-z0-9_-]{0,40}",
        (0..near_key.len()).prop_map(move |n| near_key[..n].to_owned()),
        (0..near_token.len()).prop_map(move |n| near_token[..n].to_owned()),
        (0..token.len(), any::<u8>()).prop_map(move |(n, c)| {
            let mut bytes = token.as_bytes().to_vec();
            bytes[n] = c.clamp(b' ', b'~');
            String::from_utf8(bytes).unwrap_or_default()
        }),
        Just(key),
    ]
}

/// How the credential is sent.
#[derive(Debug, Clone, Copy)]
enum Carrier {
    Bearer,
    RawAuthorization,
    XApiKey,
    Query,
    Both,
}

fn carrier() -> impl Strategy<Value = Carrier> {
    prop_oneof![
        Just(Carrier::Bearer),
        Just(Carrier::RawAuthorization),
        Just(Carrier::XApiKey),
        Just(Carrier::Query),
        Just(Carrier::Both),
    ]
}

/// The routes that check credentials.
const ROUTES: &[(&str, &str)] = &[
    ("POST", "/v1/channels/news:a/messages"),
    ("POST", "/v1/messages"),
    ("GET", "/v1/channels/news:a/messages"),
    ("GET", "/v1/channels/news:a/events"),
    ("GET", "/v1/channels"),
    ("GET", "/v1/status"),
    ("GET", "/metrics"),
];

fn request(route: usize, carrier: Carrier, credential: &str) -> Option<Request<Body>> {
    let (method, path) = ROUTES[route];
    let mut uri = path.to_owned();
    if matches!(carrier, Carrier::Query | Carrier::Both) {
        let encoded: String = credential.bytes().map(|b| format!("%{b:02X}")).collect();
        uri.push_str(&format!("?token={encoded}"));
    }
    let body = if path == "/v1/messages" {
        json!({"messages": [{"channel": "news:a", "data": 1}]})
    } else {
        json!({"data": 1})
    };
    let mut builder = Request::builder().method(method).uri(uri);
    let value = |text: &str| HeaderValue::from_bytes(text.as_bytes()).ok();
    match carrier {
        Carrier::Bearer | Carrier::Both => {
            builder = builder.header("authorization", value(&format!("Bearer {credential}"))?);
        }
        Carrier::RawAuthorization => builder = builder.header("authorization", value(credential)?),
        Carrier::XApiKey => builder = builder.header("x-api-key", value(credential)?),
        Carrier::Query => {}
    }
    builder
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .ok()
}

#[test]
fn any_credential_gets_2xx_401_or_403() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let key = generate_api_key();
    let secret = generate_api_key();
    let config = ServerConfig {
        auth: AuthConfig {
            api_keys: vec![ApiKeyConfig {
                name: "k".to_owned(),
                sha256: api_key_sha256(&key),
                permissions: vec![Permission::Publish, Permission::Read],
                channels: Some(vec!["news:*".to_owned()]),
                publish_rate_per_s: Some(0.0),
                publish_burst: None,
            }],
            jwt: Some(JwtConfig {
                hs256_secret: OneOrMany::One(Secret::new(&secret)),
                ..JwtConfig::default()
            }),
            protect_metrics: true,
            publish_rate_per_s: Some(0.0),
            ..AuthConfig::default()
        },
        ..ServerConfig::default()
    };
    let token = encode(
        &Header::default(),
        &json!({"sub": "u", "exp": jsonwebtoken::get_current_timestamp() + 600, "channels": ["news:*"]}),
        &EncodingKey::from_secret(secret.as_bytes()),
    )
    .unwrap();
    let shutdown = CancellationToken::new();
    let state = runtime
        .block_on(AppState::start_with(
            MemoryStorage::new(),
            FakeLease::holder(FencingToken(1)) as Arc<dyn herald_node::role::LeaseView>,
            config,
            shutdown.clone(),
        ))
        .unwrap();
    // One request through the whole router: its status and JSON body.
    let answer = |route: usize, carrier: Carrier, credential: &str| {
        let request = request(route, carrier, credential)?;
        Some(runtime.block_on(async {
            let response = app(state.clone()).oneshot(request).await.unwrap();
            let status = response.status().as_u16();
            // An SSE stream that was opened does not end: its status is
            // enough.
            if status == 200 && route == 3 {
                return (status, serde_json::Value::Null);
            }
            let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
                .await
                .unwrap();
            (
                status,
                serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
            )
        }))
    };
    let property = |(status, body): (u16, serde_json::Value)| -> Result<(), TestCaseError> {
        prop_assert!(matches!(status, 200 | 201 | 401 | 403), "{status} {body}");
        if status >= 400 {
            let code = body["error"]["code"].as_str().unwrap_or("");
            prop_assert!(
                matches!(code, "unauthorized" | "token_expired" | "forbidden"),
                "{status} {body}"
            );
        }
        Ok(())
    };
    // Each kind of answer, from inputs fixed here, so the property is
    // known to be checked on a 2xx, a 401 and a 403 whatever the random
    // inputs below reach.
    let fixed = [
        (0, Carrier::XApiKey, key.clone(), 201),
        (2, Carrier::Bearer, token.clone(), 200),
        (3, Carrier::Query, token.clone(), 200),
        (2, Carrier::Query, token.clone(), 401),
        (4, Carrier::XApiKey, key.clone(), 403),
        (6, Carrier::Bearer, key.clone(), 403),
        (0, Carrier::XApiKey, key[..key.len() - 1].to_owned(), 401),
        (2, Carrier::Bearer, token[..token.len() - 1].to_owned(), 401),
    ];
    for (route, carrier, credential, expected) in fixed {
        let got = answer(route, carrier, &credential).expect("a valid request");
        assert_eq!(
            got.0, expected,
            "{:?} {carrier:?}: {}",
            ROUTES[route], got.1
        );
        property(got).unwrap();
    }
    let mut runner = TestRunner::new(Config {
        cases: CASES,
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = (0..ROUTES.len(), carrier(), credential(key, token));
    runner
        .run(&strategy, |(route, carrier, credential)| {
            // A credential that is not a valid header value never reaches
            // a server.
            answer(route, carrier, &credential).map_or(Ok(()), property)
        })
        .unwrap();
    shutdown.cancel();
    runtime.block_on(state.stopped());
}

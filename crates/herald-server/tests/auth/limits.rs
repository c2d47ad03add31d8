//! The publish rate limit per API key and per token subject: a burst of N
//! passes, the next publish is refused `429 rate_limited` with
//! `Retry-After`. The rate (one publish per 1000 s) refills nothing during
//! the test, so the outcome does not depend on timing.

use serde_json::json;

use crate::{assert_refused, get, on_both_backends, publish_as, Backend, Creds, Node, Place, Role};

async fn rate_limits(backend: Backend) {
    let place = Place::new(backend).await;
    let creds = Creds::new();
    let mut config = creds.config();
    // Keys without a rate of their own, and every token subject: 2 at once.
    config.auth.publish_rate_per_s = Some(0.001);
    config.auth.publish_burst = Some(2);
    let node = Node::start(&place, "node-a", Role::Holder, config).await;

    // The `limited` key: its own burst of 3.
    let limited = Creds::bearer(&creds.limited);
    for i in 0..3 {
        let ok = publish_as(&node, "any", &limited, json!(i)).await;
        assert_eq!(ok.0, 201, "{}", ok.2);
    }
    let refused = publish_as(&node, "any", &limited, json!(3)).await;
    assert_refused(&refused, 429, "rate_limited");
    let retry_after: u64 = refused.1["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(retry_after >= 1, "{retry_after}");
    let batch = json!({"messages": [{"channel": "any", "data": 1}]});
    assert_refused(
        &node
            .call(
                "POST",
                "/v1/messages",
                &[("authorization", &limited)],
                Some(batch),
            )
            .await,
        429,
        "rate_limited",
    );
    // Another key has its own bucket (the default burst of 2).
    let publisher = Creds::bearer(&creds.publisher);
    for i in 0..2 {
        assert_eq!(
            publish_as(&node, "news:r", &publisher, json!(i)).await.0,
            201
        );
    }
    assert_refused(
        &publish_as(&node, "news:r", &publisher, json!(2)).await,
        429,
        "rate_limited",
    );

    // Token subjects: a burst of 2 each.
    let u1 = Creds::bearer(&creds.token_for("u1", json!({"publish": ["room:*"]})));
    let u1_again = Creds::bearer(&creds.token_for("u1", json!({"publish": ["room:*"], "iat": 1})));
    assert_eq!(publish_as(&node, "room:1", &u1, json!(1)).await.0, 201);
    assert_eq!(
        publish_as(&node, "room:1", &u1_again, json!(2)).await.0,
        201
    );
    // Another token of the same subject shares the bucket.
    assert_refused(
        &publish_as(&node, "room:1", &u1_again, json!(3)).await,
        429,
        "rate_limited",
    );
    let u2 = Creds::bearer(&creds.token_for("u2", json!({"publish": ["room:*"]})));
    assert_eq!(publish_as(&node, "room:1", &u2, json!(4)).await.0, 201);

    let admin = Creds::bearer(&creds.admin);
    let metrics = get(&node, "/metrics", &[("authorization", &admin)]).await.2;
    let text = metrics.as_str().unwrap();
    assert!(
        text.contains(r#"herald_publish_rate_limited_total{credential="key"}"#),
        "{text}"
    );
    assert!(
        text.contains(r#"herald_publish_rate_limited_total{credential="token"}"#),
        "{text}"
    );
}

on_both_backends!(
    rate_limits: publish_rate_is_limited_per_key_and_subject_on_sqlite,
    publish_rate_is_limited_per_key_and_subject_on_postgres
);

/// The defaults: a backend's API key is not limited, a token subject is
/// (100/s, burst 200); the 429 names the subject, its rate and the
/// setting to change. (The WARN of the first refusal is checked on the
/// binary, in `crates/herald/tests/config_file.rs`.)
#[tokio::test]
async fn by_default_keys_are_not_limited_and_a_refusal_says_who_and_which_setting() {
    let place = Place::new(Backend::Sqlite).await;
    let creds = Creds::new();
    let mut config = creds.config();
    config.auth.publish_rate_per_s = None;
    config.auth.publish_burst = None;
    let node = Node::start(&place, "node-a", Role::Holder, config).await;
    let batch = |channel: &str, n: usize| {
        let messages: Vec<_> = (0..n)
            .map(|i| json!({"channel": channel, "data": i}))
            .collect();
        json!({ "messages": messages })
    };

    // The backend's key: 3 × 300 messages at once, far over any default
    // burst, all stored.
    let backend = Creds::bearer(&creds.backend);
    for _ in 0..3 {
        let answer = node
            .call(
                "POST",
                "/v1/messages",
                &[("authorization", &backend)],
                Some(batch("any", 300)),
            )
            .await;
        assert_eq!(answer.0, 201, "{}", answer.2);
    }

    // A token subject: a batch over the default burst of 200 never fits.
    let u1 = Creds::bearer(&creds.token_for("u1", json!({"publish": ["room:*"]})));
    let refused = node
        .call(
            "POST",
            "/v1/messages",
            &[("authorization", &u1)],
            Some(batch("room:1", 201)),
        )
        .await;
    assert_refused(&refused, 429, "rate_limited");
    let message = refused.2["error"]["message"].as_str().unwrap().to_owned();
    for part in [
        "token subject \"u1\"",
        "100/s, burst 200",
        "[auth] publish_rate_per_s",
    ] {
        assert!(message.contains(part), "{part} not in {message}");
    }
    // The refused batch took nothing: a whole burst still passes.
    let answer = node
        .call(
            "POST",
            "/v1/messages",
            &[("authorization", &u1)],
            Some(batch("room:1", 200)),
        )
        .await;
    assert_eq!(answer.0, 201, "{}", answer.2);

    // A key with a rate of its own: the refusal names the key and its
    // entry.
    let limited = Creds::bearer(&creds.limited);
    for i in 0..3 {
        assert_eq!(publish_as(&node, "any", &limited, json!(i)).await.0, 201);
    }
    let refused = publish_as(&node, "any", &limited, json!(3)).await;
    assert_refused(&refused, 429, "rate_limited");
    let message = refused.2["error"]["message"].as_str().unwrap();
    assert!(message.contains("API key \"limited\""), "{message}");
    assert!(
        message.contains("[[auth.api_keys]] \"limited\""),
        "{message}"
    );
}

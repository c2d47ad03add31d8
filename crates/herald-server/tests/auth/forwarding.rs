//! Forwarding with access control: a standby checks the client's
//! credentials itself and forwards with the cluster secret; the holder
//! trusts a forwarded publish only with the right secret.

use herald_server::{Secret, ServerConfig};
use serde_json::json;

use crate::{assert_refused, get, on_both_backends, publish_as, Backend, Creds, Node, Place, Role};

async fn forwarding(backend: Backend) {
    let place = Place::new(backend).await;
    let creds = Creds::new();
    let holder = Node::start(&place, "node-a", Role::Holder, creds.config()).await;
    let standby = Node::start(&place, "node-b", Role::Standby, creds.config()).await;
    let key = Creds::bearer(&creds.publisher);
    let reader = Creds::bearer(&creds.reader);
    let as_reader = [("authorization", reader.as_str())];

    // Through the standby: the key is checked there, the publish lands on
    // the holder.
    let ok = publish_as(&standby, "news:f", &key, json!(1)).await;
    assert_eq!(ok.0, 201, "{}", ok.2);
    assert_eq!(ok.2["offset"], 1);
    let history = get(&holder, "/v1/channels/news:f/messages", &as_reader).await;
    assert_eq!(history.2["head"], 1, "{}", history.2);
    // The standby refuses by itself what the client may not do.
    assert_refused(
        &standby.publish_with("news:f", &[], json!(2)).await,
        401,
        "unauthorized",
    );
    assert_refused(
        &standby.publish_with("news:f", &as_reader, json!(2)).await,
        403,
        "forbidden",
    );

    // At the holder: a forwarded request without the secret, or with a
    // wrong one, is refused, even with a valid client key (the forward
    // marker needs the secret); with the right one it is trusted.
    let forwarded: [&[(&str, &str)]; 3] = [
        &[("herald-forwarded-by", "node-x")],
        &[
            ("herald-forwarded-by", "node-x"),
            ("herald-cluster-secret", "not-the-secret"),
        ],
        &[
            ("herald-forwarded-by", "node-x"),
            ("authorization", key.as_str()),
        ],
    ];
    for headers in forwarded {
        assert_refused(
            &holder.publish_with("news:f", headers, json!(2)).await,
            401,
            "unauthorized",
        );
    }
    let right = [
        ("herald-forwarded-by", "node-x"),
        ("herald-cluster-secret", creds.cluster_secret.as_str()),
    ];
    assert_eq!(holder.publish_with("news:f", &right, json!(2)).await.0, 201);

    // A standby configured with another cluster secret: the holder refuses
    // its forwards, and the client gets that 401.
    let mut other = creds.config();
    other.auth.cluster_secret = Some(Secret::new("another-cluster-secret-0123456789"));
    let stranger = Node::start(&place, "node-c", Role::Standby, ServerConfig { ..other }).await;
    assert_refused(
        &publish_as(&stranger, "news:f", &key, json!(3)).await,
        401,
        "unauthorized",
    );
    let history = get(&holder, "/v1/channels/news:f/messages", &as_reader).await;
    assert_eq!(
        history.2["head"], 2,
        "refused forwards stored nothing: {}",
        history.2
    );
}

on_both_backends!(
    forwarding: forwarding_needs_the_cluster_secret_on_sqlite,
    forwarding_needs_the_cluster_secret_on_postgres
);

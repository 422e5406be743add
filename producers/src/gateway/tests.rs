//! Unit tests of the gateway's request handling: status of a refused batch, item splitting,
//! request errors, limits, message cuts.

use super::*;
use axum::body::to_bytes;

#[test]
fn a_request_refused_only_for_retriable_reasons_is_503() {
    let refused = |codes: &[&'static str]| -> Vec<ItemResult> {
        codes
            .iter()
            .enumerate()
            .map(|(index, code)| ItemResult {
                index,
                status: "rejected",
                id: None,
                error: Some(ApiError {
                    code: (*code).into(),
                    message: String::new(),
                }),
            })
            .collect()
    };
    let status = |codes: &[&'static str]| batch_status(0, &refused(codes));
    assert_eq!(status(&["spool_failed", "closed", "spool_full"]), 503);
    assert_eq!(status(&["too_large", "too_large"]), 413);
    assert_eq!(status(&["spool_full", "too_large"]), 400);
    // The list is the one `is_retriable` reads.
    assert!(PublishError::Closed.is_retriable());
    assert!(!PublishError::TooLarge { size: 2, max: 1 }.is_retriable());
}

#[test]
fn splits_arrays_objects_and_ndjson() {
    let a = split_items(br#"[{"a":1}, {"b":2}]"#, None, 10).unwrap();
    assert_eq!(a.len(), 2);
    let o = split_items(b"{\"a\":1}", Some("application/json"), 10).unwrap();
    assert_eq!(o.len(), 1);
    let n = split_items(b"{\"a\":1}\n\n{\"b\":2}\nnot json\n", None, 10).unwrap();
    assert_eq!(n.len(), 3);
    assert!(n[2].is_err(), "a bad line is that item's problem only");
    let declared = split_items(b"{\"a\":1}", Some("application/x-ndjson"), 10).unwrap();
    assert_eq!(declared.len(), 1);
}

#[test]
fn malformed_bodies_are_request_errors_with_a_reason() {
    let msg = |b: &[u8]| match split_items(b, None, 10) {
        Err(SplitError::Malformed(m)) => m,
        other => panic!("expected a malformed body, got {other:?}"),
    };
    assert!(msg(b"[{\"a\":1},").contains("not a valid JSON array"));
    assert!(msg(b"   ").contains("empty"));
    assert!(msg(b"nonsense").contains("not valid JSON"));
    assert!(msg(&[0xff, 0xfe]).contains("UTF-8"));
}

#[test]
fn too_many_items_is_refused_before_the_rest_is_read() {
    assert_eq!(split_items(b"[1,2,3]", None, 3).map(|v| v.len()), Ok(3));
    assert_eq!(
        split_items(b"[1,2,3,4]", None, 3).err(),
        Some(SplitError::TooMany(3))
    );
    // The limit is hit before the malformed tail: the cut is at item 4.
    assert_eq!(
        split_items(b"[1,2,3,4,oops", None, 3).err(),
        Some(SplitError::TooMany(3))
    );
    let nd = b"{}\n{}\n\n{}\n{}\n";
    assert_eq!(
        split_items(nd, Some("application/x-ndjson"), 3).err(),
        Some(SplitError::TooMany(3))
    );
    assert_eq!(split_items(nd, None, 4).map(|v| v.len()), Ok(4));
}

#[test]
fn messages_are_cut_on_a_char_boundary() {
    let m = bounded_message("é".repeat(MAX_MESSAGE_BYTES));
    assert!(m.len() <= MAX_MESSAGE_BYTES + 3 && m.ends_with("..."));
    assert_eq!(bounded_message("short".into()), "short");
}

const KEY: &str = "key-acme-0123456789";

/// A publisher with no broker (every event is spooled, after 300 ms) and a spool of
/// `spool_max_bytes`.
async fn offline_publisher(dir: &std::path::Path, spool_max_bytes: u64) -> Publisher {
    let cfg = crate::PublisherConfig {
        // Nothing listens on the discard port.
        brokers: "127.0.0.1:9".into(),
        spool_dir: dir.to_owned(),
        message_timeout_ms: 300,
        spool_max_bytes,
        spool_segment_bytes: spool_max_bytes.min(64 << 10),
        ..Default::default()
    };
    Publisher::connect(cfg).await.unwrap()
}

/// Keys with `KEY` for `tenant`.
fn keys_for(tenant: &str) -> ApiKeys {
    let mut keys = ApiKeys::default();
    keys.add_list(&format!("{KEY}={tenant}")).unwrap();
    keys
}

/// A gateway on an [`offline_publisher`] with a 1 GiB spool, with `KEY` for `acme`.
async fn offline_gateway(dir: &std::path::Path) -> Arc<Gateway> {
    let p = offline_publisher(dir, 1 << 30).await;
    Arc::new(Gateway::new(p, keys_for("acme"), 1 << 20))
}

/// POST `body` to `/v1/events` with `KEY`: the status and the JSON answer.
async fn post(g: &Arc<Gateway>, body: Body) -> (StatusCode, serde_json::Value) {
    let mut headers = HeaderMap::new();
    let bearer = format!("Bearer {KEY}").parse().unwrap();
    headers.insert(header::AUTHORIZATION, bearer);
    let r = ingest(State(g.clone()), headers, body).await;
    let status = r.status();
    let bytes = to_bytes(r.into_body(), 16 << 20).await.unwrap();
    (status, serde_json::from_slice(&bytes).unwrap())
}

/// An item the publisher refuses is answered with the code `parse_request` gives it (and
/// docs/HTTP.md names): before, an identity over 1,024 bytes came back `invalid_payload`, not
/// `id_too_long`, and a payload that is not an object `invalid_payload`, not
/// `undecodable_json`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_item_has_the_code_parse_request_gives_it() {
    let dir = tempfile::tempdir().unwrap();
    let g = offline_gateway(dir.path()).await;
    let long = "e".repeat(2_000);
    let body = format!(
        r#"[{{"kind":"trace_event","payload":{{"event_id":"{long}","event_type":"flow_started","timestamp":"2026-03-08T06:00:05Z"}}}},
            {{"kind":"frame","payload":[1,2]}}]"#
    );
    let parsed = parse_request(body.as_bytes(), None, 10, "acme").unwrap();
    let want: Vec<String> = parsed
        .iter()
        .map(|r| r.as_ref().unwrap_err().code.clone())
        .collect();
    assert_eq!(want, ["id_too_long", "undecodable_json"]);
    let (status, answer) = post(&g, Body::from(body)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    let got: Vec<&str> = answer["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["error"]["code"].as_str().unwrap())
        .collect();
    assert_eq!(got, want, "{answer}");
}

/// A body that fails part way (the client reset, a bad chunk) is 400 `body_unreadable`, not
/// 413 `body_too_large`: only the length limit is 413. Before, every error reading the body
/// was answered 413 and counted as `body_too_large`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_fails_part_way_is_400_not_413() {
    let dir = tempfile::tempdir().unwrap();
    let g = offline_gateway(dir.path()).await;
    let (mut tx, rx) =
        http_body_util::channel::Channel::<axum::body::Bytes, std::io::Error>::new(1);
    tx.send_data(axum::body::Bytes::from_static(b"["))
        .await
        .unwrap();
    tx.abort(std::io::Error::other("connection reset"));
    let (status, answer) = post(&g, Body::new(rx)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert_eq!(answer["error"]["code"], "body_unreadable", "{answer}");
    let m = g.publisher.metrics().render();
    assert!(
        !m.contains(r#"reason="body_too_large""#),
        "not counted as too large: {m}"
    );

    // Over the limit, streamed without a Content-Length: still 413.
    let (mut tx, rx) =
        http_body_util::channel::Channel::<axum::body::Bytes, std::io::Error>::new(1);
    let big = axum::body::Bytes::from(vec![b' '; (1 << 20) + 1]);
    tokio::spawn(async move { tx.send_data(big).await });
    let (status, answer) = post(&g, Body::new(rx)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{answer}");
    assert_eq!(answer["error"]["code"], "body_too_large", "{answer}");
}

/// `/readyz` says ready only while the spool has room for one largest request's records,
/// which take more than its body: each item adds a record's framing, topic, key and headers.
/// Before, the room was compared with `max_body_bytes`, so a gateway was ready with room for
/// the body but not for the records of a full request of small items.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_counts_what_a_full_request_takes_in_the_spool() {
    // The largest request: `max_items` items with every per-record cost at its most (the
    // longest kind, the longest tenant, request ids of the most bytes), bodies of nothing
    // more than needed.
    const ITEMS: usize = 16;
    let tenant = "t".repeat(128);
    let kind = weft_schemas::Kind::ALL
        .into_iter()
        .max_by_key(|k| k.as_str().len())
        .unwrap();
    assert_eq!(kind, weft_schemas::Kind::ExecutionRoutingDecision);
    let items: Vec<String> = (0..ITEMS)
        .map(|i| {
            let rid = format!("{i:x<1024}");
            format!(
                r#"{{"kind":"{kind}","request_id":"{rid}","payload":{{"decision_id":"d{i}","candidate":{{"candidate_id":"c","candidate_type":"flow"}}}}}}"#
            )
        })
        .collect();
    let body = format!("[{}]", items.join(","));
    let gateway = |p: Publisher| {
        Arc::new(Gateway::new(p, keys_for(&tenant), body.len()).with_max_items(ITEMS))
    };

    // What the request takes in a roomy spool.
    let dir = tempfile::tempdir().unwrap();
    let g = gateway(offline_publisher(dir.path(), 1 << 30).await);
    let (status, answer) = post(&g, Body::from(body.clone())).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let (took, _) = g.publisher.spool_bytes();
    assert!(
        took > body.len() as u64,
        "{took} bytes of records for a {}-byte body",
        body.len()
    );
    assert!(
        took <= g.largest_request_spool_bytes(),
        "the bound ({}) covers the largest request ({took})",
        g.largest_request_spool_bytes()
    );

    // A spool with room for the body but not for the records: not ready, and rightly so.
    let dir = tempfile::tempdir().unwrap();
    let g = gateway(offline_publisher(dir.path(), took - 1).await);
    let (full, state) = spool_state(&g);
    assert!(full, "ready with {} bytes of room: {state}", took - 1);
    let r = readyz(State(g.clone())).await;
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    let (status, answer) = post(&g, Body::from(body)).await;
    assert_ne!(status, StatusCode::OK, "the request does not fit: {answer}");
}

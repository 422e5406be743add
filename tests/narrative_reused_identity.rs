//! An identity stored again with other content and another request id, end to end through
//! Kafka, `weft ingest` and `weft rebuild`: it is colored by the smallest of its request ids,
//! so both arrival orders give the same narratives, and so does a rebuild, which reads the
//! facts in no particular order. Whatever is anchored to the identity moves with it.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use common::pipeline::{check, Membership, Pipeline};
use serde_json::{json, Value};

fn envelope(kind: &str, request_id: Option<&str>, payload: Value) -> String {
    json!({"kind": kind, "request_id": request_id, "tenant": "default", "payload": payload})
        .to_string()
}

fn trace(id: &str, req: &str, extra: Value) -> String {
    let mut p = json!({"event_id": id, "event_type": "capability_executed",
                       "timestamp": "2026-03-08T06:00:05Z"});
    p.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    envelope("trace_event", Some(req), p)
}

fn handle(id: &str, req: Option<&str>, artifact_type: &str) -> String {
    envelope(
        "handle",
        req,
        json!({"handle_id": id, "capability_id": "org.test.cap",
               "artifact_type": artifact_type, "created_at": "2026-03-08T06:00:05Z"}),
    )
}

fn frame(id: &str, handle_refs: &[&str]) -> String {
    envelope(
        "frame",
        None,
        json!({"frame_id": id, "capability_id": "org.test.cap", "summary": "s",
               "created_at": "2026-03-08T06:00:05Z", "handle_refs": handle_refs}),
    )
}

/// te-1 (req-b) names h-1, which f-1 cites; h-2 (req-d) is cited by f-2.
fn first_versions() -> Vec<String> {
    vec![
        trace("te-1", "req-b", json!({"handle_id": "h-1"})),
        handle("h-1", None, "application/json"),
        frame("f-1", &["h-1"]),
        handle("h-2", Some("req-d"), "application/json"),
        frame("f-2", &["h-2"]),
    ]
}

/// te-1 and h-2 again, other content, smaller request ids, naming nothing.
fn second_versions() -> Vec<String> {
    vec![
        trace("te-1", "req-a", json!({"event_type": "capability_denied"})),
        handle("h-2", Some("req-c"), "text/plain"),
    ]
}

fn want() -> Membership {
    let set = |m: &[(&str, &str)]| -> BTreeSet<(String, String)> {
        m.iter()
            .map(|(k, i)| ((*k).to_owned(), (*i).to_owned()))
            .collect()
    };
    Membership::from([
        (
            "req-a".to_owned(),
            set(&[("trace_event", "te-1"), ("handle", "h-1"), ("frame", "f-1")]),
        ),
        (
            "req-c".to_owned(),
            set(&[("handle", "h-2"), ("frame", "f-2")]),
        ),
    ])
}

fn write(path: &Path, lines: &[String]) {
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
}

/// Publish `first`, let ingest store it, then `second`; the narratives once all is stored,
/// then after `weft rebuild`.
async fn run(tag: &str, first: Vec<String>, second: Vec<String>) -> (Membership, Membership) {
    let p = Pipeline::new(tag);
    let ingest = p.ingest(None);
    let (a, b) = (p.path("first.jsonl"), p.path("second.jsonl"));
    write(&a, &first);
    write(&b, &second);
    p.publish(&a);
    p.wait_for_facts(first.len() as u64, Duration::from_secs(120))
        .await;
    p.publish(&b);
    p.wait_for_facts(
        (first.len() + second.len()) as u64,
        Duration::from_secs(120),
    )
    .await;
    p.wait_for_narratives(&want(), Duration::from_secs(60))
        .await;
    let live = p.membership().await;
    assert_eq!(ingest.terminate().code(), Some(0));
    check(p.weft().arg("rebuild").output().unwrap(), "weft rebuild");
    (live, p.membership().await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identity_with_two_request_ids_lands_in_the_smaller_in_either_order_and_on_rebuild() {
    let (live, rebuilt) = run("it_reuse_ab", first_versions(), second_versions()).await;
    assert_eq!(live, want());
    assert_eq!(rebuilt, want(), "weft rebuild");
    let (live, rebuilt) = run("it_reuse_ba", second_versions(), first_versions()).await;
    assert_eq!(live, want(), "the other order");
    assert_eq!(rebuilt, want(), "weft rebuild, the other order");
}

/// The same payload under another request id, in the same partition within the dedup window,
/// is not a copy to drop: ingest's narratives take the node's color from it, so
/// `weft_events` must hold it for `weft rebuild` to agree (it was dropped as a duplicate,
/// and the rebuild then placed the handle in `adhoc:handle:h` while ingest had `req-copy`).
/// One partition per topic, so both records meet in one partition's dedup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_payload_under_another_request_id_is_stored_and_the_rebuild_agrees() {
    let p = Pipeline::new("it_reuse_copy");
    let (a, b) = (p.path("first.jsonl"), p.path("second.jsonl"));
    write(&a, &[handle("h", None, "application/json")]);
    write(&b, &[handle("h", Some("req-copy"), "application/json")]);
    // Published before ingest starts, so the topics are made with one partition.
    check(
        p.weft()
            .args(["publish", "--partitions", "1"])
            .arg(&a)
            .output()
            .unwrap(),
        "weft publish",
    );
    let ingest = p.ingest(None);
    p.wait_for_facts(1, Duration::from_secs(120)).await;
    p.publish(&b);
    p.wait_for_facts(2, Duration::from_secs(120)).await;
    let want: Membership = [(
        "req-copy".to_owned(),
        BTreeSet::from([("handle".to_owned(), "h".to_owned())]),
    )]
    .into();
    p.wait_for_narratives(&want, Duration::from_secs(60)).await;
    assert_eq!(ingest.terminate().code(), Some(0));
    check(p.weft().arg("rebuild").output().unwrap(), "weft rebuild");
    assert_eq!(p.membership().await, want, "weft rebuild");
    // The audit tells the two apart as ingest does: neither is a copy written behind its
    // back, so both are sealed and verify (the second was held as `inserted`, and sealing
    // of the partition stopped at it for good).
    check(
        p.weft().args(["audit", "seal"]).output().unwrap(),
        "weft audit seal",
    );
    assert_eq!(p.scalar("SELECT count() FROM weft_audit_chain").await, 2);
    let out = p
        .weft()
        .args(["audit", "verify", "--format", "json"])
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(0), "{report}");
    assert_eq!(report["verified"], 2, "{report}");
}

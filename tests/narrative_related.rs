//! A narrative names the other narratives its members link to, and those whose members link
//! into it (`related`), whether its members are read whole or only the first ones in time
//! (the HTTP APIs' bounded read): the links into it are then asked in two different ways.

mod common;

use std::time::Duration;

use common::pipeline::{Membership, Pipeline, Proc};
use serde_json::json;
use weft_store::narrative::query;

fn envelope(kind: &str, request_id: &str, payload: serde_json::Value) -> String {
    json!({"kind": kind, "request_id": request_id, "tenant": "default", "payload": payload})
        .to_string()
}

/// Publish `lines` (one event each) and ingest them until every event's node row, which
/// `related` reads, is stored; the running ingest.
async fn ingest_all(p: &Pipeline, lines: &[String]) -> Proc {
    let file = p.path("events.jsonl");
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    let ingest = p.ingest(None);
    p.publish(&file);
    let all = lines.len() as u64;
    p.wait_for_facts(all, Duration::from_secs(120)).await;
    p.wait_for_count(
        "SELECT count() FROM weft_narrative_nodes",
        all,
        Duration::from_secs(60),
    )
    .await;
    ingest
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn related_narratives_are_found_from_both_ends_of_a_link() {
    let p = Pipeline::new("it_related");
    // req-a: a handle, then a trace event. req-b: a trace event naming req-a's handle, which
    // stays in req-b (an event with a request id is its own anchor) and links across.
    let lines = [
        envelope(
            "handle",
            "req-a",
            json!({"handle_id": "h-a", "capability_id": "org.test.cap",
                   "artifact_type": "application/json", "created_at": "2026-03-08T06:00:01Z"}),
        ),
        envelope(
            "trace_event",
            "req-a",
            json!({"event_id": "te-a", "event_type": "capability_executed",
                   "timestamp": "2026-03-08T06:00:05Z"}),
        ),
        envelope(
            "trace_event",
            "req-b",
            json!({"event_id": "te-b", "event_type": "capability_executed",
                   "timestamp": "2026-03-08T06:00:09Z", "handle_id": "h-a"}),
        ),
    ];
    let file = p.path("events.jsonl");
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    let ingest = p.ingest(None);
    p.publish(&file);
    p.wait_for_facts(3, Duration::from_secs(120)).await;
    let member = |k: &str, i: &str| (k.to_owned(), i.to_owned());
    let want = Membership::from([
        (
            "req-a".to_owned(),
            [member("handle", "h-a"), member("trace_event", "te-a")].into(),
        ),
        ("req-b".to_owned(), [member("trace_event", "te-b")].into()),
    ]);
    p.wait_for_narratives(&want, Duration::from_secs(60)).await;
    // ... and the node rows, written after the members, which `related` reads.
    p.wait_for_count(
        "SELECT count() FROM weft_narrative_nodes",
        3,
        Duration::from_secs(60),
    )
    .await;

    let store = p.store();
    let read = |id: &'static str, max: u64| {
        let store = store.clone();
        async move {
            query::lookup_at_most(&store, "default", id, max)
                .await
                .unwrap()
                .unwrap_or_else(|| panic!("{id} not found"))
        }
    };
    // Whole: req-a is linked into from req-b, and req-b links out to req-a.
    let a = read("req-a", u64::MAX).await;
    assert_eq!(a.entries.len(), 2);
    assert_eq!(a.related, ["req-b"], "links into req-a from outside");
    assert_eq!(
        read("req-b", u64::MAX).await.related,
        ["req-a"],
        "links out"
    );
    // By a member's id, the same narrative.
    assert_eq!(read("te-b", u64::MAX).await.related, ["req-a"]);
    // Only the first member in time (the handle): the link into it is still found.
    let first = read("req-a", 1).await;
    assert_eq!((first.entries.len(), first.members_total), (1, 2));
    assert_eq!(first.entries[0].id, "h-a");
    assert_eq!(first.related, ["req-b"], "bounded read");
    assert_eq!(ingest.terminate().code(), Some(0));
}

/// A member cited by more events of other requests than a read follows: `related` names the
/// narratives of the first `RELATED_IDS_AT_MOST` of them and says it was cut. It used to read
/// every link into the member and ask for every citing event's narrative (a token cited by a
/// million requests: a million rows and hundreds of queries for one HTTP request).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_cited_by_more_requests_than_a_read_follows_names_some_and_says_so() {
    let p = Pipeline::new("it_related_cut");
    let citing = query::RELATED_IDS_AT_MOST + 20;
    let mut lines = vec![envelope(
        "handle",
        "req-hub",
        json!({"handle_id": "h-hub", "capability_id": "org.test.cap",
               "artifact_type": "application/json", "created_at": "2026-03-08T06:00:01Z"}),
    )];
    lines.extend((0..citing).map(|i| {
        envelope(
            "trace_event",
            &format!("req-{i:05}"),
            json!({"event_id": format!("te-{i:05}"), "event_type": "capability_executed",
                   "timestamp": "2026-03-08T06:00:09Z", "handle_id": "h-hub"}),
        )
    }));
    let ingest = ingest_all(&p, &lines).await;

    let store = p.store();
    for max in [u64::MAX, 1] {
        let hub = query::lookup_at_most(&store, "default", "req-hub", max)
            .await
            .unwrap()
            .expect("req-hub");
        assert!(hub.related_cut, "read of at most {max} members");
        let want: Vec<String> = (0..query::RELATED_IDS_AT_MOST)
            .map(|i| format!("req-{i:05}"))
            .collect();
        assert_eq!(hub.related, want, "read of at most {max} members");
        assert!(hub.to_text().contains("related (and more): req-00000, "));
    }
    let one = query::lookup(&store, "default", "req-00007")
        .await
        .unwrap()
        .expect("req-00007");
    assert_eq!(
        (one.related, one.related_cut),
        (vec!["req-hub".to_owned()], false)
    );
    assert_eq!(ingest.terminate().code(), Some(0));
}

/// A narrative whose members link to each other more often than one links query returns
/// (`INCOMING_AT_MOST`): an event of another request citing one of them is still found, and
/// the read is not cut. The links into a narrative are asked without leaving its own out
/// (cheaper); when they fill the query, the read asks again for the outside ones only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn links_between_members_do_not_hide_a_related_narrative() {
    let p = Pipeline::new("it_related_inner");
    let inner = query::INCOMING_AT_MOST as usize + 10;
    let trace = |i: usize, request: &str| {
        envelope(
            "trace_event",
            request,
            json!({"event_id": format!("te-{i:05}"), "event_type": "capability_executed",
                   "timestamp": "2026-03-08T06:00:09Z", "handle_id": "h-big"}),
        )
    };
    let mut lines = vec![envelope(
        "handle",
        "req-big",
        json!({"handle_id": "h-big", "capability_id": "org.test.cap",
               "artifact_type": "application/json", "created_at": "2026-03-08T06:00:01Z"}),
    )];
    lines.extend((0..inner).map(|i| trace(i, "req-big")));
    lines.push(trace(inner, "req-other"));
    let ingest = ingest_all(&p, &lines).await;
    let big = query::lookup(&p.store(), "default", "req-big")
        .await
        .unwrap()
        .expect("req-big");
    assert_eq!(big.members_total, inner as u64 + 1);
    assert_eq!(
        (big.related, big.related_cut),
        (vec!["req-other".to_owned()], false)
    );
    assert_eq!(ingest.terminate().code(), Some(0));
}

//! `GET /v1/narratives/{id}` on the ingest status server: bearer keys scoped to one tenant,
//! the same answer for "unknown" and "another tenant's", and no 5xx on hostile ids.

mod common;

use std::time::Duration;

use common::pipeline::{free_port, truth_membership, wait_for_port, Pipeline};
use reqwest::StatusCode;

const ACME: &str = "k-acme-0123456789abcdef";
const GLOBEX: &str = "k-globex-0123456789abcdef";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn narrative_api_is_tenant_scoped() {
    let p = Pipeline::new("it_api");
    let truth = p.simulate(&["--flows", "5", "--seed", "9", "--tenant", "acme"]);
    let file = p.path("events.jsonl");
    let addr = format!("127.0.0.1:{}", free_port());
    let keys = format!("{ACME}=acme,{GLOBEX}=globex");
    let ingest = p.ingest_with(Some(&addr), &[("WEFT_API_KEYS", &keys)]);
    p.publish(&file);
    p.wait_for_facts(truth.totals.distinct_events, Duration::from_secs(120))
        .await;
    // Every narrative complete before the reads (a request's events can span two passes,
    // and the first already answers 200).
    p.wait_for_narratives(&truth_membership(&truth), Duration::from_secs(120))
        .await;
    assert!(wait_for_port(&addr, Duration::from_secs(5)));

    let http = reqwest::Client::new();
    let req = &truth.requests[0].request_id;
    let url = |id: &str| format!("http://{addr}/v1/narratives/{}", urlencode(id));
    let get = |id: String, key: Option<&'static str>| {
        let mut r = http.get(url(&id));
        if let Some(k) = key {
            r = r.bearer_auth(k);
        }
        r.send()
    };
    // The owner reads it (once the projector has written it).
    let mut body = serde_json::Value::Null;
    for _ in 0..100 {
        let r = get(req.clone(), Some(ACME)).await.unwrap();
        if r.status() == StatusCode::OK {
            body = r.json().await.unwrap();
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(body["narrative_id"], req.as_str());
    assert_eq!(
        body["entries"].as_array().unwrap().len(),
        truth.requests[0].members.len()
    );

    // Another tenant's key: not found, exactly like an unknown id.
    assert_eq!(
        get(req.clone(), Some(GLOBEX)).await.unwrap().status(),
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        get("no-such-id".into(), Some(ACME)).await.unwrap().status(),
        StatusCode::NOT_FOUND
    );
    // No key, or a wrong one: 401.
    assert_eq!(
        get(req.clone(), None).await.unwrap().status(),
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        get(req.clone(), Some("k-wrong-0123456789abcdef"))
            .await
            .unwrap()
            .status(),
        StatusCode::UNAUTHORIZED
    );

    // Hostile ids: quotes, SQL fragments, unicode, very long. Never a 5xx.
    for id in [
        "' OR 1=1 --".to_owned(),
        "x'); DROP TABLE weft_events; --".to_owned(),
        "{t:String}".to_owned(),
        "наратив 🧵 \u{0}".to_owned(),
        "a".repeat(5000),
    ] {
        let status = get(id.clone(), Some(ACME)).await.unwrap().status();
        assert!(
            status.is_client_error(),
            "{status} for {:?}",
            &id[..id.len().min(40)]
        );
    }
    assert!(
        p.scalar("SELECT count() FROM weft_events").await > 0,
        "tables intact"
    );

    // With a per-query read limit below what the lookup reads, ClickHouse stops the query
    // and the request is refused (422), not failed (503). Restarted, so one process ingests.
    drop(ingest);
    let addr = format!("127.0.0.1:{}", free_port());
    let _limited = p.ingest_args(
        Some(&addr),
        &[("WEFT_API_KEYS", &keys)],
        &["--api-max-read-rows", "1"],
    );
    assert!(wait_for_port(&addr, Duration::from_secs(20)));
    let r = http
        .get(format!("http://{addr}/v1/narratives/{}", urlencode(req)))
        .bearer_auth(ACME)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "too_large", "{body}");
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The API's answer is bounded in payload bytes, as the audit timeline's: a narrative of 18
/// events of ~1 MB each comes back with its first members that fit in 16 MiB, says it was cut
/// by `payload_bytes`, and counts every member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_narrative_of_large_events_is_cut_at_the_payload_budget() {
    let p = Pipeline::new("it_api_bytes");
    let note = "n".repeat(990_000);
    let lines: Vec<String> = (0..18)
        .map(|i| {
            format!(
                r#"{{"kind":"trace_event","tenant":"acme","request_id":"r-big","payload":{{"event_id":"te-big-{i:02}","event_type":"flow_started","timestamp":"2026-11-01T00:00:{i:02}Z","metadata":{{"note":"{note}"}}}}}}"#
            )
        })
        .collect();
    let file = p.path("big.jsonl");
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let keys = format!("{ACME}=acme");
    let _ingest = p.ingest_with(Some(&addr), &[("WEFT_API_KEYS", &keys)]);
    p.publish(&file);
    p.wait_for_facts(18, Duration::from_secs(120)).await;
    assert!(wait_for_port(&addr, Duration::from_secs(20)));
    let http = reqwest::Client::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let body = loop {
        let r = http
            .get(format!("http://{addr}/v1/narratives/r-big"))
            .bearer_auth(ACME)
            .send()
            .await
            .unwrap();
        let body: serde_json::Value = r.json().await.unwrap_or_default();
        if body["members_total"] == 18 {
            break body;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the narrative of r-big never held its 18 members: {}",
            body.to_string().chars().take(300).collect::<String>()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let entries = body["entries"].as_array().unwrap();
    let bytes: usize = entries.iter().map(|e| e["payload"].to_string().len()).sum();
    assert!(
        !entries.is_empty() && entries.len() < 18,
        "{} entries",
        entries.len()
    );
    assert!(bytes <= 16 << 20, "{bytes} bytes of payload");
    assert_eq!(body["truncated_by"], "payload_bytes");
}

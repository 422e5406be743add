//! The audit API's own costs, on the local stack:
//! - a flood of cheap requests (403 refusals, each logged) is written to `weft_audit_log`
//!   in a few batched inserts by one writer, every row of it, and the rows still queued
//!   when the server is stopped are written before it exits;
//! - a timeline and a bundle are bounded in payload bytes, not only in members: a
//!   narrative whose members hold 20 MB of payload gives a timeline of its first members
//!   that fit in 16 MiB (`truncated_by: payload_bytes`) and a bundle refused with 422
//!   `too_large` naming the limit, while a small narrative is whole;
//! - a batch sent again under its token is written once.

mod common;

use std::time::Duration;

use common::pipeline::{Pipeline, Proc};
use reqwest::StatusCode;
use serde_json::Value;

const ACME: &str = "acme-audit-key-0123456789";
const GLOBEX: &str = "globex-audit-key-0123456789";

/// `weft audit serve` with both tenants' keys: the process and its address.
fn serve(p: &Pipeline, log: &str) -> (Proc, String) {
    p.audit_serve(&format!("{ACME}=acme,{GLOBEX}=globex"), log, &[])
}

/// The inserts `weft_audit_log` has taken: every insert is one block with the next block
/// number of the table, and a merge keeps the highest number of the parts it merges.
const INSERTS: &str = "SELECT toUInt64(max(max_block_number)) FROM system.parts \
    WHERE database = currentDatabase() AND table = 'weft_audit_log' AND active";
const REFUSALS: &str = "SELECT count() FROM weft_audit_log \
    WHERE tenant = 'acme' AND action = 'refused_tenant_forbidden'";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_logged_refusals_is_written_in_a_few_batches() {
    let p = Pipeline::new("it_auditlog");
    let (server, addr) = serve(&p, "serve.log");
    let http = reqwest::Client::new();
    // `n` refused requests, eight callers at once, as a flood would come.
    let flood = |from: u64, n: u64| {
        let (http, addr) = (http.clone(), addr.clone());
        async move {
            let mut calls = tokio::task::JoinSet::new();
            for i in from..from + n {
                let r = http
                    .get(format!(
                        "http://{addr}/v1/audit/checkpoints?tenant=globex&n={i}"
                    ))
                    .bearer_auth(ACME);
                calls.spawn(async move { r.send().await.unwrap().status() });
                if calls.len() == 8 {
                    let status = calls.join_next().await.unwrap().unwrap();
                    assert_eq!(status, StatusCode::FORBIDDEN);
                }
            }
            while let Some(status) = calls.join_next().await {
                assert_eq!(status.unwrap(), StatusCode::FORBIDDEN);
            }
        }
    };
    const N: u64 = 400;
    flood(0, N).await;
    let rows = p.wait_for_count(REFUSALS, N, Duration::from_secs(30)).await;
    assert_eq!(rows, N, "every refusal is on the record");
    let inserts = p.scalar(INSERTS).await;
    assert!(
        inserts * 10 <= N,
        "{N} rows took {inserts} inserts: the writer does not batch"
    );
    let written = common::metric(&addr, "weft_audit_log_rows_written_total").await;
    assert_eq!(written, Some(N));
    let dropped = common::metric(&addr, "weft_audit_log_rows_dropped_total").await;
    assert_eq!(dropped, Some(0));

    // Rows still queued when the server stops are written before it exits: the last
    // requests are answered, then SIGTERM at once, within the writer's second.
    const M: u64 = 16;
    flood(N, M).await;
    assert!(
        server.terminate().success(),
        "audit serve did not exit cleanly"
    );
    assert_eq!(
        p.scalar(REFUSALS).await,
        N + M,
        "the queued rows were flushed"
    );
}

/// A batch the writer sends again after an insert whose answer was lost (the rows may have
/// landed) carries the same token, and `weft_audit_log` takes it once (migration 0017);
/// another batch of the same rows, under its own token, is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_sent_again_under_its_token_is_written_once() {
    let p = Pipeline::new("it_auditdedup");
    let store = p.store();
    let rows: Vec<weft_audit::log::LogRow> = (0..3)
        .map(|i| {
            let q = serde_json::json!({ "i": i });
            weft_audit::log::LogRow::new("acme", "key:dedup", "search", &q, 1)
        })
        .collect();
    const ROWS: &str = "SELECT count() FROM weft_audit_log WHERE actor = 'key:dedup'";
    for _ in 0..2 {
        weft_audit::log::insert(&store, &rows, Some("batch-1"))
            .await
            .unwrap();
    }
    assert_eq!(p.scalar(ROWS).await, 3, "the second attempt was dropped");
    weft_audit::log::insert(&store, &rows, Some("batch-2"))
        .await
        .unwrap();
    assert_eq!(p.scalar(ROWS).await, 6, "another batch is written");
}

/// Narrative `nid` of tenant acme: a RoutingDecision, then `n` TraceEvents each carrying
/// `pad` bytes in an extension key, one second apart.
async fn store_narrative(p: &Pipeline, nid: &str, n: u64, pad: u64) {
    let rd = std::fs::read_to_string(
        common::repo_root().join("schemas/spec/examples/sample_payloads/routing_decision.json"),
    )
    .unwrap();
    let rd: Value = serde_json::from_str(&rd).unwrap();
    p.client()
        .query(
            "INSERT INTO weft_narratives (tenant, narrative_id, kind, id, content_hash, ts, \
             request_id, payload, version, is_deleted) SELECT 'acme', {n:String}, \
             'routing_decision', concat('rd-', {n:String}), toFixedString(repeat('r', 32), 32), \
             toDateTime64('2026-11-01 00:00:00', 6, 'UTC'), {n:String}, {rd:String}, 1, 0",
        )
        .param("n", nid)
        .param("rd", rd.to_string())
        .execute()
        .await
        .unwrap();
    p.client()
        .query(
            "INSERT INTO weft_narratives (tenant, narrative_id, kind, id, content_hash, ts, \
             request_id, payload, version, is_deleted) SELECT 'acme', {n:String}, \
             'trace_event', concat('te-', {n:String}, '-', leftPad(toString(number), 3, '0')), \
             toFixedString(leftPad(toString(number), 32, '0'), 32), \
             addSeconds(toDateTime64('2026-11-01 00:00:00', 6, 'UTC'), number + 1), {n:String}, \
             concat('{\"event_id\":\"te-', {n:String}, '-', leftPad(toString(number), 3, '0'), \
               '\",\"event_type\":\"capability_executed\",\"timestamp\":\"2026-11-01T00:00:01Z\",\
               \"principal\":\"agent-1\",\"x_test_pad\":\"', repeat('x', {pad:UInt64}), '\"}'), \
             1, 0 FROM numbers({count:UInt64})",
        )
        .param("n", nid)
        .param("pad", pad)
        .param("count", n)
        .execute()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeline_and_bundle_are_bounded_in_payload_bytes() {
    let p = Pipeline::new("it_auditbytes");
    // 20 events of 1,000,000 bytes of padding: 20 MB, past the 16 MiB of one answer.
    store_narrative(&p, "req-big", 20, 1_000_000).await;
    store_narrative(&p, "req-small", 3, 100).await;
    let (_server, addr) = serve(&p, "serve.log");
    let http = reqwest::Client::new();
    let get = |path: String| {
        let r = http.get(format!("http://{addr}{path}")).bearer_auth(ACME);
        async move { r.send().await.unwrap() }
    };
    const BUDGET: usize = 16 << 20;

    // The timeline: the first members in time that fit, and why it stops there.
    let r = get("/v1/audit/timeline/req-big".into()).await;
    assert_eq!(r.status(), StatusCode::OK);
    let body = r.bytes().await.unwrap();
    let t: Value = serde_json::from_slice(&body).unwrap();
    let entries = t["entries"].as_array().unwrap();
    let payload: usize = entries.iter().map(|e| e["payload"].to_string().len()).sum();
    assert!(
        payload <= BUDGET,
        "{payload} bytes of payload in one answer"
    );
    assert!(
        body.len() < BUDGET + (1 << 20),
        "{} bytes answered",
        body.len()
    );
    assert_eq!(t["members_total"], 21, "all counted");
    assert_eq!(t["truncated_by"], "payload_bytes");
    // 1 RoutingDecision and 16 events of ~1 MB fit in 16 MiB; the 17th would not.
    assert_eq!(entries.len(), 17);
    assert_eq!(entries[0]["id"], "rd-req-big", "the first in time");
    assert_eq!(entries[16]["id"], "te-req-big-015");

    // The bundle: whole or nothing, so refused, naming the limit.
    let r = get("/v1/audit/bundle/req-big".into()).await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["code"], "too_large", "{e}");
    let msg = e["error"]["message"].as_str().unwrap();
    assert!(msg.contains(&BUDGET.to_string()), "{msg}");

    // A narrative under the limits is whole, and not marked cut.
    let t: Value = get("/v1/audit/timeline/req-small".into())
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(t["entries"].as_array().map(Vec::len), Some(4), "{t}");
    assert_eq!(t["truncated_by"], Value::Null);
    let r = get("/v1/audit/bundle/req-small".into()).await;
    let status = r.status();
    let b: Value = r.json().await.unwrap();
    assert_eq!(status, StatusCode::OK, "{b}");
    assert_eq!(
        b["bundle"]["trace_events"].as_array().map(Vec::len),
        Some(3)
    );

    // The CLI's limits are its flags: 10 MB refuses the narrative before reading a payload,
    // naming the flag; its default (1 GiB) exports it whole.
    let bundle = |extra: &[&str]| {
        p.weft()
            .args([
                "audit",
                "bundle",
                "--tenant",
                "acme",
                "--request",
                "req-big",
            ])
            .args(extra)
            .output()
            .unwrap()
    };
    let out = bundle(&["--max-payload-bytes", "10000000"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--max-payload-bytes") && err.contains("10000000"),
        "{err}"
    );
    let out = bundle(&[]);
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}",
            String::from_utf8_lossy(&out.stderr[..out.stderr.len().min(2000)])
        )
    });
    assert_eq!(doc["trace_events"].as_array().map(Vec::len), Some(20));
}

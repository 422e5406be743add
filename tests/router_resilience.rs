//! The router keeps answering when ClickHouse is unreachable: from its priors, or from the
//! snapshot file it started from, and says so in the reason codes. ClickHouse is simulated
//! as down by pointing the router at a closed port (the shared ClickHouse is left alone).
//! Each part first waits (with a deadline) until the router reports a failed refresh in
//! `/metrics`, so the answers checked are those given after ClickHouse was found down.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::pipeline::{free_port, Proc};
use serde_json::{json, Value};
use weft_router::model::Snapshot;

const KEY: &str = "k-resilience-0123456789";
const OTHER_KEY: &str = "k-resilience-globex-0123";

/// The router, its base URL, and its spool folder (removed when dropped).
fn start_router(tag: &str, extra: &[&str]) -> (Proc, String, tempfile::TempDir) {
    let name = common::unique(tag);
    let spool = tempfile::tempdir().unwrap();
    let port = free_port();
    let dead_ch = format!("http://127.0.0.1:{}", free_port());
    let addr = format!("127.0.0.1:{port}");
    let child = common::weft()
        .env("WEFT_KAFKA_BROKERS", common::brokers())
        .env("WEFT_CLICKHOUSE_URL", dead_ch)
        .env("WEFT_ROUTER_KEYS", format!("{KEY}=acme,{OTHER_KEY}=globex"))
        .env("RUST_LOG", "warn")
        .args(["router", "--listen", &addr, "--refresh-ms", "200"])
        .args(["--topic-prefix", &format!("{name}.")])
        .arg("--spool-dir")
        .arg(spool.path())
        .args(extra)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    assert!(
        common::pipeline::wait_for_port(&addr, Duration::from_secs(30)),
        "router did not listen"
    );
    (Proc(child), format!("http://{addr}"), spool)
}

/// Wait until `/metrics` counts at least one failed refresh; the metrics text then.
async fn wait_for_failed_refresh(base: &str) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let text = reqwest::get(format!("{base}/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let failed = text
            .lines()
            .find_map(|l| l.strip_prefix("weft_router_snapshot_refresh_errors_total "))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
        if failed >= 1 {
            return text;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no failed refresh after 30 s:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn request() -> Value {
    json!({
        "context": {"intent": "search", "request_id": "req-1"},
        "candidates": [
            {"candidate_id": "a", "candidate_type": "tool"},
            {"candidate_id": "b", "candidate_type": "tool"}
        ],
        "constraints": {"max_latency_ms": 1000}
    })
}

async fn route(base: &str, body: &Value) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(format!("{base}/v1/route"))
        .bearer_auth(KEY)
        .json(body)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

fn codes(v: &Value) -> Vec<String> {
    v["reason_codes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn router_answers_from_priors_and_from_its_snapshot_with_clickhouse_down() {
    // No snapshot: priors, and the answer says so.
    // The default policy (squarecb) serves without any data.
    let (_p, base, _spool) = start_router("router_res_priors", &[]);
    let metrics = wait_for_failed_refresh(&base).await;
    let (status, v) = route(&base, &request()).await;
    assert_eq!(status, 200, "{v}");
    let c = codes(&v);
    assert!(c.contains(&"priors_only".into()), "{c:?}");
    assert!(c.contains(&"snapshot_stale".into()), "{c:?}");
    assert!(weft_schemas::Validator::global()
        .check("execution_routing_decision", &v)
        .unwrap()
        .is_empty());
    assert!(
        metrics.contains("weft_router_snapshot_stale 1"),
        "{metrics}"
    );
    assert!(metrics.contains("weft_router_snapshot_age_seconds"));

    // From a snapshot file in which `b` is much better: greedy picks b, stale but not priors.
    let mut snap = Snapshot::empty("test");
    let arms = snap.arms_mut("acme", "search");
    for i in 0..100 {
        arms.entry("a".into())
            .or_default()
            .observe(i % 2 == 0, Some(100.0), 0.0, None);
        arms.entry("b".into())
            .or_default()
            .observe(i % 10 != 0, Some(100.0), 0.0, None);
    }
    let snap_dir = tempfile::tempdir().unwrap();
    let file = snap_dir.path().join("snapshot.json");
    std::fs::write(&file, serde_json::to_string(&snap).unwrap()).unwrap();
    let (_p2, base2, _spool2) = start_router(
        "router_res_snap",
        &["--policy", "greedy", "--snapshot", file.to_str().unwrap()],
    );
    wait_for_failed_refresh(&base2).await;
    for _ in 0..20 {
        let (status, v) = route(&base2, &request()).await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["candidate"]["candidate_id"], "b", "{v}");
        assert_eq!(v["metadata"]["x_weft_propensity"], 1.0);
        let c = codes(&v);
        assert!(c.contains(&"snapshot_stale".into()), "{c:?}");
        assert!(!c.contains(&"priors_only".into()), "{c:?}");
    }
    // Another tenant never sees acme's statistics: for globex both candidates are unknown,
    // so greedy falls back to the first one.
    let r = reqwest::Client::new()
        .post(format!("{base2}/v1/route"))
        .bearer_auth(OTHER_KEY)
        .json(&request())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["candidate"]["candidate_id"], "a", "{v}");
    assert!(codes(&v).contains(&"cold_start".into()));
    // A request naming another tenant in its context is refused; so is an unknown key.
    let mut foreign = request();
    foreign["context"]["tenant"] = json!("globex");
    let (status, _) = route(&base2, &foreign).await;
    assert_eq!(status, 403);
    let r = reqwest::Client::new()
        .post(format!("{base2}/v1/route"))
        .bearer_auth("k-not-a-key-0000000000")
        .json(&request())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    assert_eq!(
        r.headers()
            .get("www-authenticate")
            .and_then(|v| v.to_str().ok()),
        Some("Bearer")
    );
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "invalid_api_key", "{v}");
    // No key at all: the other shared code.
    let r = reqwest::Client::new()
        .post(format!("{base2}/v1/feedback"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "missing_api_key", "{v}");
}

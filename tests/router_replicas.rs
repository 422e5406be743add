//! Two router replicas and one feedback stream (issue 17): each replica learns the feedback
//! posted to it at once and everyone's at the refresh, from the decisions and feedback
//! stored in ClickHouse (joined by tenant and decision id); once everything is stored, no
//! outcome is counted twice and each replica serves exactly the model rebuilt from
//! ClickHouse alone (`weft router snapshot`).

mod common;

use std::time::Duration;

use common::pipeline::{free_port, wait_for_port, Pipeline, Proc};
use serde_json::{json, Value};
use weft_router::rng::Rng;

const KEY: &str = "k-replicas-0123456789";
const CYCLES: usize = 300;

fn start(p: &Pipeline, n: usize) -> (Proc, String) {
    let addr = format!("127.0.0.1:{}", free_port());
    let log = std::fs::File::create(p.path(&format!("router-{n}.log"))).unwrap();
    let child = p
        .weft()
        .env("WEFT_ROUTER_KEYS", format!("{KEY}=acme"))
        .args(["router", "--listen", &addr, "--refresh-ms", "300"])
        .args(["--no-create-topics", "--spool-dir"])
        .arg(p.path(&format!("router-spool-{n}")))
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    assert!(wait_for_port(&addr, Duration::from_secs(30)));
    (Proc(child), format!("http://{addr}"))
}

async fn model(http: &reqwest::Client, base: &str) -> Value {
    http.get(format!("{base}/v1/model"))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_count_each_outcome_once_and_converge_on_the_stored_model() {
    let p = Pipeline::new("router_replicas");
    let _ingest = p.ingest(None);
    common::wait_for(Duration::from_secs(60), || {
        let log = p.ingest_log_all();
        log.contains("narrative projector loaded").then_some(())
    })
    .unwrap_or_else(|| panic!("ingest did not start:\n{}", p.ingest_log()));
    let replicas = [start(&p, 0), start(&p, 1)];
    let http = reqwest::Client::new();
    let mut rng = Rng::new(17);
    let tiers = ["free", "pro", "enterprise"];
    for i in 0..CYCLES {
        let base = &replicas[i % 2].1;
        let tier = tiers[rng.below(3)];
        let req = json!({
            "context": {"tier": tier, "tokens": 100 + rng.below(5000), "request_id": format!("rep-{i}")},
            "candidates": [
                {"candidate_id": "a", "candidate_type": "tool"},
                {"candidate_id": "b", "candidate_type": "tool"},
                {"candidate_id": "c", "candidate_type": "flow"}
            ],
        });
        let r = http
            .post(format!("{base}/v1/route"))
            .bearer_auth(KEY)
            .json(&req)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
        let d: Value = r.json().await.unwrap();
        let id = d["candidate"]["candidate_id"].as_str().unwrap().to_owned();
        let rate = if (tier == "free") == (id == "a") {
            0.8
        } else {
            0.3
        };
        let fb = json!({"decision_id": d["decision_id"], "candidate_id": id,
                        "success": rng.uniform() < rate, "latency_ms": 50 + rng.below(100),
                        "timestamp": weft_schemas::time::now_rfc3339()});
        let r = http
            .post(format!("{base}/v1/feedback"))
            .bearer_auth(KEY)
            .json(&fb)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 202);
        if i == 0 {
            // Learnt at once by the replica that heard it (a refresh cannot have added more:
            // there is nothing else to learn yet).
            assert_eq!(model(&http, base).await["updates"], 1);
        }
    }
    // Everything stored, exactly: the decisions and the feedback.
    for kind in ["execution_routing_decision", "execution_feedback"] {
        let sql = format!("SELECT count() FROM weft_events WHERE kind = '{kind}'");
        let n = p
            .wait_for_count(&sql, CYCLES as u64, Duration::from_secs(60))
            .await;
        assert_eq!(n, CYCLES as u64, "{kind}");
    }
    // The model rebuilt from ClickHouse alone.
    let file = p.path("snapshot.json");
    let out = p
        .weft()
        .args(["router", "snapshot", "--out"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let snap: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let rebuilt = snap["contextual"]["acme"].clone();
    assert_eq!(
        rebuilt["updates"], CYCLES,
        "the rebuild counts each stored outcome once"
    );
    let arms_n: f64 = rebuilt["arms"]
        .as_object()
        .unwrap()
        .values()
        .map(|a| a["n"].as_f64().unwrap())
        .sum();
    assert_eq!(arms_n, CYCLES as f64);
    // Each replica, after its refreshes, serves exactly that model: every outcome once
    // (its own, learnt at once, replaced by the stored copy), the other replica's included.
    for (_, base) in &replicas {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let m = model(&http, base).await;
            if m == rebuilt {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "replica {base} serves {} updates, not the rebuilt model ({} updates)",
                m["updates"],
                rebuilt["updates"]
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

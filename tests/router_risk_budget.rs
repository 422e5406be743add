//! The bounded-risk gate under concurrency, on the local stack (Kafka for the decisions the
//! router publishes): a candidate whose latency is still unknown is admitted under a
//! `max_latency_ms` constraint only while fewer than `--risk-budget` of its decisions await
//! their outcome. Many concurrent constrained decisions must never put more than the budget
//! in flight: with the check and the count apart (check-then-act), concurrent requests all
//! pass the check before any is counted.

mod common;

use std::time::Duration;

use common::pipeline::{free_port, wait_for_port, Pipeline, Proc};
use serde_json::{json, Value};

const KEY: &str = "k-risk-budget-acme-012345";
const BUDGET: usize = 2;
const REQUESTS: usize = 200;
const ROUNDS: usize = 5;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_constrained_decisions_never_exceed_the_risk_budget() {
    let p = Pipeline::new("router_risk_budget");
    let addr = format!("127.0.0.1:{}", free_port());
    let _router = Proc(
        p.weft()
            .env("WEFT_ROUTER_KEYS", format!("{KEY}=acme"))
            .args(["router", "--listen", &addr, "--refresh-ms", "0"])
            .args(["--risk-budget", &BUDGET.to_string(), "--spool-dir"])
            .arg(p.path("router-spool"))
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    assert!(wait_for_port(&addr, Duration::from_secs(30)));
    let url = format!("http://{addr}/v1/route");
    let client = reqwest::Client::new();
    // Each round offers a new unverified candidate, so each is an independent chance for
    // concurrent decisions to slip past a check that is not held until the count.
    for round in 0..ROUNDS {
        let unverified_id = format!("unverified-{round}");
        // "safe" declares a latency within the constraint; the unverified one declares
        // none, so it is admissible only within the budget (and, both unseen, SquareCB
        // picks either).
        let body = json!({
            "context": {"intent": "risk", "request_id": "req-risk"},
            "candidates": [
                {"candidate_id": "safe", "candidate_type": "tool",
                 "metadata": {"x_weft_latency_ms": 100}},
                {"candidate_id": unverified_id, "candidate_type": "tool"}
            ],
            "constraints": {"max_latency_ms": 1000}
        });
        let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(REQUESTS));
        let tasks: Vec<_> = (0..REQUESTS)
            .map(|_| {
                let (client, url, body, barrier) =
                    (client.clone(), url.clone(), body.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    let r = client
                        .post(&url)
                        .bearer_auth(KEY)
                        .json(&body)
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(r.status().as_u16(), 200);
                    r.json::<Value>().await.unwrap()
                })
            })
            .collect();
        let (mut unverified, mut held_back) = (0, 0);
        for t in tasks {
            let d = t.await.unwrap();
            if d["candidate"]["candidate_id"] == unverified_id.as_str() {
                unverified += 1;
            }
            if d["metadata"]["x_weft_excluded"][&unverified_id] == "unverified_in_flight" {
                held_back += 1;
            }
        }
        // No feedback was posted: every decision for it is still in flight.
        assert!(
            unverified <= BUDGET,
            "round {round}: {unverified} decisions for the unverified candidate in flight, budget {BUDGET}"
        );
        assert!(unverified >= 1, "round {round}: never tried");
        assert!(
            held_back >= REQUESTS - 2 * BUDGET - 20,
            "round {round}: only {held_back} decisions held it back"
        );
    }
}

/// A decision is settled once: the same feedback posted again (a client's retry) frees no
/// slot held by another decision of the same candidate, so the budget still holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_feedback_settles_its_decision_once() {
    const KEY1: &str = "k-risk-once-acme-0123456";
    let p = Pipeline::new("router_risk_once");
    let addr = format!("127.0.0.1:{}", free_port());
    let _router = Proc(
        p.weft()
            .env("WEFT_ROUTER_KEYS", format!("{KEY1}=acme"))
            .args(["router", "--listen", &addr, "--refresh-ms", "0"])
            .args(["--risk-budget", "1", "--spool-dir"])
            .arg(p.path("router-spool"))
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    assert!(wait_for_port(&addr, Duration::from_secs(30)));
    let client = reqwest::Client::new();
    let post = |path: &'static str, body: Value| {
        let (client, url) = (client.clone(), format!("http://{addr}{path}"));
        async move {
            let r = client
                .post(url)
                .bearer_auth(KEY1)
                .json(&body)
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    // The static policy takes the first admissible candidate: the unverified one whenever
    // the budget admits it, else "safe".
    let route = json!({
        "context": {"intent": "risk-once", "request_id": "req-risk-once"},
        "candidates": [
            {"candidate_id": "unverified", "candidate_type": "tool"},
            {"candidate_id": "safe", "candidate_type": "tool",
             "metadata": {"x_weft_latency_ms": 100}}
        ],
        "constraints": {"max_latency_ms": 1000},
        "policy": "static"
    });
    let chosen = |d: &Value| d["candidate"]["candidate_id"].as_str().unwrap().to_owned();
    let (status, d1) = post("/v1/route", route.clone()).await;
    assert_eq!(status, 200, "{d1}");
    assert_eq!(chosen(&d1), "unverified", "{d1}");
    // Its outcome, without a latency: the candidate stays unverified.
    let f = json!({"decision_id": d1["decision_id"], "candidate_id": "unverified",
                   "success": true, "timestamp": weft_schemas::time::now_rfc3339()});
    let (status, v) = post("/v1/feedback", f.clone()).await;
    assert_eq!(status, 202, "{v}");
    let (status, d2) = post("/v1/route", route.clone()).await;
    assert_eq!(status, 200, "{d2}");
    assert_eq!(chosen(&d2), "unverified", "D1 was settled: {d2}");
    // D1's feedback again: D2 is still in flight.
    let (status, v) = post("/v1/feedback", f).await;
    assert_eq!(status, 202, "{v}");
    let (status, d3) = post("/v1/route", route).await;
    assert_eq!(status, 200, "{d3}");
    assert_eq!(
        chosen(&d3),
        "safe",
        "D2 was freed by D1's repeated feedback: {d3}"
    );
    assert_eq!(
        d3["metadata"]["x_weft_excluded"]["unverified"], "unverified_in_flight",
        "{d3}"
    );
}

//! The feedback loop on the local stack: 3000 route -> execute -> feedback cycles through the
//! router's HTTP API, with the feedback going through Kafka, `weft ingest`, the 0003
//! aggregates and the router's snapshot refresh. Three admissible candidates with hidden
//! success rates, latencies and costs, and a fourth whose declared latency breaks the
//! constraint. Thompson sampling must settle on the best candidate (>= 80% of the last 500),
//! never break the constraint, and log a propensity with every decision.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::pipeline::{Pipeline, Proc};
use serde_json::{json, Value};
use weft_router::rng::Rng;

const KEY: &str = "k-learning-0123456789";
const CYCLES: usize = 3000;
const WORKERS: usize = 48;
const MAX_LATENCY_MS: f64 = 1000.0;

/// Hidden truth: (id, success rate, mean latency ms, cost usd).
const ARMS: [(&str, f64, f64, f64); 3] = [
    ("fast-cheap", 0.60, 120.0, 0.001),
    ("solid", 0.90, 400.0, 0.010),
    ("middling", 0.75, 250.0, 0.004),
];
const BEST: &str = "solid";

fn candidates() -> Value {
    json!([
        {"candidate_id": "fast-cheap", "candidate_type": "tool"},
        {"candidate_id": "solid", "candidate_type": "tool"},
        {"candidate_id": "middling", "candidate_type": "flow"},
        {"candidate_id": "slow-batch", "candidate_type": "workflow",
         "metadata": {"x_weft_latency_ms": 5000}}
    ])
}

fn start_router(p: &Pipeline) -> (Proc, String) {
    p.router(
        KEY,
        "acme",
        &[
            "--refresh-ms",
            "250",
            "--policy",
            "thompson",
            "--half-life-s",
            "0",
            "--w-success",
            "1",
            "--w-cost",
            "1",
            "--w-latency-per-s",
            "0.1",
        ],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thompson_router_learns_the_best_candidate_through_the_pipeline() {
    let p = Pipeline::new("router_learn");
    let _ingest = p.ingest(None);
    // The ingester creates the topics; the router must not race it (two creators of one
    // topic at once can upset the broker).
    common::wait_for(Duration::from_secs(60), || {
        let log = p.ingest_log_all();
        log.contains("narrative projector loaded").then_some(())
    })
    .unwrap_or_else(|| panic!("ingest did not start:\n{}", p.ingest_log()));
    let (_router, base) = start_router(&p);
    let http = reqwest::Client::new();
    // (sequence number, chosen id, propensity)
    let log: Arc<Mutex<Vec<(usize, String, f64)>>> = Arc::default();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = std::time::Instant::now();
    let mut tasks = Vec::new();
    for w in 0..WORKERS {
        let (http, base, log, next) = (http.clone(), base.clone(), log.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng::new(1000 + w as u64);
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if i >= CYCLES {
                    return;
                }
                let req = json!({
                    "context": {"intent": "summarize", "request_id": format!("learn-{i}")},
                    "candidates": candidates(),
                    "constraints": {"max_latency_ms": MAX_LATENCY_MS},
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
                let prop = d["metadata"]["x_weft_propensity"].as_f64().unwrap();
                // Execute: draw the hidden outcome.
                let (_, rate, lat, cost) = *ARMS
                    .iter()
                    .find(|a| a.0 == id)
                    .unwrap_or_else(|| panic!("constraint violated: chose {id}"));
                let success = rng.uniform() < rate;
                let latency = (lat * (0.8 + 0.4 * rng.uniform())) as u64;
                let fb = json!({
                    "decision_id": d["decision_id"],
                    "candidate_id": id,
                    "success": success,
                    "timestamp": weft_schemas::time::now_rfc3339(),
                    "latency_ms": latency,
                    "cost": {"usd": cost},
                });
                let r = http
                    .post(format!("{base}/v1/feedback"))
                    .bearer_auth(KEY)
                    .json(&fb)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status().as_u16(), 202, "{}", r.text().await.unwrap());
                log.lock().unwrap().push((i, id, prop));
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let elapsed = started.elapsed();
    let mut log = log.lock().unwrap().clone();
    log.sort_by_key(|x| x.0);
    assert_eq!(log.len(), CYCLES);
    let last = &log[CYCLES - 500..];
    let best_share = last.iter().filter(|x| x.1 == BEST).count() as f64 / 500.0;
    let regret = |r: &[(usize, String, f64)]| -> f64 {
        let best = ARMS.iter().find(|a| a.0 == BEST).unwrap().1;
        r.iter()
            .map(|x| best - ARMS.iter().find(|a| a.0 == x.1).unwrap().1)
            .sum()
    };
    // Feedback counts at once, so learning takes the first few hundred decisions: the
    // regret of the first 500 against the last 500 (halves would both be mostly converged).
    let first = regret(&log[..500]);
    let last_regret = regret(&log[CYCLES - 500..]);
    eprintln!(
        "{CYCLES} cycles in {elapsed:?}; best share in the last 500: {best_share:.3}; \
         expected-success regret first 500 {first:.1}, last 500 {last_regret:.1}"
    );
    assert!(best_share >= 0.8, "best share {best_share}");
    assert!(last_regret < first, "regret must grow sublinearly");
    assert!(log.iter().all(|x| x.2 > 0.0 && x.2 <= 1.0));

    // Everything reached ClickHouse: every decision with its propensity, every outcome in
    // the aggregates. Each kind's own count is waited for (decisions are published without
    // waiting for their ack, feedback only once durable, on two topics ingest flushes
    // separately), then the totals are checked exactly, once, with no polling around them.
    for kind in ["execution_routing_decision", "execution_feedback"] {
        let sql = format!("SELECT count() FROM weft_events WHERE kind = '{kind}'");
        let n = p
            .wait_for_count(&sql, CYCLES as u64, Duration::from_secs(60))
            .await;
        assert_eq!(n, CYCLES as u64, "{kind}");
    }
    assert_eq!(
        p.scalar("SELECT count() FROM weft_events").await,
        2 * CYCLES as u64
    );
    let with_prop = p
        .scalar(
            "SELECT count() FROM weft_events WHERE kind = 'execution_routing_decision' \
             AND JSONExtractFloat(payload, 'metadata', 'x_weft_propensity') > 0",
        )
        .await;
    assert_eq!(with_prop, CYCLES as u64);
    let aggregated = p
        .scalar("SELECT toUInt64(sum(n)) FROM weft_router_stats WHERE context_key = 'summarize'")
        .await;
    assert_eq!(aggregated, CYCLES as u64);
    let slow = p
        .scalar(
            "SELECT count() FROM weft_events WHERE kind = 'execution_routing_decision' \
             AND candidate_id = 'slow-batch'",
        )
        .await;
    assert_eq!(slow, 0, "a decision violated the latency constraint");

    // Offline evaluation of the greedy policy on the logged data: the artifact validates, and
    // its IPS / SNIPS / DR agree with a direct computation from the stored rows.
    let out = p.path("eval.json");
    let run = p
        .weft()
        .args([
            "eval", "--tenant", "acme", "--policy", "greedy", "--seed", "7",
        ])
        .args(["--bootstrap", "200", "--gate", "0.5", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let art: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    assert!(weft_schemas::Validator::global()
        .check("evaluation_artifact", &art)
        .unwrap()
        .is_empty());
    let rows: Vec<(String, f64, u8, String)> = p
        .client()
        .query(
            "SELECT d.candidate_id, JSONExtractFloat(d.payload, 'metadata', 'x_weft_propensity'), \
                    toUInt8(JSONExtractBool(f.payload, 'success')), \
                    arrayStringConcat(arrayMap(x -> JSONExtractString(x, 'candidate_id'), \
                             JSONExtractArrayRaw(d.payload, 'fallback_candidates')), ',') \
             FROM (SELECT id, candidate_id, payload FROM weft_events \
                   WHERE kind = 'execution_routing_decision') AS d \
             INNER JOIN (SELECT JSONExtractString(payload, 'decision_id') AS did, payload \
                   FROM weft_events WHERE kind = 'execution_feedback') AS f ON f.did = d.id",
        )
        .fetch_all()
        .await
        .unwrap();
    assert_eq!(rows.len(), CYCLES);
    let n = rows.len() as f64;
    let mean = |c: &str| {
        let v: Vec<f64> = rows
            .iter()
            .filter(|r| r.0 == c)
            .map(|r| r.2 as f64)
            .collect();
        (v.iter().sum::<f64>(), v.len() as f64)
    };
    // Greedy on the in-sample fit: highest posterior mean success (Beta(1, 1) prior) among
    // each decision's own admissible set (its choice and fallbacks: a candidate waiting on
    // its risk budget at the start was not offered), ties to the first id.
    let posterior = |c: &str| {
        let (s, k) = mean(c);
        (s + 1.0) / (k + 2.0)
    };
    let greedy = |offered: Vec<&str>| -> String {
        let mut offered = offered;
        offered.sort_unstable();
        let mut best = offered[0];
        for c in offered {
            if posterior(c) > posterior(best) {
                best = c;
            }
        }
        best.to_owned()
    };
    let targets: Vec<String> = rows
        .iter()
        .map(|r| {
            greedy(
                std::iter::once(r.0.as_str())
                    .chain(r.3.split(',').filter(|c| !c.is_empty()))
                    .collect(),
            )
        })
        .collect();
    let target = greedy(ARMS.iter().map(|a| a.0).collect());
    let q = |c: &str| {
        let (s, k) = mean(c);
        s / k
    };
    let w: Vec<f64> = rows
        .iter()
        .zip(&targets)
        .map(|(r, t)| if &r.0 == t { 1.0 / r.1 } else { 0.0 })
        .collect();
    let ips = rows
        .iter()
        .zip(&w)
        .map(|(r, w)| w * r.2 as f64)
        .sum::<f64>()
        / n;
    let snips = rows
        .iter()
        .zip(&w)
        .map(|(r, w)| w * r.2 as f64)
        .sum::<f64>()
        / w.iter().sum::<f64>();
    let dr = rows
        .iter()
        .zip(&w)
        .zip(&targets)
        .map(|((r, w), t)| q(t) + w * (r.2 as f64 - q(&r.0)))
        .sum::<f64>()
        / n;
    let m = &art["metrics"];
    eprintln!(
        "eval greedy ({target}): IPS {:.4} (ref {ips:.4}), SNIPS {:.4} (ref {snips:.4}), \
         DR {:.4} (ref {dr:.4}), DR 95% CI {}, true value 0.90",
        m["ips"], m["snips"], m["dr"], art["uncertainty"]["dr_ci"]
    );
    assert_eq!(target, BEST);
    for (got, want) in [(&m["ips"], ips), (&m["snips"], snips)] {
        assert!(
            (got.as_f64().unwrap() - want).abs() < 1e-9,
            "{got} vs {want}"
        );
    }
    // DR's model is cross-fitted (each record's from the other folds, shrunk toward the
    // candidate's mean), so it differs from this in-sample reference by the model's
    // difference, O(1/n) per candidate here (one context, ~1000 outcomes per candidate).
    let got = m["dr"].as_f64().unwrap();
    assert!(
        (got - dr).abs() < 0.01,
        "DR {got} vs in-sample reference {dr}"
    );

    // The fitted state exports as a versioned snapshot that a router can start from.
    let snap_file = p.path("snapshot.json");
    let run = p
        .weft()
        .args(["router", "snapshot", "--half-life-s", "0", "--out"])
        .arg(&snap_file)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let snap =
        weft_router::model::Snapshot::from_json(&std::fs::read_to_string(&snap_file).unwrap())
            .unwrap();
    let arms = snap
        .arms("acme", "summarize")
        .expect("acme/summarize in the snapshot");
    let total: f64 = arms.values().map(|a| a.n).sum();
    assert_eq!(total, CYCLES as f64);
    let solid = &arms[BEST];
    assert!(solid.latency_q.is_some() && solid.mean_cost().unwrap() > 0.0);
}

/// A non-contextual policy counts a feedback at once (before any refresh), and the refresh
/// that reads the same outcomes back from ClickHouse does not count them again: greedy's
/// score of a candidate after three failures is the same before and after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_counts_feedback_at_once_and_once() {
    let p = Pipeline::new("router_now");
    let _ingest = p.ingest(None);
    common::wait_for(Duration::from_secs(60), || {
        let log = p.ingest_log_all();
        log.contains("narrative projector loaded").then_some(())
    })
    .unwrap_or_else(|| panic!("ingest did not start:\n{}", p.ingest_log()));
    let (_router, base) = p.router(
        KEY,
        "acme",
        &[
            "--policy",
            "greedy",
            "--refresh-ms",
            "300",
            "--half-life-s",
            "0",
        ],
    );
    let http = reqwest::Client::new();
    let body = json!({
        "context": {"intent": "now"},
        "candidates": [
            {"candidate_id": "a", "candidate_type": "tool"},
            {"candidate_id": "b", "candidate_type": "tool"}
        ]
    });
    let route = || async {
        let r = http
            .post(format!("{base}/v1/route"))
            .bearer_auth(KEY)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        r.json::<Value>().await.unwrap()
    };
    let addr = base.trim_start_matches("http://").to_owned();
    let metric = |name: &'static str| {
        let addr = addr.clone();
        async move { common::metric(&addr, name).await.unwrap_or(0) }
    };
    let first = route().await;
    assert_eq!(
        first["candidate"]["candidate_id"], "a",
        "ties go to the first"
    );
    let score_a = |d: &Value| d["metadata"]["x_weft_scores"]["a"].as_f64().unwrap();
    let untried = score_a(&first);
    for i in 0..3 {
        // "a" is the choice or a fallback: either way, its outcome is this decision's.
        let d = if i == 0 { first.clone() } else { route().await };
        let r = http
            .post(format!("{base}/v1/feedback"))
            .bearer_auth(KEY)
            .json(&json!({
                "decision_id": d["decision_id"],
                "candidate_id": "a",
                "success": false,
                "timestamp": weft_schemas::time::now_rfc3339(),
            }))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202);
    }
    // At once (greedy turned to "b" after the first): "a" scores three failures.
    let now = route().await;
    assert_eq!(now["candidate"]["candidate_id"], "b", "{now}");
    let after_three = score_a(&now);
    assert!(after_three < untried, "{untried} -> {after_three}");
    // Once the refresh has read the three outcomes back (and refreshed twice more, so
    // the aggregates read hold them too), "a" still scores exactly three failures.
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    while metric("weft_router_model_refresh_rows_total").await < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "outcomes not read back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let refreshes = metric("weft_router_snapshot_refresh_total").await;
    while metric("weft_router_snapshot_refresh_total").await < refreshes + 2 {
        assert!(std::time::Instant::now() < deadline, "no refresh");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let later = route().await;
    assert_eq!(later["candidate"]["candidate_id"], "b", "{later}");
    assert!(
        (score_a(&later) - after_three).abs() < 1e-9,
        "counted once: {after_three} before the refresh, {} after",
        score_a(&later)
    );
}

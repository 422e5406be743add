//! The router as a hostile tenant and a careless client would use it (issue 16, items 2
//! and 6): tenant B naming tenant A's decision id changes nothing of A's and reveals
//! nothing, on every router route; decision ids are random; oversize input is answered
//! 413/422 with a clear error, never 500. On the local stack (Kafka for the feedback's ack,
//! ingest and ClickHouse to read what was stored).

mod common;

use std::time::Duration;

use common::pipeline::{wait_for_port, Pipeline};
use serde_json::{json, Value};

const KEY_A: &str = "k-tenancy-acme-0123456789";
const KEY_B: &str = "k-tenancy-globex-0123456";

fn request(intent: &str) -> Value {
    json!({
        "context": {"intent": intent, "tier": "gold", "request_id": "req-1"},
        "candidates": [
            {"candidate_id": "a", "candidate_type": "tool"},
            {"candidate_id": "b", "candidate_type": "tool"}
        ]
    })
}

async fn post(base: &str, path: &str, key: &str, body: &Value) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .bearer_auth(key)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn get(base: &str, path: &str, key: &str) -> (u16, String) {
    let r = reqwest::Client::new()
        .get(format!("{base}{path}"))
        .bearer_auth(key)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

fn feedback(decision_id: &Value, candidate: &str, success: bool) -> Value {
    json!({"decision_id": decision_id, "candidate_id": candidate, "success": success,
           "timestamp": weft_schemas::time::now_rfc3339(), "latency_ms": 100})
}

fn start(p: &Pipeline) -> (common::pipeline::Proc, String) {
    start_with(p, &[])
}

fn start_with(p: &Pipeline, extra: &[&str]) -> (common::pipeline::Proc, String) {
    let addr = format!("127.0.0.1:{}", common::pipeline::free_port());
    let child = p
        .weft()
        .env("WEFT_ROUTER_KEYS", format!("{KEY_A}=acme,{KEY_B}=globex"))
        .args(["router", "--listen", &addr, "--refresh-ms", "0"])
        .args(["--no-create-topics", "--spool-dir"])
        .arg(p.path("router-spool"))
        .args(extra)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    assert!(wait_for_port(&addr, Duration::from_secs(30)));
    (common::pipeline::Proc(child), format!("http://{addr}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenants_decision_id_changes_and_reveals_nothing() {
    let p = Pipeline::new("router_tenancy");
    let _ingest = p.ingest(None);
    common::wait_for(Duration::from_secs(60), || {
        let log = p.ingest_log_all();
        log.contains("narrative projector loaded").then_some(())
    })
    .unwrap_or_else(|| panic!("ingest did not start:\n{}", p.ingest_log()));
    let (_router, base) = start(&p);

    // Tenant A decides and learns one outcome of its own.
    let (status, d1) = post(&base, "/v1/route", KEY_A, &request("secret-intent-of-acme")).await;
    assert_eq!(status, 200, "{d1}");
    let (status, _) = post(
        &base,
        "/v1/feedback",
        KEY_A,
        &feedback(&d1["decision_id"], "a", true),
    )
    .await;
    assert_eq!(status, 202);
    let (_, model_a) = get(&base, "/v1/model", KEY_A).await;
    let model_a: Value = serde_json::from_str(&model_a).unwrap();
    assert_eq!(model_a["updates"], 1, "{model_a}");

    // Decision ids are 128 random bits, not counters.
    let (_, d2) = post(&base, "/v1/route", KEY_A, &request("secret-intent-of-acme")).await;
    let (id1, id2) = (
        d1["decision_id"].as_str().unwrap(),
        d2["decision_id"].as_str().unwrap(),
    );
    for id in [id1, id2] {
        assert!(id.starts_with("erd-") && id.len() == 36, "{id}");
        assert!(id[4..].bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
    }
    let differing = id1.bytes().zip(id2.bytes()).filter(|(a, b)| a != b).count();
    assert!(differing >= 16, "{id1} vs {id2}: too alike for random ids");

    // Tenant B posts feedback naming A's decisions: accepted as B's own (it is B's to
    // send), answered with nothing of A's, learnt into nothing, stamped with nothing.
    for d in [&d1, &d2] {
        let (status, body) = post(
            &base,
            "/v1/feedback",
            KEY_B,
            &feedback(&d["decision_id"], "b", false),
        )
        .await;
        assert_eq!(status, 202);
        assert_eq!(body, json!({"status": "accepted"}));
    }
    let (_, after_a) = get(&base, "/v1/model", KEY_A).await;
    assert_eq!(
        serde_json::from_str::<Value>(&after_a).unwrap(),
        model_a,
        "A's model changed"
    );
    let (_, model_b) = get(&base, "/v1/model", KEY_B).await;
    let model_b: Value = serde_json::from_str(&model_b).unwrap();
    assert_eq!(
        model_b["updates"], 0,
        "B learnt from A's decision: {model_b}"
    );
    assert!(!model_b.to_string().contains("secret"), "{model_b}");
    // On /v1/route B cannot name A; /metrics and /healthz carry no tenant data.
    let mut foreign = request("x");
    foreign["context"]["tenant"] = json!("acme");
    assert_eq!(post(&base, "/v1/route", KEY_B, &foreign).await.0, 403);
    let (_, metrics) = get(&base, "/metrics", KEY_B).await;
    assert!(
        !metrics.contains("secret") && !metrics.contains("acme"),
        "{metrics}"
    );
    assert!(
        metrics.contains("weft_router_model_learned_now_total 1"),
        "{metrics}"
    );

    // What was stored: B's feedback carries no context of A's.
    p.wait_for_count(
        "SELECT count() FROM weft_events WHERE kind = 'execution_feedback'",
        3,
        Duration::from_secs(60),
    )
    .await;
    let b_rows: Vec<String> = p
        .client()
        .query("SELECT payload FROM weft_events WHERE kind = 'execution_feedback' AND tenant = 'globex'")
        .fetch_all()
        .await
        .unwrap();
    assert_eq!(b_rows.len(), 2);
    for r in &b_rows {
        assert!(
            !r.contains("secret") && !r.contains("x_weft_context"),
            "{r}"
        );
    }
    let a_rows: Vec<String> = p
        .client()
        .query(
            "SELECT payload FROM weft_events WHERE kind = 'execution_feedback' AND tenant = 'acme'",
        )
        .fetch_all()
        .await
        .unwrap();
    assert_eq!(a_rows.len(), 1);
    assert!(
        a_rows[0].contains("\"x_weft_context\":\"secret-intent-of-acme\""),
        "{}",
        a_rows[0]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversize_input_is_refused_with_a_clear_4xx() {
    let p = Pipeline::new("router_limits");
    let (_router, base) = start(&p);
    let mib = "x".repeat(1 << 20);
    let many = |n: usize| -> Value {
        (0..n)
            .map(|i| json!({"candidate_id": format!("c{i}"), "candidate_type": "tool"}))
            .collect()
    };
    let cases: Vec<(&str, Value, u16, &str)> = vec![
        (
            "1 MiB candidate_id",
            json!({"context": {}, "candidates": [{"candidate_id": mib, "candidate_type": "tool"}]}),
            413,
            "body_too_large",
        ),
        (
            "1 MiB intent",
            json!({"context": {"intent": mib}, "candidates": many(2)}),
            413,
            "body_too_large",
        ),
        (
            "20k candidates",
            json!({"candidates": many(20_000)}),
            413,
            "body_too_large",
        ),
        (
            "40k candidates",
            json!({"candidates": many(40_000)}),
            413,
            "body_too_large",
        ),
        (
            "a candidate_id twice",
            json!({"candidates": [{"candidate_id": "a", "candidate_type": "tool"},
                                  {"candidate_id": "b", "candidate_type": "tool"},
                                  {"candidate_id": "a", "candidate_type": "tool"}]}),
            422,
            "duplicate_candidate",
        ),
        (
            "65 candidates",
            json!({"candidates": many(65)}),
            422,
            "over_limit",
        ),
        (
            "300-byte candidate_id",
            json!({"candidates": [{"candidate_id": "y".repeat(300), "candidate_type": "tool"}]}),
            422,
            "over_limit",
        ),
        (
            "300-byte intent",
            json!({"context": {"intent": "y".repeat(300)}, "candidates": many(2)}),
            422,
            "over_limit",
        ),
        (
            "17 KiB context",
            json!({"context": {"note": "y".repeat(17 * 1024)}, "candidates": many(2)}),
            422,
            "over_limit",
        ),
        // What the decision's schema refuses is the caller's mistake, never a 500.
        (
            "an empty candidate_id",
            json!({"candidates": [{"candidate_id": "", "candidate_type": "tool"}]}),
            400,
            "bad_request",
        ),
        (
            "compiled_flow on a tool",
            json!({"candidates": [{"candidate_id": "t", "candidate_type": "tool",
                                   "compiled_flow": {"flow_id": "f"}}]}),
            400,
            "bad_request",
        ),
        (
            "2 KiB request_id",
            json!({"context": {"request_id": "y".repeat(2048)}, "candidates": many(2)}),
            422,
            "over_limit",
        ),
        (
            "a compiled_flow the schema refuses (empty flow_id)",
            json!({"candidates": [{"candidate_id": "f", "candidate_type": "flow",
                                   "compiled_flow": {"flow_id": ""}}]}),
            400,
            "schema_invalid",
        ),
    ];
    for (what, body, status, code) in cases {
        let started = std::time::Instant::now();
        let (got, v) = post(&base, "/v1/route", KEY_A, &body).await;
        assert_eq!(got, status, "{what}: {v}");
        assert_eq!(v["error"]["code"], code, "{what}: {v}");
        assert!(
            !v["error"]["message"].as_str().unwrap().is_empty(),
            "{what}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{what}: {:?}",
            started.elapsed()
        );
    }
    let (got, v) = post(&base, "/v1/feedback", KEY_A, &json!({"decision_id": mib})).await;
    assert_eq!(
        (got, v["error"]["code"].as_str()),
        (413, Some("body_too_large")),
        "{v}"
    );
    let fb = json!({"decision_id": "y".repeat(300), "candidate_id": "a", "success": true,
                    "timestamp": weft_schemas::time::now_rfc3339()});
    let (got, v) = post(&base, "/v1/feedback", KEY_A, &fb).await;
    assert_eq!(
        (got, v["error"]["code"].as_str()),
        (422, Some("over_limit")),
        "{v}"
    );
    // A context key sent with feedback is held to the route's limit too.
    let fb = json!({"decision_id": "d", "candidate_id": "a", "success": true,
                    "timestamp": weft_schemas::time::now_rfc3339(),
                    "metadata": {"x_weft_context": "y".repeat(300)}});
    let (got, v) = post(&base, "/v1/feedback", KEY_A, &fb).await;
    assert_eq!(
        (got, v["error"]["code"].as_str()),
        (422, Some("over_limit")),
        "{v}"
    );
    // A constraint weft cannot apply is refused, naming it, rather than ignored (the
    // request would run unconstrained); extension keys pass.
    for constraints in [
        json!({"max_latency_ms": "1000"}),
        json!({"max_latncy_ms": 1000}),
        json!({"max_cost": -1}),
        json!({"min_quality": null}),
    ] {
        let body = json!({"candidates": many(2), "constraints": constraints});
        let (got, v) = post(&base, "/v1/route", KEY_A, &body).await;
        assert_eq!(
            (got, v["error"]["code"].as_str()),
            (400, Some("bad_request")),
            "{constraints}: {v}"
        );
        let key = constraints.as_object().unwrap().keys().next().unwrap();
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains(&format!("constraints.{key}")), "{message}");
    }
    let body = json!({"candidates": many(2),
                      "constraints": {"max_latency_ms": 1000, "x_acme_region": "eu"}});
    let (got, v) = post(&base, "/v1/route", KEY_A, &body).await;
    assert_eq!(got, 200, "{v}");
    // Within the limits the router still answers.
    let (got, v) = post(&base, "/v1/route", KEY_A, &json!({"candidates": many(64)})).await;
    assert_eq!(got, 200, "{v}");
}

/// One reading of a payload: feedback (and a route request) with a key given twice is
/// refused with a 4xx naming the duplicate, and nothing of it is learnt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_key_is_refused() {
    let p = Pipeline::new("it_router_dupkey");
    let (_router, base) = start(&p);
    let (status, decided) = post(&base, "/v1/route", KEY_A, &request("summarize")).await;
    assert_eq!(status, 200, "{decided}");
    let id = decided["decision_id"].as_str().unwrap().to_owned();
    let body = format!(
        r#"{{"decision_id":"{id}","candidate_id":"a","candidate_id":"b","success":true,"timestamp":"{}"}}"#,
        weft_schemas::time::now_rfc3339()
    );
    for (path, body) in [
        ("/v1/feedback", body),
        (
            "/v1/route",
            r#"{"context":{"intent":"x","intent":"y"},"candidates":[{"candidate_id":"a","candidate_type":"tool"}]}"#
                .to_owned(),
        ),
    ] {
        let r = reqwest::Client::new()
            .post(format!("{base}{path}"))
            .bearer_auth(KEY_A)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        assert!((400..500).contains(&status), "{path}: {status} {text}");
        assert!(text.contains("duplicate key"), "{path}: {text}");
    }
}

/// Past `--max-concurrent-requests`, a `/v1` request is answered 503 `busy` with
/// `Retry-After` before its body is read, so slow or many requests cannot take the router's
/// memory; `/metrics` is still served, and the slot comes back when the held request ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_over_the_concurrency_limit_is_refused_busy() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let p = Pipeline::new("router_busy");
    let (_router, base) = start_with(&p, &["--max-concurrent-requests", "1"]);
    let addr = base.trim_start_matches("http://").to_owned();
    // A request whose head declares a body that never comes holds the only slot.
    let hold = || async {
        let mut held = tokio::net::TcpStream::connect(&addr).await.unwrap();
        held.write_all(
            format!(
                "POST /v1/route HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {KEY_A}\r\n\
                 content-type: application/json\r\ncontent-length: 100000\r\n\r\n{{"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
        held
    };
    let client = reqwest::Client::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut held = hold().await;
    let (held, refused) = loop {
        let r = client
            .post(format!("{base}/v1/route"))
            .bearer_auth(KEY_A)
            .json(&request("busy"))
            .send()
            .await
            .unwrap();
        if r.status().as_u16() == 503 {
            break (held, r);
        }
        assert_eq!(r.status().as_u16(), 200);
        assert!(
            std::time::Instant::now() < deadline,
            "never refused while the slot is held"
        );
        // Served: the held head had not reached the router yet, or it came while this
        // request was in hand, and then it was the one answered busy. The two connections
        // race to the router's tasks (seen once in CI, on a loaded machine); only in that
        // second case is there an answer to read, and the slot is taken again.
        let mut answer = [0u8; 12];
        let read = tokio::time::timeout(Duration::from_millis(100), held.read(&mut answer)).await;
        if let Ok(n) = read {
            let got = &answer[..n.unwrap()];
            assert!(
                !got.is_empty() && b"HTTP/1.1 503".starts_with(got),
                "the held request's answer: {:?}",
                String::from_utf8_lossy(got)
            );
            held = hold().await;
        }
    };
    assert_eq!(refused.headers()["retry-after"], "1");
    let v: Value = refused.json().await.unwrap();
    assert_eq!(v["error"]["code"], "busy", "{v}");
    let (status, _) = get(&base, "/metrics", KEY_A).await;
    assert_eq!(status, 200, "/metrics is not counted");
    // The slot comes back when the held request ends.
    drop(held);
    let served = common::wait_for_async(Duration::from_secs(30), || async {
        let (status, _) = post(&base, "/v1/route", KEY_A, &request("busy")).await;
        (status == 200).then_some(())
    })
    .await;
    assert!(served.is_some(), "the slot was not freed");
}

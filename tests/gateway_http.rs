//! The HTTP gateway against the real local broker: accepted items arrive byte-identical,
//! every kind of bad input gets a clear 4xx or per-item reason, and the good items of a
//! partly bad request are intact in Kafka.

mod common;
mod publish_support;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::Duration;

use publish_support::{config, consume, count, trace_payload};
use serde_json::{json, Value};
use weft_http::ApiKeys;
use weft_producers::gateway::{self, Gateway};
use weft_producers::Publisher;
use weft_schemas::Kind;
use weft_sim::{generate, SimConfig};

const KEY_ACME: &str = "acme-key-0123456789abcdef";
const KEY_GLOBEX: &str = "globex-key-0123456789abcdef";

/// Kills the spawned gateway if the test fails before stopping it.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// An in-process gateway on an ephemeral port; returns its base URL and the publisher.
async fn start(prefix: &str, spool: &std::path::Path, max_body: usize) -> (String, Publisher) {
    let p = Publisher::connect(config(prefix, spool)).await.unwrap();
    p.ensure_topics().await.unwrap();
    let mut keys = ApiKeys::default();
    keys.add_list(&format!("{KEY_ACME}=acme,{KEY_GLOBEX}=globex"))
        .unwrap();
    let listener = weft_http::bind("127.0.0.1:0".parse().unwrap(), false)
        .await
        .unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let gw = Gateway::new(p.clone(), keys, max_body);
    tokio::spawn(gateway::serve(listener, gw, std::future::pending()));
    (url, p)
}

async fn post(url: &str, key: Option<&str>, ct: &str, body: impl Into<String>) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .post(format!("{url}/v1/events"))
        .header("content-type", ct)
        .body(body.into());
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    let v = serde_json::from_str(&text).unwrap_or_else(|_| panic!("non-JSON answer: {text}"));
    (status, v)
}

fn item(i: usize, request: &str) -> Value {
    json!({"kind": "trace_event", "request_id": request,
           "payload": serde_json::from_str::<Value>(&trace_payload("gw", i)).unwrap()})
}

fn codes(v: &Value) -> Vec<String> {
    v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| match r["status"].as_str().unwrap() {
            "accepted" => "accepted".to_owned(),
            _ => r["error"]["code"].as_str().unwrap().to_owned(),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partial_batches_keep_good_items_and_name_each_bad_one() {
    let spool = tempfile::tempdir().unwrap();
    let prefix = common::unique("t") + ".";
    let (url, p) = start(&prefix, spool.path(), 64 << 10).await;
    let good_a = trace_payload("mix", 1);
    let good_b = trace_payload("mix", 2);
    let lines = [
        format!(r#"{{"kind":"trace_event","request_id":"r-mix","payload":{good_a}}}"#),
        r#"{"kind":"trace_evnt","payload":{"event_id":"x"}}"#.to_owned(),
        r#"{"kind":"trace_event","payload":{"event_id":"x","event_type":"bogus","timestamp":"2026-03-08T06:00:05Z"}}"#.to_owned(),
        format!(r#"{{"kind":"trace_event","tenant":"globex","payload":{}}}"#, trace_payload("mix", 3)),
        r#"{"kind":"trace_event", "payload": {oops"#.to_owned(),
        r#"{"kind":"frame","requestId":"r","payload":{}}"#.to_owned(),
        format!(r#"{{"kind":"trace_event","request_id":"r-mix","tenant":"acme","payload":{good_b}}}"#),
    ];
    let (status, v) = post(
        &url,
        Some(KEY_ACME),
        "application/x-ndjson",
        lines.join("\n"),
    )
    .await;
    assert_eq!(status, 207, "{v}");
    assert_eq!(
        codes(&v),
        [
            "accepted",
            "unknown_kind",
            "schema_invalid",
            "tenant_forbidden",
            "malformed_json",
            "invalid_envelope",
            "accepted"
        ],
        "{v:#}"
    );
    assert_eq!(v["accepted"], 2);
    assert_eq!(v["results"][0]["id"], "te-mix-1");
    for r in v["results"].as_array().unwrap() {
        if r["status"] == "rejected" {
            assert!(
                r["error"]["message"].as_str().unwrap().len() > 10,
                "a reason: {r}"
            );
        }
    }
    assert!(v["results"][1]["error"]["message"]
        .as_str()
        .unwrap()
        .contains("trace_evnt"));

    // Exactly the two accepted items are in Kafka, byte-identical and in order.
    let topics = p.topics().event_topics();
    let recs = consume(&topics, 2, Duration::from_secs(30));
    assert_eq!(recs.len(), 2);
    assert_eq!(recs[0].value, good_a.as_bytes());
    assert_eq!(recs[1].value, good_b.as_bytes());
    for r in &recs {
        assert_eq!(r.envelope().tenant, "acme", "the key's tenant");
        assert_eq!(r.key.as_deref(), Some(&b"r-mix"[..]));
    }
    assert_eq!(count(&topics), 2, "nothing rejected reached Kafka");

    let m = reqwest::get(format!("{url}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for needle in [
        "weft_gateway_events_accepted_total 2",
        "weft_events_rejected_total{reason=\"unknown_kind\"} 1",
        "weft_events_rejected_total{reason=\"tenant_forbidden\"} 1",
        "weft_publisher_events_published_total 2",
        "weft_publisher_publish_latency_seconds_count 2",
    ] {
        assert!(m.contains(needle), "missing {needle} in\n{m}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_level_errors_are_clear_4xx() {
    let spool = tempfile::tempdir().unwrap();
    let prefix = common::unique("t") + ".";
    let (url, p) = start(&prefix, spool.path(), 4096).await;
    let one = json!([item(1, "r")]).to_string();

    // Missing and wrong keys.
    let (s, v) = post(&url, None, "application/json", one.clone()).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (401, Some("missing_api_key"))
    );
    let (s, v) = post(
        &url,
        Some("not-a-key-but-long-enough"),
        "application/json",
        one.clone(),
    )
    .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (401, Some("invalid_api_key"))
    );

    // Malformed JSON body, with the parser's reason.
    let (s, v) = post(&url, Some(KEY_ACME), "application/json", "[{\"kind\":").await;
    assert_eq!(s, 400);
    assert_eq!(v["error"]["code"], "malformed_json");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("line 1"),
        "{v}"
    );

    // Oversize body.
    let big: Vec<Value> = (0..40).map(|i| item(i, "r")).collect();
    let (s, v) = post(
        &url,
        Some(KEY_ACME),
        "application/json",
        json!(big).to_string(),
    )
    .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (413, Some("body_too_large")),
        "{v}"
    );

    // Every item another tenant's: 403; every item invalid: 400 with per-item reasons.
    let (s, v) = post(&url, Some(KEY_GLOBEX), "application/json", {
        let mut it = item(2, "r");
        it["tenant"] = "acme".into();
        json!([it]).to_string()
    })
    .await;
    assert_eq!(s, 403, "{v}");
    assert_eq!(codes(&v), ["tenant_forbidden"]);
    let (s, v) = post(
        &url,
        Some(KEY_ACME),
        "application/json",
        r#"[{"kind":"handle","payload":{}}, 42]"#,
    )
    .await;
    assert_eq!(s, 400, "{v}");
    assert_eq!(codes(&v), ["schema_invalid", "invalid_envelope"]);

    // A single object is fine too; nothing of the refused requests reached Kafka.
    let (s, v) = post(
        &url,
        Some(KEY_ACME),
        "application/json",
        item(3, "r").to_string(),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let topics = p.topics().event_topics();
    assert_eq!(consume(&topics, 1, Duration::from_secs(30)).len(), 1);
    assert_eq!(count(&topics), 1);

    let h: Value = reqwest::get(format!("{url}/healthz"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(h["status"], "ok");
}

/// `/readyz` is 503 `spool_full` while the spool has less room than one largest request (a
/// load balancer then sends events elsewhere), and `/healthz`, the liveness probe, stays 200:
/// a restart would not empty the spool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_the_room_left_in_the_spool() {
    let spool = tempfile::tempdir().unwrap();
    let prefix = common::unique("t") + ".";
    let probe = |max_body: usize, spool_max: u64| {
        let (prefix, spool) = (prefix.clone(), spool.path().to_owned());
        async move {
            let mut cfg = config(&prefix, &spool);
            cfg.spool_max_bytes = spool_max;
            cfg.spool_segment_bytes = spool_max.min(1 << 20);
            let p = Publisher::connect(cfg).await.unwrap();
            let listener = weft_http::bind("127.0.0.1:0".parse().unwrap(), false)
                .await
                .unwrap();
            let url = format!("http://{}", listener.local_addr().unwrap());
            let gw = Gateway::new(p.clone(), ApiKeys::default(), max_body).with_max_items(16);
            let server = tokio::spawn(gateway::serve(listener, gw, std::future::pending()));
            let get = |path: &'static str| {
                let url = format!("{url}{path}");
                async move {
                    let r = reqwest::get(url).await.unwrap();
                    (r.status().as_u16(), r.json::<Value>().await.unwrap())
                }
            };
            let answers = (get("/readyz").await, get("/healthz").await);
            server.abort();
            p.close(Duration::from_secs(5));
            answers
        }
    };
    let ((ready, body), (live, _)) = probe(4096, 1 << 20).await;
    assert_eq!((ready, live), (200, 200), "{body}");
    assert_eq!(body["spool_max_bytes"], 1 << 20);
    let ((ready, body), (live, health)) = probe(4096, 1000).await;
    assert_eq!(ready, 503, "{body}");
    assert_eq!(body["status"], "spool_full");
    assert_eq!(live, 200, "{health}");
}

/// The `weft gateway` binary end to end: keys from WEFT_GATEWAY_KEYS, realistic traffic of
/// every kind as a JSON array, consumed back byte-identical.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weft_gateway_binary_round_trips_every_kind() {
    let spool = tempfile::tempdir().unwrap();
    let prefix = common::unique("t") + ".";
    let mut child = KillOnDrop(
        common::weft()
            .args([
                "gateway",
                "--listen",
                "127.0.0.1:0",
                "--topic-prefix",
                &prefix,
            ])
            .arg("--spool-dir")
            .arg(spool.path())
            .env("WEFT_GATEWAY_KEYS", format!("{KEY_ACME}=acme"))
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    BufReader::new(child.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();

    let (envs, _) = generate(&SimConfig {
        seed: 11,
        flows: 6,
        no_request_id: 0.2,
        ..SimConfig::default()
    })
    .unwrap();
    let items: Vec<String> = envs
        .iter()
        .map(|e| {
            let rid = e
                .request_id
                .as_ref()
                .map(|r| format!(r#""request_id":"{r}","#))
                .unwrap_or_default();
            format!(
                r#"{{"kind":"{}",{rid}"payload":{}}}"#,
                e.kind,
                e.payload.get()
            )
        })
        .collect();
    let body = format!("[{}]", items.join(",\n"));
    let (s, v) = post(&url, Some(KEY_ACME), "application/json", body).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["accepted"], envs.len());

    let topics: Vec<String> = Kind::ALL
        .iter()
        .map(|k| format!("{prefix}{}", k.topic_suffix()))
        .collect();
    let recs = consume(&topics, envs.len(), Duration::from_secs(60));
    assert_eq!(recs.len(), envs.len());
    let mut want: std::collections::HashMap<&str, &weft_schemas::Envelope> =
        envs.iter().map(|e| (e.payload.get(), e)).collect();
    for r in &recs {
        let text = std::str::from_utf8(&r.value).unwrap();
        let sent = want
            .remove(text)
            .expect("value is byte-identical to a submitted payload");
        let back = r.envelope();
        assert_eq!(back.kind, sent.kind);
        assert_eq!(back.request_id, sent.request_id);
        assert_eq!(back.tenant, "acme");
    }
    assert!(want.is_empty());

    // SIGTERM: graceful shutdown, exit 0.
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(child.0.id() as i32, libc::SIGTERM) };
    let status = common::wait_for(Duration::from_secs(30), || child.0.try_wait().unwrap())
        .expect("gateway exits after SIGTERM");
    assert!(status.success(), "{status:?}");
}

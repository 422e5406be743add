//! Tenancy on the non-router routes, written as the attack: tenant B (globex) names tenant A's
//! (acme's) narrative, handle, token and decision ids on every route that takes an id --
//! the ingest narrative API, the audit API (timeline, bundle, search) -- and gets exactly what
//! an unknown id gets, while A reading the same id gets its narrative (so the 404 is tenancy,
//! not a bad id). Through the gateway, B then writes an event naming A's request id and
//! handle id: A's narrative does not change, and B's event stays B's.

mod common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::Duration;

use common::pipeline::{free_port, truth_membership, wait_for_port, Pipeline, Proc};
use reqwest::StatusCode;
use serde_json::Value;
use weft_schemas::Kind;

const ACME: &str = "acme-tenancy-key-0123456789";
const GLOBEX: &str = "globex-tenancy-key-0123456789";

fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// (label, id) of acme's first request id and first handle, token and decision ids.
fn acme_ids(file: &std::path::Path) -> Vec<(&'static str, String)> {
    let mut out: Vec<(&'static str, String)> = Vec::new();
    for line in std::fs::read_to_string(file).unwrap().lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        let kind: Kind = v["kind"].as_str().unwrap().parse().unwrap();
        let label = match kind {
            Kind::Handle => "handle",
            Kind::CapabilityToken => "token",
            Kind::PolicyDecision => "decision",
            _ => continue,
        };
        if out.iter().any(|(l, _)| *l == label) {
            continue;
        }
        let field = kind.id_field().unwrap();
        out.push((label, v["payload"][field].as_str().unwrap().to_owned()));
        if v["request_id"].is_string() && !out.iter().any(|(l, _)| *l == "request") {
            out.push(("request", v["request_id"].as_str().unwrap().to_owned()));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_b_naming_tenant_a_ids_sees_nothing_and_changes_nothing() {
    let p = Pipeline::new("it_tenancy");
    let truth = p.simulate(&[
        "--flows", "6", "--seed", "77", "--tenant", "acme", "--clean",
    ]);
    let file = p.path("events.jsonl");
    let ids = acme_ids(&file);
    let labels: Vec<&str> = ids.iter().map(|(l, _)| *l).collect();
    for want in ["request", "handle", "token", "decision"] {
        assert!(
            labels.contains(&want),
            "the fixture has no {want} id: {labels:?}"
        );
    }
    let ingest_addr = format!("127.0.0.1:{}", free_port());
    let keys = format!("{ACME}=acme,{GLOBEX}=globex");
    let _ingest = p.ingest_with(Some(&ingest_addr), &[("WEFT_API_KEYS", &keys)]);
    p.publish(&file);
    p.wait_for_facts(truth.totals.distinct_events, Duration::from_secs(120))
        .await;
    // Every narrative complete before the reads (a request's events can span two passes,
    // and the first already answers 200).
    p.wait_for_narratives(&truth_membership(&truth), Duration::from_secs(120))
        .await;
    let audit_addr = format!("127.0.0.1:{}", free_port());
    let _audit = Proc(
        p.weft()
            .args(["audit", "serve", "--listen", &audit_addr])
            .env("WEFT_AUDIT_KEYS", &keys)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(p.path("audit.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    assert!(wait_for_port(&ingest_addr, Duration::from_secs(10)));
    assert!(wait_for_port(&audit_addr, Duration::from_secs(20)));
    let http = reqwest::Client::new();
    let get = |url: String, key: &'static str| {
        let r = http.get(url).bearer_auth(key);
        async move {
            let r = r.send().await.unwrap();
            let status = r.status();
            (status, r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };

    // Every id resolves for its owner (poll until the projector has placed it) ...
    let narrative = |id: &str| format!("http://{ingest_addr}/v1/narratives/{}", enc(id));
    for (label, id) in &ids {
        let owner = common::wait_for(Duration::from_secs(60), || {
            let (s, v) = futures_block(get(narrative(id), ACME));
            (s == StatusCode::OK).then_some(v)
        })
        .unwrap_or_else(|| panic!("acme cannot read its own {label} id {id}"));
        assert!(!owner["entries"].as_array().unwrap().is_empty());
        // ... and for the other tenant it is exactly an unknown id, on every route.
        let (s, v) = get(narrative(id), GLOBEX).await;
        assert_eq!(
            s,
            StatusCode::NOT_FOUND,
            "narrative API, acme's {label} id: {v}"
        );
        assert_eq!(v["error"]["code"], "not_found");
        let (unknown_s, unknown_v) = get(narrative("no-such-id-77"), GLOBEX).await;
        assert_eq!(
            (s, &v),
            (unknown_s, &unknown_v),
            "indistinguishable from unknown"
        );
        for route in ["timeline", "bundle"] {
            let url = format!("http://{audit_addr}/v1/audit/{route}/{}", enc(id));
            let (s, v) = get(url.clone(), GLOBEX).await;
            assert_eq!(
                s,
                StatusCode::NOT_FOUND,
                "audit {route}, acme's {label} id: {v}"
            );
            assert_eq!(v["error"]["code"], "not_found");
            if *label == "request" {
                assert_eq!(
                    get(url, ACME).await.0,
                    StatusCode::OK,
                    "audit {route} for acme"
                );
            }
        }
    }
    let range = "from=2026-01-01T00:00:00Z&to=2030-01-01T00:00:00Z";
    for (label, id) in &ids {
        let param = match *label {
            "request" => "request",
            "token" => "token",
            "decision" => "decision",
            _ => continue,
        };
        let url = format!(
            "http://{audit_addr}/v1/audit/search?{range}&{param}={}",
            enc(id)
        );
        let (s, mine) = get(url.clone(), ACME).await;
        assert_eq!(s, StatusCode::OK);
        let (s, theirs) = get(url, GLOBEX).await;
        assert_eq!(s, StatusCode::OK);
        if *label != "decision" {
            assert!(
                !mine["hits"].as_array().unwrap().is_empty(),
                "acme finds its {label}"
            );
        }
        assert_eq!(
            theirs["hits"],
            serde_json::json!([]),
            "globex searching acme's {label}"
        );
    }

    // The gateway: globex writes a frame naming acme's request id and handle id.
    let (req_id, handle_id) = (
        ids.iter().find(|(l, _)| *l == "request").unwrap().1.clone(),
        ids.iter().find(|(l, _)| *l == "handle").unwrap().1.clone(),
    );
    let before = common::wait_for(Duration::from_secs(30), || {
        let (s, v) = futures_block(get(narrative(&req_id), ACME));
        (s == StatusCode::OK).then_some(v)
    })
    .unwrap();
    let mut gw = Proc(
        p.weft()
            .args(["gateway", "--listen", "127.0.0.1:0", "--spool-dir"])
            .arg(p.path("gw-spool"))
            .env("WEFT_GATEWAY_KEYS", format!("{GLOBEX}=globex"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    BufReader::new(gw.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let gw_url = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap()
        .to_owned();
    let frame = format!(
        r#"{{"kind":"frame","request_id":"{req_id}","payload":{{"frame_id":"fr-globex-intruder","capability_id":"org.x.read","summary":"s","structured_data":{{}},"handle_refs":["{handle_id}"],"created_at":"2026-03-08T06:00:00Z"}}}}"#
    );
    let r = http
        .post(format!("{gw_url}/v1/events"))
        .bearer_auth(GLOBEX)
        .body(frame)
        .send()
        .await
        .unwrap();
    let status = r.status();
    let body: Value = r.json().await.unwrap();
    assert_eq!(status, StatusCode::OK, "{body}");
    p.wait_for_facts(truth.totals.distinct_events + 1, Duration::from_secs(60))
        .await;
    // B's event is B's: its narrative has it alone; A's narrative is unchanged.
    let theirs = common::wait_for(Duration::from_secs(60), || {
        let (s, v) = futures_block(get(narrative("fr-globex-intruder"), GLOBEX));
        (s == StatusCode::OK).then_some(v)
    })
    .expect("globex reads its own frame's narrative");
    assert_eq!(theirs["entries"].as_array().unwrap().len(), 1, "{theirs}");
    let (s, _) = get(narrative("fr-globex-intruder"), ACME).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, after) = get(narrative(&req_id), ACME).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        after["entries"], before["entries"],
        "acme's narrative changed"
    );
    assert!(!after.to_string().contains("fr-globex-intruder"));
}

/// Run a future to completion from inside a polling closure (the test's runtime has two
/// worker threads, so blocking one of them briefly is fine).
fn futures_block<F: std::future::Future>(f: F) -> F::Output {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(f))
}

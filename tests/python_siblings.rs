//! The real Weaver siblings (weaver-kernel 0.12.0, chainweaver 0.14.1 and weaver-contracts
//! 0.7.0 from PyPI) publishing through `weft_publish` (producers/python) to `weft gateway`,
//! ingested into ClickHouse on the local stack: the narratives must match what the packages
//! themselves recorded, step for step, and a 30 s gateway outage must lose nothing.
//!
//! The venv is made by `deploy/local/python_siblings.sh` (idempotent). The Python scenario
//! (`producers/python/scenarios/weaver_stack.py`) writes a manifest from ChainWeaver's own
//! ExecutionResult and the kernel's own TraceStore; this file derives every expectation from
//! that manifest and reads the narratives back with `weft narrative --format json` (the same
//! lookup as `GET /v1/narratives/{id}`).

mod common;

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::pipeline::{free_port, Pipeline, Proc};
use serde_json::Value;

const KEY: &str = "acme-siblings-key-0123456789abcdef";
const TENANT: &str = "acme";

/// The sibling venv's python (installs it on first use).
fn siblings_python() -> PathBuf {
    let out = Command::new("bash")
        .arg(common::repo_root().join("deploy/local/python_siblings.sh"))
        .output()
        .expect("run deploy/local/python_siblings.sh");
    assert!(
        out.status.success(),
        "python_siblings.sh failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(Path::new(&path).exists(), "no python at {path:?}");
    PathBuf::from(path)
}

fn scenario() -> PathBuf {
    common::repo_root().join("producers/python/scenarios/weaver_stack.py")
}

/// `weft gateway` for this pipeline on `addr`; returns it and its base URL.
fn gateway(p: &Pipeline, addr: &str) -> (Proc, String) {
    let mut child = p
        .weft()
        .args(["gateway", "--listen", addr, "--topic-prefix", &p.prefix])
        .arg("--spool-dir")
        .arg(p.path("gateway-spool"))
        .env("WEFT_GATEWAY_KEYS", format!("{KEY}={TENANT}"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first gateway line {line:?}"))
        .to_owned();
    (Proc(child), url)
}

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// How many events the adapters publish for what the manifest says happened: per flow its
/// start and end plus a start and an end per step (+ the routing decision and feedback when
/// routed); per kernel action a PolicyDecision and a TraceEvent, plus for an invocation its
/// CapabilityToken, Frame and Handle and for an expansion its Frame.
fn expected_members(flow_or_request: &Value) -> usize {
    let mut n = 0;
    if let Some(steps) = flow_or_request.get("steps").and_then(Value::as_array) {
        n += 2 + 2 * steps.len();
        if !flow_or_request["routing_decision_id"].is_null() {
            n += 2;
        }
    }
    for k in flow_or_request["kernel"].as_array().unwrap() {
        n += match k["event_type"].as_str().unwrap() {
            // decision, authorization, execution, frame, handle and token
            "invoke" => 6,
            "expand" => 3,
            "deny" => 2,
            other => panic!("unexpected kernel event {other}"),
        };
    }
    n
}

/// Every request in the manifest: (request id, its manifest entry).
fn requests(m: &Value) -> Vec<(String, &Value)> {
    let flows = m["flows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["trace_id"].as_str().unwrap().to_owned(), f));
    let direct = m["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["request_id"].as_str().unwrap().to_owned(), r));
    flows.chain(direct).collect()
}

/// `weft narrative ID --format json`, polled until it has `members` entries.
fn narrative(p: &Pipeline, id: &str, members: usize) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = p
            .weft()
            .args(["narrative", id, "--tenant", TENANT, "--format", "json"])
            .output()
            .unwrap();
        let last = if out.status.success() {
            let v: Value = serde_json::from_slice(&out.stdout).unwrap();
            let n = v["entries"].as_array().map_or(0, Vec::len);
            if n == members {
                return v;
            }
            format!("{n} entries: {v:#}")
        } else {
            String::from_utf8_lossy(&out.stderr).into_owned()
        };
        assert!(
            Instant::now() < deadline,
            "narrative {id}: want {members} entries, last answer {last}\ningest log:\n{}",
            p.ingest_log()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// Checks of one narrative against the manifest entry of its request.
struct View<'a> {
    n: &'a Value,
    by_id: HashMap<(&'a str, &'a str), &'a Value>,
}

impl<'a> View<'a> {
    fn new(n: &'a Value) -> Self {
        let by_id = n["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| ((e["kind"].as_str().unwrap(), e["id"].as_str().unwrap()), e))
            .collect();
        Self { n, by_id }
    }

    fn get(&self, kind: &str, id: &str) -> &'a Value {
        let e = self
            .by_id
            .get(&(kind, id))
            .unwrap_or_else(|| panic!("no {kind} {id} in narrative {:#}", self.n));
        &e["payload"]
    }

    fn has_link(&self, from: (&str, &str), via: &str, to: (&str, &str)) -> bool {
        self.n["links"].as_array().unwrap().iter().any(|l| {
            l["from"]["kind"] == from.0
                && l["from"]["id"] == from.1
                && l["via"] == via
                && l["to"]["kind"] == to.0
                && l["to"]["id"] == to.1
        })
    }

    fn trace_events(&self) -> Vec<&'a Value> {
        self.n["entries"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["kind"] == "trace_event")
            .collect()
    }

    /// One kernel action as the kernel recorded it: TraceEvent with its decision, frame,
    /// handle and token, chained by links.
    fn check_kernel_action(&self, k: &Value, flow: Option<(&str, u64)>) {
        let aid = k["action_id"].as_str().unwrap();
        let te = self.get("trace_event", aid);
        let kind = k["event_type"].as_str().unwrap();
        let mapped = match kind {
            "invoke" => "capability_executed",
            "expand" => "handle_resolved",
            _ => "capability_denied",
        };
        assert_eq!(te["event_type"], mapped, "{te}");
        assert_eq!(te["capability_id"], k["capability_id"]);
        let did = te["decision_id"]
            .as_str()
            .expect("decision_id set on the TraceEvent");
        let pd = self.get("policy_decision", did);
        assert_eq!(
            pd["decision"],
            if kind == "deny" { "deny" } else { "allow" },
            "{pd}"
        );
        assert_eq!(pd["capability_id"], k["capability_id"]);
        assert!(self.has_link(
            ("trace_event", aid),
            "decision_id",
            ("policy_decision", did)
        ));
        if let Some((flow_id, step)) = flow {
            assert_eq!(
                te["metadata"]["flow_id"], flow_id,
                "kernel event inside the flow step"
            );
            assert_eq!(te["metadata"]["step_index"], step);
        }
        match kind {
            "deny" => {
                assert!(
                    te.get("frame_id").is_none_or(Value::is_null),
                    "a denial has no frame"
                );
                assert_eq!(te["outcome"], "failure");
                assert!(pd["reason"].as_str().unwrap().contains("writer"), "{pd}");
            }
            _ => {
                let frame = self.get("frame", aid);
                assert!(self.has_link(("trace_event", aid), "frame_id", ("frame", aid)));
                let hid = k["handle_id"].as_str().unwrap();
                assert!(frame["handle_refs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|h| h == hid));
                assert!(self.has_link(("frame", aid), "handle_refs", ("handle", hid)));
                if kind == "invoke" {
                    // The adapter records the authorization before the execution (I-02).
                    let auth_id = format!("{aid}:authorized");
                    let auth = self.get("trace_event", &auth_id);
                    assert_eq!(auth["event_type"], "capability_authorized", "{auth}");
                    assert_eq!(auth["decision_id"], did);
                    assert!(self.has_link(
                        ("trace_event", &auth_id),
                        "decision_id",
                        ("policy_decision", did)
                    ));
                    self.get("handle", hid);
                    let tid = k["token_id"].as_str().unwrap();
                    assert_eq!(pd["token_id"], tid);
                    let tok = self.get("capability_token", tid);
                    assert_eq!(tok["scope"][0], k["capability_id"]);
                    assert!(self.has_link(
                        ("policy_decision", did),
                        "token_id",
                        ("capability_token", tid)
                    ));
                }
            }
        }
    }

    /// The flow's lifecycle, step for step and in order, with the kernel events inside.
    fn check_flow(&self, f: &Value) {
        let tid = f["trace_id"].as_str().unwrap();
        let flow_id = format!("chainweaver:{tid}");
        let success = f["success"].as_bool().unwrap();
        // The expected sequence of TraceEvents: (event_type, step_index, outcome).
        let steps = f["steps"].as_array().unwrap();
        let kernel_step = steps.last().unwrap()["step_index"].as_u64().unwrap();
        let mut want: Vec<(String, Option<u64>, Option<&str>)> =
            vec![("flow_started".into(), None, None)];
        for s in steps {
            let i = s["step_index"].as_u64().unwrap();
            want.push(("flow_step_started".into(), Some(i), None));
            if i == kernel_step {
                for k in f["kernel"].as_array().unwrap() {
                    let aid = k["action_id"].as_str().unwrap();
                    if k["event_type"] == "invoke" {
                        want.push((format!("kernel:{aid}:authorized"), None, None));
                    }
                    want.push((format!("kernel:{aid}"), None, None));
                }
            }
            let outcome = if s["success"].as_bool().unwrap() {
                "success"
            } else {
                "failure"
            };
            want.push(("flow_step_completed".into(), Some(i), Some(outcome)));
        }
        want.push((
            if success {
                "flow_completed"
            } else {
                "flow_failed"
            }
            .into(),
            None,
            Some(if success { "success" } else { "failure" }),
        ));
        let got: Vec<(String, Option<u64>, Option<&str>)> = self
            .trace_events()
            .iter()
            .map(|e| {
                let p = &e["payload"];
                let t = p["event_type"].as_str().unwrap();
                if t.starts_with("flow_") {
                    assert_eq!(p["metadata"]["flow_id"], flow_id.as_str(), "{p}");
                    (
                        t.to_owned(),
                        p["metadata"]["step_index"].as_u64(),
                        p["outcome"].as_str(),
                    )
                } else {
                    (
                        format!("kernel:{}", p["event_id"].as_str().unwrap()),
                        None,
                        None,
                    )
                }
            })
            .collect();
        assert_eq!(
            got, want,
            "flow {tid}: the narrative's TraceEvents, in timestamp order"
        );
        for (s, e) in steps.iter().zip(
            self.trace_events()
                .iter()
                .filter(|e| e["payload"]["event_type"] == "flow_step_completed"),
        ) {
            assert_eq!(e["payload"]["metadata"]["tool_name"], s["tool_name"]);
        }
        for k in f["kernel"].as_array().unwrap() {
            self.check_kernel_action(k, Some((&flow_id, kernel_step)));
        }
        if let Some(did) = f["routing_decision_id"].as_str() {
            self.get("execution_routing_decision", did);
            let fb: Vec<&Value> = self.n["entries"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|e| e["kind"] == "execution_feedback")
                .collect();
            assert_eq!(fb.len(), 1);
            let p = &fb[0]["payload"];
            assert_eq!(p["decision_id"], did);
            assert_eq!(p["success"], success);
            assert_eq!(p["trace_ref"], format!("chainweaver:trace_id:{tid}"));
            assert!(p["latency_ms"].as_u64().is_some(), "{p}");
            let fid = fb[0]["id"].as_str().unwrap();
            assert!(self.has_link(
                ("execution_feedback", fid),
                "feedback_decision_id",
                ("execution_routing_decision", did)
            ));
        }
    }
}

/// `weft validate --kind trace_bundle` of `bundle`, written to `file` (the I-02 check: every
/// PolicyDecision has its TraceEvent).
fn validate_bundle(p: &Pipeline, file: &Path, bundle: &Value) -> std::process::Output {
    std::fs::write(file, bundle.to_string()).unwrap();
    p.weft()
        .args(["validate", "--kind", "trace_bundle"])
        .arg(file)
        .output()
        .unwrap()
}

fn run_scenario(py: &Path, url: &str, dir: &Path, extra: &[&str]) -> Command {
    let mut c = Command::new(py);
    c.arg(scenario())
        .args(["--url", url, "--key", KEY, "--buffer-dir"])
        .arg(dir.join("py-buffer"))
        .arg("--manifest")
        .arg(dir.join("manifest.json"))
        .args(extra)
        .env("PYTHONUNBUFFERED", "1")
        .env("WEAVER_KERNEL_SECRET", "weft-test-secret-0123456789abcdef");
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weaver_kernel_and_chainweaver_narratives_match_what_they_did() {
    let py = siblings_python();
    let p = Pipeline::new("sib");
    let (_gw, url) = gateway(&p, "127.0.0.1:0");
    let _ingest = p.ingest(None);

    let out = run_scenario(&py, &url, &p.dir, &["--rounds", "2"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "scenario failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let m = read_json(&p.path("manifest.json"));
    assert_eq!(
        m["rejections"],
        Value::Array(vec![]),
        "the gateway accepted every event"
    );
    let reqs = requests(&m);
    assert_eq!(reqs.len(), 8, "2 rounds x (2 flows + direct + denial)");
    let total: usize = reqs.iter().map(|(_, r)| expected_members(r)).sum();
    assert_eq!(m["stats"]["accepted"], total as u64, "{}", m["stats"]);

    // Exactly those facts in ClickHouse, and one narrative per request, chained.
    p.wait_for_facts(total as u64, Duration::from_secs(60))
        .await;
    assert_eq!(
        p.scalar("SELECT count() FROM weft_events").await,
        total as u64
    );
    let mut kinds_seen = BTreeMap::new();
    for (rid, r) in &reqs {
        let n = narrative(&p, rid, expected_members(r));
        assert_eq!(n["request_id"], rid.as_str());
        assert_eq!(
            n["related"],
            Value::Array(vec![]),
            "no links to other requests"
        );
        let v = View::new(&n);
        for e in n["entries"].as_array().unwrap() {
            *kinds_seen
                .entry(e["kind"].as_str().unwrap().to_owned())
                .or_insert(0) += 1;
        }
        if r.get("steps").is_some() {
            v.check_flow(r);
        } else {
            for k in r["kernel"].as_array().unwrap() {
                v.check_kernel_action(k, None);
            }
        }
    }
    // `weft validate`: every stored payload against weaver-spec 0.9.0 (also I-01 on frames,
    // I-06 on tokens), and each request's audit chain as a TraceBundle for I-02 (every
    // PolicyDecision, allow or deny, has its TraceEvent). A bundle without its TraceEvents
    // must fail, so the check can fail.
    let mut envelopes = String::new();
    for (rid, r) in &reqs {
        let n = narrative(&p, rid, expected_members(r));
        let mut by_kind: BTreeMap<&str, Vec<Value>> = BTreeMap::new();
        for e in n["entries"].as_array().unwrap() {
            let kind = e["kind"].as_str().unwrap();
            envelopes
                .push_str(&serde_json::json!({"kind": kind, "payload": e["payload"]}).to_string());
            envelopes.push('\n');
            by_kind.entry(kind).or_default().push(e["payload"].clone());
        }
        let take = |k: &str| Value::Array(by_kind.get(k).cloned().unwrap_or_default());
        let mut bundle = serde_json::json!({
            "bundle_id": format!("bundle-{rid}"),
            "routing_decision": {"id": format!("rd-{rid}"), "timestamp": "2026-01-01T00:00:00Z",
                "choice_cards": [{"id": "c", "items": [{"id": "i", "label": "l", "description": "d"}]}]},
            "policy_decisions": take("policy_decision"),
            "frames": take("frame"),
            "handles": take("handle"),
            "trace_events": take("trace_event"),
        });
        assert!(
            !bundle["policy_decisions"].as_array().unwrap().is_empty() || r.get("steps").is_some()
        );
        let file = p.path(&format!("bundle-{rid}.json"));
        let out = validate_bundle(&p, &file, &bundle);
        assert!(
            out.status.success(),
            "I-02 for {rid}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        if !bundle["policy_decisions"].as_array().unwrap().is_empty() {
            bundle["trace_events"] = Value::Array(vec![]);
            let out = validate_bundle(&p, &file, &bundle);
            assert!(
                !out.status.success(),
                "a bundle without TraceEvents must break I-02"
            );
            assert!(String::from_utf8_lossy(&out.stdout).contains("I-02"));
        }
    }
    let file = p.path("stored.jsonl");
    std::fs::write(&file, &envelopes).unwrap();
    let out = p.weft().arg("validate").arg(&file).output().unwrap();
    assert!(
        out.status.success(),
        "weft validate:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.contains(": ok"))
            .count(),
        total
    );

    // A payload the real gateway refuses is surfaced (counted, kept with its reason) and
    // not retried; the good event next to it is stored.
    let probe = r#"
import sys, weft_publish
p = weft_publish.Publisher(sys.argv[1], sys.argv[2], buffer_dir=sys.argv[3])
p.publish("trace_event", {"event_id": "bad-1", "event_type": "no_such_type", "timestamp": "2026-01-01T00:00:00Z"}, request_id="probe")
p.publish("trace_event", {"event_id": "good-1", "event_type": "flow_started", "timestamp": "2026-01-01T00:00:00Z"}, request_id="probe")
assert p.flush(60), p.stats
print(p.stats["accepted"], p.stats["rejected"], p.rejections[0].code if p.rejections else "-")
p.close()
"#;
    let out = Command::new(&py)
        .args(["-c", probe, &url, KEY])
        .arg(p.path("probe-buffer"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "1 1 schema_invalid"
    );
    p.wait_for_facts(total as u64 + 1, Duration::from_secs(60))
        .await;
    assert_eq!(
        p.scalar("SELECT count() FROM weft_events WHERE id IN ('good-1', 'bad-1')")
            .await,
        1
    );

    // Each flow ran as ChainWeaver says: the routed one succeeded, the WRITE one was denied.
    let flows = m["flows"].as_array().unwrap();
    assert!(flows
        .iter()
        .any(|f| f["flow_name"] == "research_then_code" && f["success"] == true));
    assert!(flows
        .iter()
        .any(|f| f["flow_name"] == "research_then_commit"
            && f["success"] == false
            && f["kernel"][0]["event_type"] == "deny"));
    for kind in [
        "trace_event",
        "policy_decision",
        "frame",
        "handle",
        "capability_token",
        "execution_routing_decision",
        "execution_feedback",
    ] {
        assert!(
            kinds_seen.contains_key(kind),
            "no {kind} at all: {kinds_seen:?}"
        );
    }

    // `weft audit` agrees: no I-02 finding (every execution has its allow decision and its
    // authorization before it), and the denials the scenario provoked are exactly the deny
    // decisions an auditor finds.
    let audit = |args: &[&str]| {
        let out = p
            .weft()
            .arg("audit")
            .args(args)
            .args(["--tenant", TENANT, "--from", "1d", "--to", "now"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "weft audit {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let report: Value =
        serde_json::from_str(&audit(&["check", "--grace-secs", "0", "--format", "json"])).unwrap();
    let i02 = common::findings(&report, "I-02");
    assert!(i02.is_empty(), "I-02 findings: {i02:#?}");
    let provoked = reqs
        .iter()
        .flat_map(|(_, r)| r["kernel"].as_array().unwrap())
        .filter(|k| k["event_type"] == "deny")
        .count();
    assert!(provoked >= 2, "the scenario provokes denials");
    let denials = audit(&[
        "search",
        "--kind",
        "policy_decision",
        "--decision",
        "deny",
        "--all",
        "--format",
        "jsonl",
    ]);
    assert_eq!(denials.lines().count(), provoked, "{denials}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_outage_mid_run_loses_nothing() {
    let outage = Duration::from_secs(
        std::env::var("WEFT_SIBLINGS_OUTAGE_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(30),
    );
    let py = siblings_python();
    let p = Pipeline::new("sibout");
    let addr = format!("127.0.0.1:{}", free_port());
    let (gw, url) = gateway(&p, &addr);
    let _ingest = p.ingest(None);
    let stop = p.path("stop");
    let progress = p.path("progress.json");
    let child = run_scenario(
        &py,
        &url,
        &p.dir,
        &[
            "--loop-until",
            stop.to_str().unwrap(),
            "--progress",
            progress.to_str().unwrap(),
            "--pause",
            "1.0",
        ],
    )
    .stdout(Stdio::null())
    .stderr(std::fs::File::create(p.path("scenario.log")).unwrap())
    .spawn()
    .unwrap();
    let mut child = Proc(child);
    let log = || {
        let t = std::fs::read_to_string(p.path("scenario.log")).unwrap_or_default();
        t[t.len().saturating_sub(3000)..].to_owned()
    };
    let rounds = |min: u64| {
        common::wait_for(Duration::from_secs(60), || {
            let v: Value = serde_json::from_slice(&std::fs::read(&progress).ok()?).ok()?;
            (v["rounds"].as_u64()? >= min).then_some(v)
        })
        .unwrap_or_else(|| {
            panic!(
                "the scenario did not reach {min} rounds; its log:\n{}",
                log()
            )
        })
    };
    let before = rounds(3);

    // Stop the gateway; Python keeps publishing and must buffer.
    assert!(gw.terminate().success());
    let down_at = Instant::now();
    let r0 = before["rounds"].as_u64().unwrap();
    let spilled = common::wait_for(Duration::from_secs(30), || {
        let v: Value = serde_json::from_slice(&std::fs::read(&progress).ok()?).ok()?;
        (v["stats"]["spilled"].as_u64().unwrap_or(0) > 0).then_some(())
    });
    assert!(
        spilled.is_some(),
        "the publisher never buffered to disk while the gateway was down"
    );
    // The outage lasts `outage`, while the scenario keeps running rounds.
    while down_at.elapsed() < outage {
        assert!(
            child.0.try_wait().unwrap().is_none(),
            "the scenario died during the outage"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let during = rounds(r0 + 1)["rounds"].as_u64().unwrap();
    assert!(during > r0, "rounds ran during the outage");

    let (_gw2, url2) = gateway(&p, &addr);
    assert_eq!(url2, url, "restarted on the same port");
    rounds(during + 2);
    std::fs::write(&stop, b"").unwrap();
    let status = common::wait_for(Duration::from_secs(180), || child.0.try_wait().unwrap())
        .expect("scenario exits after the stop file");
    assert!(status.success(), "scenario failed: {status:?}\n{}", log());

    let m = read_json(&p.path("manifest.json"));
    assert_eq!(m["flushed"], true);
    assert_eq!(m["rejections"], Value::Array(vec![]));
    assert!(
        m["stats"]["spilled"].as_u64().unwrap() > 0,
        "{}",
        m["stats"]
    );
    assert!(
        m["stats"]["replayed"].as_u64().unwrap() > 0,
        "{}",
        m["stats"]
    );
    let reqs = requests(&m);
    let total: usize = reqs.iter().map(|(_, r)| expected_members(r)).sum();
    eprintln!(
        "outage run: {} rounds, {total} events, {} written to the Python buffer, {} replayed; scenario done {:?} after the stop",
        m["rounds"], m["stats"]["spilled"], m["stats"]["replayed"], down_at.elapsed()
    );
    p.wait_for_facts(total as u64, Duration::from_secs(240))
        .await;
    eprintln!("all facts stored {:?} after the stop", down_at.elapsed());
    assert_eq!(
        p.scalar("SELECT count() FROM weft_events").await,
        total as u64,
        "nothing lost, nothing twice"
    );
    // Every request's narrative is complete.
    let want: BTreeMap<String, usize> = reqs
        .iter()
        .map(|(rid, r)| (rid.clone(), expected_members(r)))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got: BTreeMap<String, usize> = p
            .membership()
            .await
            .into_iter()
            .map(|(k, v)| (k, v.len()))
            .collect();
        if got == want {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "narratives differ: got {} want {}",
            got.len(),
            want.len()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// The publisher's own unit tests (buffer bounds, ordering, replay, rejections), stdlib
/// unittest, run here so `cargo test --workspace` covers them.
#[test]
fn python_publisher_unit_tests() {
    let py = siblings_python();
    let out = Command::new(py)
        .args(["-m", "unittest", "discover", "-s"])
        .arg(common::repo_root().join("producers/python/tests"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "python unit tests failed:\n{err}");
    assert!(err.contains("OK"), "{err}");
    assert!(
        !err.contains("skipped"),
        "the adapter tests need the siblings: {err}"
    );
}

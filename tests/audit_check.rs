//! `weft audit` end to end on the local stack: a simulated stream with every kind of injected
//! violation is published and ingested, then
//! - `weft audit check` must find exactly the injected violations (same subjects, same proving
//!   events) and nothing else; a long grace period must hold the orphans back;
//! - `weft audit timeline` must return each request's members, and nothing across tenants;
//! - `weft audit search` must page through a filter with a cursor and agree with the input;
//! - `weft audit bundle` must export TraceBundles that validate and pass conformance (or fail
//!   with I-01 where raw output was injected), sign them, and `bundle-check` must verify the
//!   signature and reject a tampered copy and every negative bundle of the spec corpus.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Output;
use std::time::Duration;

use common::pipeline::{truth_membership, Pipeline};
use serde_json::Value;
use weft_sim::{Invariant, Scenario};

fn run(p: &Pipeline, args: &[&str]) -> Output {
    p.weft().arg("audit").args(args).output().unwrap()
}

fn ok_json(out: Output, what: &str) -> Value {
    assert!(
        out.status.success(),
        "{what}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// The simulated streams' whole span, as `--from`/`--to` arguments.
const RANGE: [&str; 4] = [
    "--from",
    "2026-10-01T00:00:00Z",
    "--to",
    "2027-01-01T00:00:00Z",
];

/// `weft audit check --format json --grace-secs <grace>` over `range` (`--from`/`--to`),
/// with `extra` arguments, its report parsed (it must succeed; `what` names it if not).
fn check(p: &Pipeline, grace: &str, range: [&str; 4], extra: &[&str], what: &str) -> Value {
    let mut args = vec!["check", "--format", "json", "--grace-secs", grace];
    args.extend(range);
    args.extend(extra);
    ok_json(run(p, &args), what)
}

/// `weft audit bundle-check <bundle> --keyring <keyring>`.
fn bundle_check(p: &Pipeline, bundle: &Path, keyring: &Path) -> Output {
    run(
        p,
        &[
            "bundle-check",
            bundle.to_str().unwrap(),
            "--keyring",
            keyring.to_str().unwrap(),
        ],
    )
}

/// The lines of a successful `--format jsonl` run, parsed.
fn jsonl(out: Output) -> Vec<Value> {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

type Key = (String, String, String);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_finds_exactly_the_injected_violations() {
    let p = Pipeline::new("it_audit");
    let truth = p.simulate(&[
        "--flows",
        "240",
        "--seed",
        "606",
        "--shuffle",
        "--no-request-id",
        "0.1",
        "--duplicates",
        "0.05",
        "--deny",
        "0.05",
        "--partial",
        "0.05",
        "--failure",
        "0.05",
        "--expired-token",
        "0.06",
        "--reused-token",
        "0.06",
        "--out-of-scope",
        "0.06",
        "--unauthorized",
        "0.1",
        "--raw-output",
        "0.06",
        "--orphan",
        "0.06",
        "--pending-routing",
        "0.1",
        "--id-conflict",
        "0.06",
        "--unknown-token",
        "0.06",
    ]);
    for inv in [
        Invariant::I01,
        Invariant::I02,
        Invariant::I06,
        Invariant::Orphan,
        Invariant::IdConflict,
    ] {
        assert!(
            truth.totals.violations.get(&inv).copied().unwrap_or(0) > 0,
            "no {inv:?} injected"
        );
    }
    // RoutingDecisions sent pending, then selected: completed decisions, not conflicts.
    let events = std::fs::read_to_string(p.path("events.jsonl")).unwrap();
    assert!(
        events
            .lines()
            .any(|l| l.contains(r#""kind":"routing_decision""#)
                && l.contains(r#""selected_item_id":null"#)),
        "seed 606 sends no pending RoutingDecision"
    );
    // Both halves of I-02: executions, and PolicyDecisions no TraceEvent names.
    let untraced = |v: &weft_sim::InjectedViolation| {
        v.invariant == Invariant::I02 && v.subject.kind == weft_schemas::Kind::PolicyDecision
    };
    assert!(
        truth.violations().any(|(_, v)| untraced(v)),
        "no untraced decision injected"
    );
    assert!(truth
        .violations()
        .any(|(_, v)| v.invariant == Invariant::I02 && !untraced(v)));
    // I-06 `token_unknown`: allow decisions naming a token that is never sent.
    let unknown_tokens: BTreeSet<String> = truth
        .violations()
        .filter(|(r, _)| r.scenario == Scenario::UnknownToken)
        .map(|(_, v)| v.subject.id.clone())
        .collect();
    assert!(
        !unknown_tokens.is_empty(),
        "seed 606 injects no unknown token"
    );
    let _ingest = p.ingest(None);
    p.publish(&p.path("events.jsonl"));
    p.wait_for_facts(truth.totals.distinct_events, Duration::from_secs(180))
        .await;
    p.wait_for_narratives(&truth_membership(&truth), Duration::from_secs(60))
        .await;

    let range = RANGE;
    // --- check: every injected violation, nothing else, with the same proof ---
    let report = check(&p, "0", range, &[], "audit check");
    let final_i02 = findings_of(&report, "I-02")
        .into_iter()
        .filter(|(rule, _, _)| rule == "no_decision" || rule == "execution_after_deny")
        .collect::<BTreeSet<_>>();
    let waiting_i02 = findings_of(&report, "I-02")
        .iter()
        .filter(|(rule, _, _)| rule == "not_authorized_event")
        .count();
    assert!(
        !final_i02.is_empty() && waiting_i02 > 0,
        "{}",
        report["counts"]
    );
    let mut want: BTreeMap<Key, BTreeSet<(String, String)>> = BTreeMap::new();
    for (_, v) in truth.violations() {
        let key = (
            v.invariant.as_str().to_owned(),
            v.subject.kind.as_str().to_owned(),
            v.subject.id.clone(),
        );
        let ev = v
            .events
            .iter()
            .map(|e| (e.kind.as_str().to_owned(), e.id.clone()))
            .collect();
        assert!(want.insert(key, ev).is_none());
    }
    let mut got: BTreeMap<Key, BTreeSet<(String, String)>> = BTreeMap::new();
    for f in report["findings"].as_array().unwrap() {
        let s = |v: &Value| v.as_str().unwrap().to_owned();
        let key = (
            s(&f["invariant"]),
            s(&f["subject"]["kind"]),
            s(&f["subject"]["id"]),
        );
        let ev = f["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (s(&e["kind"]), s(&e["id"])))
            .collect();
        assert!(
            got.insert(key.clone(), ev).is_none(),
            "finding {key:?} reported twice"
        );
    }
    let missing: Vec<_> = want.keys().filter(|k| !got.contains_key(*k)).collect();
    let extra: Vec<_> = got.keys().filter(|k| !want.contains_key(*k)).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "missing {missing:?}\nextra {extra:?}"
    );
    for (k, ev) in &want {
        assert_eq!(&got[k], ev, "proof of {k:?}");
    }
    // ... and the unknown tokens are found by that rule, not by another I-06 rule.
    let found_unknown: BTreeSet<String> = findings_of(&report, "I-06")
        .into_iter()
        .filter(|(rule, _, _)| rule == "token_unknown")
        .map(|(_, subject, _)| subject)
        .collect();
    assert_eq!(found_unknown, unknown_tokens, "{}", report["counts"]);
    // A grace period longer than the test: the handles may still arrive, no orphan yet.
    let report = check(&p, "3600", range, &[], "audit check (grace)");
    assert_eq!(report["counts"].get("orphan"), None, "{}", report["counts"]);
    // ... nor the decisions no trace event names, nor the executions whose decision or
    // capability_authorized may still arrive: only the executions' final findings remain
    // (no decision named, executed after a deny).
    assert_eq!(
        findings_of(&report, "I-02"),
        final_i02,
        "{}",
        report["counts"]
    );
    // ... nor the unknown tokens, which may still be in flight.
    assert!(
        findings_of(&report, "I-06")
            .iter()
            .all(|(rule, _, _)| rule != "token_unknown"),
        "{}",
        report["counts"]
    );
    assert_eq!(
        report["counts"]["I-01"],
        truth.totals.violations[&Invariant::I01]
    );
    // Another tenant sees none of it.
    let other = check(&p, "0", range, &["--tenant", "other"], "check other");
    assert_eq!(other["findings"].as_array().unwrap().len(), 0);

    // --- timeline ---
    let req = truth
        .requests
        .iter()
        .find(|r| r.scenario == Scenario::Clean)
        .unwrap();
    let t = ok_json(
        run(
            &p,
            &["timeline", "--request", &req.request_id, "--format", "json"],
        ),
        "timeline",
    );
    let members: BTreeSet<(String, String)> = t["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["kind"].as_str().unwrap().to_owned(),
                e["id"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let want_members: BTreeSet<(String, String)> = req
        .members
        .iter()
        .map(|m| (m.kind.as_str().to_owned(), m.id.clone()))
        .collect();
    assert_eq!(members, want_members);
    let text = run(&p, &["timeline", "--request", &req.request_id]);
    assert!(text.status.success());
    assert!(String::from_utf8_lossy(&text.stdout).contains("capability_executed"));
    let other = run(
        &p,
        &[
            "timeline",
            "--request",
            &req.request_id,
            "--tenant",
            "other",
        ],
    );
    assert_eq!(
        other.status.code(),
        Some(1),
        "a request of tenant default must not be found for `other`"
    );

    // --- search: deny decisions, paged 2 at a time, equal to what the input holds ---
    let mut denies = BTreeSet::new();
    for line in std::fs::read_to_string(p.path("events.jsonl"))
        .unwrap()
        .lines()
    {
        let env: weft_schemas::Envelope = serde_json::from_str(line).unwrap();
        let (v, id) = env.validate().unwrap();
        if env.kind == weft_schemas::Kind::PolicyDecision && v["decision"] == "deny" {
            denies.insert(id);
        }
    }
    assert!(denies.len() > 2);
    // Two denials a page.
    let denials = |more: &[&'static str]| {
        let mut args = vec![
            "search",
            "--kind",
            "policy_decision",
            "--decision",
            "deny",
            "--limit",
            "2",
        ];
        args.extend(more);
        args.extend(range);
        run(&p, &args)
    };
    let lines = jsonl(denials(&["--all", "--format", "jsonl"]));
    let ids: BTreeSet<String> = lines
        .iter()
        .map(|l| l["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(lines.len(), ids.len(), "a row repeated across pages");
    assert_eq!(ids, denies);
    // One page and its cursor.
    let out = denials(&["--format", "csv"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).lines().count(),
        3,
        "header + 2 rows"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("next cursor: "));
    let bad = run(&p, &["search", "--cursor", "not-a-cursor"]);
    assert!(!bad.status.success());

    // --- bundles ---
    let key = p.path("signer.key");
    let ring = ok_json(
        run(
            &p,
            &[
                "keygen",
                "--kid",
                "test-signer",
                "--out",
                key.to_str().unwrap(),
            ],
        ),
        "keygen",
    );
    let ring_path = p.path("keyring.json");
    std::fs::write(&ring_path, ring.to_string()).unwrap();
    let out = run(
        &p,
        &[
            "bundle",
            "--request",
            &req.request_id,
            "--sign-key",
            key.to_str().unwrap(),
        ],
    );
    let bundle = ok_json(out, "bundle of a clean request");
    assert_eq!(bundle["signature"]["kid"], "test-signer");
    assert_eq!(
        bundle["trace_events"].as_array().unwrap().len(),
        req.members
            .iter()
            .filter(|m| m.kind == weft_schemas::Kind::TraceEvent)
            .count()
    );
    let file = p.path("bundle.json");
    std::fs::write(&file, bundle.to_string()).unwrap();
    let ok = bundle_check(&p, &file, &ring_path);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let mut tampered = bundle.clone();
    tampered["trace_events"][0]["principal"] = Value::String("mallory".into());
    std::fs::write(&file, tampered.to_string()).unwrap();
    let bad = bundle_check(&p, &file, &ring_path);
    assert_eq!(bad.status.code(), Some(1), "a tampered bundle must fail");
    // Clean requests whose RoutingDecision was sent pending, then selected: their bundles
    // carry the selected one, whichever was stored first (each is first about half the time).
    let pending_requests: BTreeSet<String> = events
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["kind"] == "routing_decision" && e["payload"]["selected_item_id"].is_null())
        .filter_map(|e| e["request_id"].as_str().map(str::to_owned))
        .collect();
    let completed: Vec<&str> = truth
        .requests
        .iter()
        .filter(|r| r.scenario == Scenario::Clean && pending_requests.contains(&r.request_id))
        .map(|r| r.request_id.as_str())
        .collect();
    assert!(completed.len() >= 8, "{completed:?}: too few to tell");
    for request in completed {
        let bundle = ok_json(
            run(&p, &["bundle", "--request", request]),
            "bundle of a request whose routing decision was completed",
        );
        assert!(
            bundle["routing_decision"]["selected_item_id"].is_string(),
            "{request}: {}",
            bundle["routing_decision"]
        );
    }
    // A request with raw output exports a bundle that fails I-01.
    let raw = truth
        .requests
        .iter()
        .find(|r| r.scenario == Scenario::RawOutput)
        .unwrap();
    let out = run(&p, &["bundle", "--request", &raw.request_id]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("I-01"));
    // The spec corpus: the signed fixture verifies with the test keyring; every negative
    // bundle fails.
    let spec = common::repo_root().join("schemas/spec/conformance");
    let test_ring = spec.join("keyring/test_keyring.json");
    let fixture = spec.join("fixtures/trace_bundle_signed_valid.json");
    let out = bundle_check(&p, &fixture, &test_ring);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("verified with key conformance-test-ed25519-2026-01"));
    let mut n = 0;
    for e in std::fs::read_dir(spec.join("negative/trace_bundle")).unwrap() {
        let path = e.unwrap().path();
        let out = bundle_check(&p, &path, &test_ring);
        assert_eq!(out.status.code(), Some(1), "{} passed", path.display());
        n += 1;
    }
    assert_eq!(n, 5);

    // Every read above was logged.
    let logged = p.scalar("SELECT count() FROM weft_audit_log WHERE action IN ('check', 'timeline', 'search', 'bundle')").await;
    assert!(logged >= 8, "only {logged} audit reads logged");

    // ... and so is a search whose reader closed the pipe (`| head`): the write error used
    // to end it before its row was written.
    let searches = "SELECT count() FROM weft_audit_log WHERE action = 'search'";
    let before = p.scalar(searches).await;
    let mut child = p
        .weft()
        .args(["audit", "search", "--all", "--format", "jsonl"])
        .args(range)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take()); // the reader is gone before the first line
    assert!(
        child.wait().unwrap().success(),
        "a closed pipe ends a search, no error"
    );
    assert_eq!(p.scalar(searches).await, before + 1);
}

/// Two findings the checks' cheap first passes used to drop:
/// - I-02: a decision with one execution before its authorization and one after; the first
///   pass compared the authorization with the *latest* execution, so the early one was lost;
/// - I-01: a frame whose raw-output key is written with a JSON escape (`raw\u005foutput`):
///   stored as sent, it has no literal `"raw_output"` for the text pre-filter, but every JSON
///   reader sees the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checks_catch_an_early_execution_beside_a_late_one_and_an_escaped_key() {
    let p = Pipeline::new("it_audit_edges");
    let ts = |ms: u32| format!("2026-11-01T00:00:00.{ms:03}Z");
    let trace = |id: &str, ty: &str, ms: u32| {
        format!(
            r#"{{"kind":"trace_event","request_id":"r-edge","payload":{{"event_id":"{id}","event_type":"{ty}","timestamp":"{}","capability_id":"org.weaver.web_search","principal":"p","decision_id":"pd-edge","outcome":"success"}}}}"#,
            ts(ms)
        )
    };
    let frame = |id: &str, key: &str| {
        format!(
            r#"{{"kind":"frame","request_id":"r-edge","payload":{{"frame_id":"{id}","capability_id":"org.weaver.web_search","summary":"s","handle_refs":[],"created_at":"{}","{key}":"secret"}}}}"#,
            ts(500)
        )
    };
    let lines = [
        format!(
            r#"{{"kind":"policy_decision","request_id":"r-edge","payload":{{"decision_id":"pd-edge","decision":"allow","capability_id":"org.weaver.web_search","principal":"p","reason":"r","timestamp":"{}"}}}}"#,
            ts(100)
        ),
        trace("te-exec-early", "capability_executed", 200),
        trace("te-auth", "capability_authorized", 300),
        trace("te-exec-late", "capability_executed", 400),
        frame("frame-escaped", r"raw\u005foutput"),
        frame("frame-clean", "x_acme_note"),
        // One frame stored under two request ids (ingest keeps both, for the narratives).
        frame("frame-copied", "x_acme_note"),
        frame("frame-copied", "x_acme_note").replace("r-edge", "r-edge-2"),
    ];
    let _ingest = p.ingest_events("edges.jsonl", &lines).await;
    let report = check(&p, "0", RANGE, &[], "audit check");
    let subjects = |inv: &str| -> BTreeSet<String> {
        common::findings(&report, inv)
            .iter()
            .map(|f| f["subject"]["id"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        subjects("I-02"),
        BTreeSet::from(["te-exec-early".to_owned()]),
        "{report:#}"
    );
    assert_eq!(
        subjects("I-01"),
        BTreeSet::from(["frame-escaped".to_owned()]),
        "{report:#}"
    );
    // A search paged one hit at a time gives both copies of the frame: they share time,
    // kind, id and content, the cursor's whole key until the request id and the offset
    // joined it (the second copy was skipped).
    let mut args = vec![
        "search", "--kind", "frame", "--limit", "1", "--all", "--format", "jsonl",
    ];
    args.extend(RANGE);
    let out = run(&p, &args);
    let copies: BTreeSet<String> = jsonl(out)
        .into_iter()
        .filter(|h| h["id"] == "frame-copied")
        .map(|h| h["request_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        copies,
        BTreeSet::from(["r-edge".to_owned(), "r-edge-2".to_owned()])
    );
}

/// I-02 `decision_untraced` (weaver-spec `policy_decisions_are_traced`): a PolicyDecision whose
/// id no TraceEvent carries is reported, with the decision as its proof, once it was ingested
/// more than `--grace-secs` ago; a decision named only by a `capability_denied`, or by a
/// trace event just outside the range (inside the lookaround), is traced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_no_trace_event_names_is_untraced_once_past_grace() {
    let p = Pipeline::new("it_audit_untraced");
    let decision = |id: &str, verdict: &str, ts: &str| {
        format!(
            r#"{{"kind":"policy_decision","request_id":"r-untraced","payload":{{"decision_id":"{id}","decision":"{verdict}","capability_id":"org.weaver.web_search","principal":"p","reason":"r","timestamp":"{ts}"}}}}"#
        )
    };
    let trace = |id: &str, ty: &str, pd: &str, ts: &str| {
        format!(
            r#"{{"kind":"trace_event","request_id":"r-untraced","payload":{{"event_id":"{id}","event_type":"{ty}","timestamp":"{ts}","capability_id":"org.weaver.web_search","principal":"p","decision_id":"{pd}","outcome":"failure"}}}}"#
        )
    };
    let lines = [
        decision("pd-untraced", "allow", "2026-11-01T00:00:00.100Z"),
        decision("pd-denied", "deny", "2026-11-01T00:00:00.200Z"),
        trace(
            "te-denied",
            "capability_denied",
            "pd-denied",
            "2026-11-01T00:00:00.300Z",
        ),
        // Named only by a trace event after the range's end, within the lookaround.
        decision("pd-late-trace", "deny", "2026-11-01T00:00:00.400Z"),
        trace(
            "te-late",
            "capability_denied",
            "pd-late-trace",
            "2026-11-01T06:00:00.000Z",
        ),
    ];
    let _ingest = p.ingest_events("untraced.jsonl", &lines).await;
    let hour = [
        "--from",
        "2026-11-01T00:00:00Z",
        "--to",
        "2026-11-01T01:00:00Z",
    ];
    let report = check(&p, "0", hour, &[], "audit check");
    let i02 = common::findings(&report, "I-02");
    assert_eq!(i02.len(), 1, "{report:#}");
    assert_eq!(i02[0]["rule"], "decision_untraced");
    assert_eq!(
        i02[0]["subject"],
        serde_json::json!({"kind": "policy_decision", "id": "pd-untraced"})
    );
    assert_eq!(
        i02[0]["events"],
        serde_json::json!([{"kind": "policy_decision", "id": "pd-untraced"}])
    );
    assert_eq!(report["counts"]["I-02"], 1, "{report:#}");
    assert!(report["timings_ms"].get("I-02 untraced").is_some());
    // Ingested less than an hour ago: its trace events may still be in flight.
    let report = check(&p, "3600", hour, &[], "audit check (grace)");
    assert_eq!(report["counts"].get("I-02"), None, "{report:#}");
}

/// `(rule, subject id, proving events as kind:id)` of the findings of one invariant.
fn findings_of(report: &Value, inv: &str) -> BTreeSet<(String, String, Vec<String>)> {
    common::findings(report, inv)
        .into_iter()
        .map(|f| {
            let events = f["events"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| {
                    format!(
                        "{}:{}",
                        e["kind"].as_str().unwrap(),
                        e["id"].as_str().unwrap()
                    )
                })
                .collect();
            (
                f["rule"].as_str().unwrap().to_owned(),
                f["subject"]["id"].as_str().unwrap().to_owned(),
                events,
            )
        })
        .collect()
}

/// One `capability_*` trace event of request `r-i06`-style tests.
fn trace_line(request: &str, id: &str, ty: &str, pd: &str, cap: &str, ts: &str) -> String {
    format!(
        r#"{{"kind":"trace_event","request_id":"{request}","payload":{{"event_id":"{id}","event_type":"{ty}","timestamp":"{ts}","capability_id":"{cap}","principal":"p","decision_id":"{pd}","outcome":"success"}}}}"#
    )
}

/// I-06 over a range that starts days after the tokens were issued: the tokens are looked up
/// by the ids the range's decisions name, not by their issue time. A token issued on Monday
/// that expired an hour later, used by an allow decision and an execution on Wednesday, is
/// `token_expired`; a long-lived token issued weeks before, used outside its scope on
/// Wednesday, is `token_out_of_scope`. The check used to look tokens up only within a day of
/// the range, and dropped both uses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_issued_long_before_the_range_is_still_checked() {
    let p = Pipeline::new("it_audit_old_token");
    let token = |id: &str, issued: &str, expires: &str| {
        format!(
            r#"{{"kind":"capability_token","request_id":"r-old-token","payload":{{"token_id":"{id}","principal":"p","scope":["org.weaver.web_search"],"issued_at":"{issued}","expires_at":"{expires}"}}}}"#
        )
    };
    let decision = |id: &str, tok: &str, cap: &str, ts: &str| {
        format!(
            r#"{{"kind":"policy_decision","request_id":"r-old-token","payload":{{"decision_id":"{id}","decision":"allow","capability_id":"{cap}","principal":"p","token_id":"{tok}","reason":"r","timestamp":"{ts}"}}}}"#
        )
    };
    let (search, code) = ("org.weaver.web_search", "org.weaver.code_exec");
    let lines = [
        // Monday 09:00, expires at 10:00.
        token("tok-monday", "2026-11-02T09:00:00Z", "2026-11-02T10:00:00Z"),
        // Three weeks before, valid for a year.
        token("tok-long", "2026-10-12T00:00:00Z", "2027-10-12T00:00:00Z"),
        // Wednesday.
        decision(
            "pd-expired",
            "tok-monday",
            search,
            "2026-11-04T12:00:00.100Z",
        ),
        trace_line(
            "r-old-token",
            "te-auth-expired",
            "capability_authorized",
            "pd-expired",
            search,
            "2026-11-04T12:00:00.200Z",
        ),
        trace_line(
            "r-old-token",
            "te-exec-expired",
            "capability_executed",
            "pd-expired",
            search,
            "2026-11-04T12:00:00.300Z",
        ),
        decision("pd-scope", "tok-long", code, "2026-11-04T13:00:00.100Z"),
        trace_line(
            "r-old-token",
            "te-auth-scope",
            "capability_authorized",
            "pd-scope",
            code,
            "2026-11-04T13:00:00.200Z",
        ),
        trace_line(
            "r-old-token",
            "te-exec-scope",
            "capability_executed",
            "pd-scope",
            code,
            "2026-11-04T13:00:00.300Z",
        ),
    ];
    let _ingest = p.ingest_events("old_token.jsonl", &lines).await;
    let ev = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let want = BTreeSet::from([
        (
            "token_expired".to_owned(),
            "tok-monday".to_owned(),
            ev(&[
                "capability_token:tok-monday",
                "policy_decision:pd-expired",
                "trace_event:te-exec-expired",
            ]),
        ),
        (
            "token_out_of_scope".to_owned(),
            "tok-long".to_owned(),
            ev(&[
                "capability_token:tok-long",
                "policy_decision:pd-scope",
                "trace_event:te-exec-scope",
            ]),
        ),
    ]);
    // Wednesday to Thursday: both tokens were issued before the range's lookaround.
    let report = check(
        &p,
        "0",
        [
            "--from",
            "2026-11-04T00:00:00Z",
            "--to",
            "2026-11-05T00:00:00Z",
        ],
        &[],
        "audit check",
    );
    assert_eq!(findings_of(&report, "I-06"), want, "{report:#}");
    assert_eq!(report["counts"].get("I-02"), None, "{report:#}");
    // The range that holds everything finds the same.
    let report = check(&p, "0", RANGE, &[], "audit check");
    assert_eq!(findings_of(&report, "I-06"), want, "{report:#}");
}

/// I-06 `token_unknown`: an allow decision naming a token stored nowhere (not in the range,
/// not in the whole history) is reported once it was ingested more than `--grace-secs` ago;
/// before that, the token may still be in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_naming_a_token_stored_nowhere_is_token_unknown_past_grace() {
    let p = Pipeline::new("it_audit_unknown_token");
    let cap = "org.weaver.web_search";
    let decision = |id: &str, verdict: &str, tok: &str, ts: &str| {
        format!(
            r#"{{"kind":"policy_decision","request_id":"r-ghost","payload":{{"decision_id":"{id}","decision":"{verdict}","capability_id":"{cap}","principal":"p","token_id":"{tok}","reason":"r","timestamp":"{ts}"}}}}"#
        )
    };
    let lines = [
        // Issued three weeks before the range: stored, so known.
        r#"{"kind":"capability_token","request_id":"r-ghost","payload":{"token_id":"tok-known","principal":"p","scope":["org.weaver.web_search"],"issued_at":"2026-10-12T00:00:00Z","expires_at":"2027-10-12T00:00:00Z"}}"#.to_owned(),
        decision("pd-known", "allow", "tok-known", "2026-11-04T14:00:00.100Z"),
        trace_line("r-ghost", "te-auth-known", "capability_authorized", "pd-known", cap, "2026-11-04T14:00:00.200Z"),
        decision("pd-ghost", "allow", "tok-ghost", "2026-11-04T14:00:01.100Z"),
        trace_line("r-ghost", "te-auth-ghost", "capability_authorized", "pd-ghost", cap, "2026-11-04T14:00:01.200Z"),
        // A deny is no use of its token.
        decision("pd-ghost-deny", "deny", "tok-ghost-deny", "2026-11-04T14:00:02.100Z"),
        trace_line("r-ghost", "te-denied", "capability_denied", "pd-ghost-deny", cap, "2026-11-04T14:00:02.200Z"),
    ];
    let _ingest = p.ingest_events("unknown_token.jsonl", &lines).await;
    let (from, to) = ("2026-11-04T00:00:00Z", "2026-11-05T00:00:00Z");
    let report = check(&p, "0", ["--from", from, "--to", to], &[], "audit check");
    assert_eq!(
        findings_of(&report, "I-06"),
        BTreeSet::from([(
            "token_unknown".to_owned(),
            "tok-ghost".to_owned(),
            vec![
                "capability_token:tok-ghost".to_owned(),
                "policy_decision:pd-ghost".to_owned()
            ],
        )]),
        "{report:#}"
    );
    assert!(report["timings_ms"].get("I-06 unknown").is_some());
    let report = check(&p, "3600", ["--from", from, "--to", to], &[], "audit check");
    assert_eq!(report["counts"].get("I-06"), None, "{report:#}");
}

/// I-02's execution rules wait `--grace-secs` like the orphan check: an execution whose
/// PolicyDecision (another topic) or `capability_authorized` has not arrived may only be
/// early. Within the grace period only what no late event can undo is reported (an execution
/// naming no decision, an execution after a stored deny); past it, every rule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_execution_is_judged_on_its_missing_decision_only_past_grace() {
    let p = Pipeline::new("it_audit_exec_grace");
    let cap = "org.weaver.web_search";
    let decision = |id: &str, verdict: &str, ts: &str| {
        format!(
            r#"{{"kind":"policy_decision","request_id":"r-grace","payload":{{"decision_id":"{id}","decision":"{verdict}","capability_id":"{cap}","principal":"p","reason":"r","timestamp":"{ts}"}}}}"#
        )
    };
    let t = |ms: u32| format!("2026-11-01T00:00:00.{ms:03}Z");
    let lines = [
        // Its decision has not arrived (yet).
        trace_line(
            "r-grace",
            "te-missing",
            "capability_executed",
            "pd-in-flight",
            cap,
            &t(100),
        ),
        // Allowed, but its capability_authorized has not arrived (yet).
        decision("pd-allow", "allow", &t(200)),
        trace_line(
            "r-grace",
            "te-unauthorized",
            "capability_executed",
            "pd-allow",
            cap,
            &t(300),
        ),
        // Denied, and executed anyway: final.
        decision("pd-deny", "deny", &t(400)),
        trace_line(
            "r-grace",
            "te-denied",
            "capability_denied",
            "pd-deny",
            cap,
            &t(500),
        ),
        trace_line(
            "r-grace",
            "te-after-deny",
            "capability_executed",
            "pd-deny",
            cap,
            &t(600),
        ),
        // Names no decision at all: final.
        format!(
            r#"{{"kind":"trace_event","request_id":"r-grace","payload":{{"event_id":"te-bypass","event_type":"capability_executed","timestamp":"{}","capability_id":"{cap}","principal":"p","outcome":"success"}}}}"#,
            t(700)
        ),
    ];
    let _ingest = p.ingest_events("grace.jsonl", &lines).await;
    let rules = |report: &Value| -> BTreeSet<(String, String)> {
        findings_of(report, "I-02")
            .into_iter()
            .map(|(rule, subject, _)| (rule, subject))
            .collect()
    };
    let pair = |a: &str, b: &str| (a.to_owned(), b.to_owned());
    let (from, to) = ("2026-10-01T00:00:00Z", "2027-01-01T00:00:00Z");
    // Ingested less than an hour ago.
    let report = check(&p, "3600", ["--from", from, "--to", to], &[], "audit check");
    assert_eq!(
        rules(&report),
        BTreeSet::from([
            pair("execution_after_deny", "te-after-deny"),
            pair("no_decision", "te-bypass"),
        ]),
        "{report:#}"
    );
    // Past the grace period.
    let report = check(&p, "0", ["--from", from, "--to", to], &[], "audit check");
    assert_eq!(
        rules(&report),
        BTreeSet::from([
            pair("decision_missing", "te-missing"),
            pair("execution_after_deny", "te-after-deny"),
            pair("no_decision", "te-bypass"),
            pair("not_authorized_event", "te-unauthorized"),
        ]),
        "{report:#}"
    );
}

/// A PolicyDecision stored as allow and again as deny (an id conflict) is read as a deny by
/// I-02, whichever version a query meets first, so an execution of it is
/// `execution_after_deny` in every run. Two such decisions, one stored allow first and the
/// other deny first: reading "any" version read one of them as an allow (which one depends
/// on how ClickHouse reads the parts), and its execution passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_stored_as_allow_and_as_deny_counts_as_a_deny() {
    let p = Pipeline::new("it_audit_conflicting_decision");
    let cap = "org.weaver.web_search";
    let t = |ms: u32| format!("2026-11-01T00:00:00.{ms:03}Z");
    let decision = |id: &str, verdict: &str| {
        format!(
            r#"{{"kind":"policy_decision","request_id":"r-conflict","payload":{{"decision_id":"{id}","decision":"{verdict}","capability_id":"{cap}","principal":"p","reason":"r","timestamp":"{}"}}}}"#,
            t(100)
        )
    };
    let mut first = vec![
        decision("pd-allow-first", "allow"),
        decision("pd-deny-first", "deny"),
    ];
    for pd in ["pd-allow-first", "pd-deny-first"] {
        let (auth, exec) = (format!("te-auth-{pd}"), format!("te-exec-{pd}"));
        first.push(trace_line(
            "r-conflict",
            &auth,
            "capability_authorized",
            pd,
            cap,
            &t(200),
        ));
        first.push(trace_line(
            "r-conflict",
            &exec,
            "capability_executed",
            pd,
            cap,
            &t(300),
        ));
    }
    let _ingest = p.ingest(None);
    let file = p.path("first.jsonl");
    std::fs::write(&file, first.join("\n") + "\n").unwrap();
    p.publish(&file);
    p.wait_for_facts(first.len() as u64, Duration::from_secs(120))
        .await;
    let second = [
        decision("pd-allow-first", "deny"),
        decision("pd-deny-first", "allow"),
    ];
    let file = p.path("second.jsonl");
    std::fs::write(&file, second.join("\n") + "\n").unwrap();
    p.publish(&file);
    p.wait_for_facts(
        (first.len() + second.len()) as u64,
        Duration::from_secs(120),
    )
    .await;
    let want: BTreeSet<(String, String, Vec<String>)> = ["pd-allow-first", "pd-deny-first"]
        .into_iter()
        .map(|pd| {
            let exec = format!("te-exec-{pd}");
            (
                "execution_after_deny".to_owned(),
                exec.clone(),
                vec![
                    format!("trace_event:{exec}"),
                    format!("policy_decision:{pd}"),
                ],
            )
        })
        .collect();
    for _ in 0..3 {
        let report = check(&p, "0", RANGE, &[], "audit check");
        assert_eq!(findings_of(&report, "I-02"), want, "{report:#}");
        assert_eq!(report["counts"]["id_conflict"], 2, "{report:#}");
    }
}

/// A search page stops at `PAGE_MAX_BYTES` of payload (16 MiB) and hands out a cursor,
/// whatever `limit` says: 18 events of ~990 KB come in more than one page, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_search_page_of_large_events_ends_early_with_its_cursor() {
    let p = Pipeline::new("it_audit_bytes");
    let note = "n".repeat(990_000);
    let lines: Vec<String> = (0..18)
        .map(|i| {
            format!(
                r#"{{"kind":"trace_event","request_id":"r-big","payload":{{"event_id":"te-big-{i:02}","event_type":"flow_started","timestamp":"2026-11-01T00:00:{i:02}Z","metadata":{{"note":"{note}"}}}}}}"#
            )
        })
        .collect();
    let file = p.path("big.jsonl");
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    let _ingest = p.ingest(None);
    p.publish(&file);
    p.wait_for_facts(18, Duration::from_secs(120)).await;
    let search = |all: bool| {
        let mut args = vec![
            "search",
            "--kind",
            "trace_event",
            "--limit",
            "100",
            "--format",
            "jsonl",
        ];
        args.extend(RANGE);
        if all {
            args.push("--all");
        }
        let out = run(&p, &args);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let ids: Vec<String> = jsonl(out)
            .iter()
            .map(|h| h["id"].as_str().unwrap().to_owned())
            .collect();
        (ids, stderr)
    };
    let (first, stderr) = search(false);
    assert!(
        !first.is_empty() && first.len() < 18,
        "one page of {} hits",
        first.len()
    );
    assert!(stderr.contains("next cursor: "), "{stderr}");
    let (every, _) = search(true);
    let distinct: BTreeSet<&String> = every.iter().collect();
    assert_eq!((every.len(), distinct.len()), (18, 18));
}

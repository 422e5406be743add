//! The Grafana dashboards (`dashboards/`), checked without Grafana:
//!
//! - statically: stable unique UIDs, every panel and target reads ClickHouse through the
//!   `datasource` variable (no Prometheus panel is left: the ingest writes its own telemetry
//!   to ClickHouse), every panel declares its columns (`expected.yaml`), and the
//!   provisioning files are complete;
//! - live: on the local stack, a simulated stream (with every kind of injected violation,
//!   and a few garbage records for the dead-letter panels) plus real router decisions and
//!   feedback go through Kafka and `weft ingest`, `weft eval
//!   --store` stores an estimate, and then every panel's and variable's SQL, with the
//!   variables and the plugin's macros expanded exactly as Grafana and the plugin do
//!   (`common/grafana.rs`), runs as a read-only query and must return the declared columns
//!   and rows. The violation table must name exactly the violations the simulator injected,
//!   and the trace panel's spans must form one tree;
//! - live, on a few events of its own: the violations panel's grace period (`$grace`) holds
//!   back the I-02 findings a late event could undo, as `weft audit check --grace-secs` does.

mod common;
#[path = "common/grafana.rs"]
mod grafana;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use common::pipeline::{distinct_facts, Pipeline, Proc};
use grafana::{expand_macros, interpolate, TimeRange};
use serde_json::{json, Value};

const CH_PLUGIN: &str = "grafana-clickhouse-datasource";
const TENANT: &str = "acme";
const KEY: &str = "k-dashboards-0123456789";
/// The UIDs other dashboards and links rely on: changing one is a breaking change.
const UIDS: [&str; 3] = ["weft-compliance", "weft-pipeline-ops", "weft-router"];

fn dir() -> PathBuf {
    common::repo_root().join("dashboards")
}

/// Every dashboard file, parsed.
fn dashboards() -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir()).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "json") {
            let v: Value = serde_json::from_slice(&std::fs::read(&p).unwrap())
                .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            out.push((p.file_name().unwrap().to_string_lossy().into_owned(), v));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// uid -> panel id -> (columns, non_empty), from `dashboards/expected.yaml`.
fn expectations() -> BTreeMap<String, BTreeMap<String, (Vec<String>, bool)>> {
    let v: serde_yaml::Value =
        serde_yaml::from_slice(&std::fs::read(dir().join("expected.yaml")).unwrap()).unwrap();
    let mut out = BTreeMap::new();
    for (uid, d) in v.as_mapping().unwrap() {
        let mut panels = BTreeMap::new();
        for (id, e) in d["panels"].as_mapping().unwrap() {
            let cols = e["columns"]
                .as_sequence()
                .unwrap()
                .iter()
                .map(|c| c.as_str().unwrap().to_owned())
                .collect();
            panels.insert(
                id.as_str().unwrap().to_owned(),
                (cols, e["non_empty"].as_bool().unwrap()),
            );
        }
        out.insert(uid.as_str().unwrap().to_owned(), panels);
    }
    out
}

/// Panels, including those nested in collapsed rows.
fn panels(d: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for p in d["panels"].as_array().unwrap() {
        out.push(p);
        if let Some(inner) = p["panels"].as_array() {
            out.extend(inner.iter());
        }
    }
    out.into_iter().filter(|p| p["type"] != "row").collect()
}

fn is_ch(ds: &Value) -> bool {
    ds["type"] == CH_PLUGIN && ds["uid"] == "${datasource}"
}

/// The JSON is what `dashboards/build.py` writes: an edit made to the JSON alone is lost at
/// the next generation (the operations board once carried a hand-made query for weeks).
#[test]
fn dashboards_are_what_the_generator_writes() {
    let out = std::process::Command::new("python3")
        .arg(dir().join("build.py"))
        .arg("--check")
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn dashboards_are_well_formed_and_read_through_the_datasource_variable() {
    let boards = dashboards();
    let expect = expectations();
    let uids: BTreeSet<&str> = boards
        .iter()
        .map(|(_, d)| d["uid"].as_str().unwrap())
        .collect();
    assert_eq!(boards.len(), uids.len(), "duplicate dashboard uid");
    assert_eq!(uids, UIDS.into_iter().collect(), "dashboard uids changed");
    assert_eq!(
        expect.keys().map(String::as_str).collect::<BTreeSet<_>>(),
        uids
    );
    let mut ch_panels = 0;
    for (file, d) in &boards {
        let uid = d["uid"].as_str().unwrap();
        let vars = d["templating"]["list"].as_array().unwrap();
        assert!(
            vars.iter()
                .all(|v| v["type"] != "datasource" || v["name"] == "datasource"),
            "{file}: a second data source variable"
        );
        let ds_var = vars
            .iter()
            .find(|v| v["name"] == "datasource")
            .unwrap_or_else(|| panic!("{file}: no datasource variable"));
        assert_eq!(ds_var["type"], "datasource", "{file}");
        assert_eq!(ds_var["query"], CH_PLUGIN, "{file}");
        for v in vars.iter().filter(|v| v["type"] == "query") {
            assert!(is_ch(&v["datasource"]), "{file}: variable {}", v["name"]);
        }
        let mut ids = BTreeSet::new();
        let mut seen = BTreeSet::new();
        for p in panels(d) {
            let id = p["id"].as_u64().unwrap().to_string();
            assert!(ids.insert(id.clone()), "{file}: duplicate panel id {id}");
            let title = p["title"].as_str().unwrap();
            let ds = &p["datasource"];
            assert!(is_ch(ds), "{file}: {title}: datasource {ds}");
            ch_panels += 1;
            for t in p["targets"].as_array().unwrap() {
                assert!(
                    is_ch(&t["datasource"]),
                    "{file}: {title}: target datasource"
                );
                assert_eq!(t["editorType"], "sql", "{file}: {title}");
                let sql = t["rawSql"].as_str().unwrap();
                assert!(!sql.trim().is_empty(), "{file}: {title}");
                // A table-spanning query must be scoped by time or read small tables only.
                // (The trace panel reads one narrative, picked by a time-filtered variable.)
                if sql.contains("FROM weft_events")
                    && !sql.contains("weft_projector_progress")
                    && t["queryType"] != "traces"
                {
                    assert!(
                        sql.contains("$__timeFilter("),
                        "{file}: {title}: no time filter"
                    );
                }
                if p["type"] == "traces" {
                    assert_eq!(t["queryType"], "traces", "{file}: {title}");
                }
            }
            assert!(
                expect[uid].contains_key(&id),
                "{file}: {title} (panel {id}) has no entry in expected.yaml"
            );
            seen.insert(id);
        }
        let declared: BTreeSet<String> = expect[uid].keys().cloned().collect();
        assert_eq!(
            declared, seen,
            "{file}: expected.yaml lists panels that do not exist"
        );
    }
    assert!(ch_panels >= 20, "only {ch_panels} ClickHouse panels");
}

#[test]
fn provisioning_is_complete() {
    let prov = dir().join("provisioning");
    let ds: serde_yaml::Value =
        serde_yaml::from_slice(&std::fs::read(prov.join("datasources/weft.yaml")).unwrap())
            .unwrap();
    let list = ds["datasources"].as_sequence().unwrap();
    let ch = list
        .iter()
        .find(|d| d["type"] == CH_PLUGIN)
        .expect("ClickHouse data source");
    assert!(ch["uid"].as_str().is_some_and(|u| !u.is_empty()));
    let user = ch["jsonData"]["username"].as_str().unwrap();
    assert_ne!(
        user, "default",
        "the data source must not log in as `default`"
    );
    assert!(ch["jsonData"]["host"].as_str().is_some());
    assert!(ch["jsonData"]["protocol"].as_str().is_some());
    assert!(ch["secureJsonData"]["password"].as_str().is_some());
    assert!(
        list.iter().all(|d| d["type"] == CH_PLUGIN),
        "every panel reads ClickHouse; no other data source is provisioned"
    );
    // The user named there exists in the users.d file, read-only.
    let xml = std::fs::read_to_string(prov.join("clickhouse/weft-grafana-user.xml")).unwrap();
    assert!(
        xml.contains(&format!("<{user}>")),
        "user {user} not defined"
    );
    assert!(xml.contains("<readonly>1</readonly>"));
    let dp: serde_yaml::Value =
        serde_yaml::from_slice(&std::fs::read(prov.join("dashboards/weft.yaml")).unwrap()).unwrap();
    let p = &dp["providers"][0];
    assert_eq!(p["type"], "file");
    assert!(p["options"]["path"].as_str().is_some());
    assert_eq!(dp["apiVersion"], 1);
    assert_eq!(ds["apiVersion"], 1);
}

/// One query through ClickHouse's HTTP interface as a read-only session: its columns and rows.
async fn run_sql(
    http: &reqwest::Client,
    db: &str,
    sql: &str,
) -> Result<(Vec<String>, Vec<Vec<Value>>), String> {
    run_sql_read(http, db, sql)
        .await
        .map(|(cols, rows, _)| (cols, rows))
}

/// What a query read, from ClickHouse's `X-ClickHouse-Summary` header.
#[derive(Debug, Clone, Copy)]
struct Read {
    rows: u64,
    bytes: u64,
}

/// [`run_sql`], with what the query read.
async fn run_sql_read(
    http: &reqwest::Client,
    db: &str,
    sql: &str,
) -> Result<(Vec<String>, Vec<Vec<Value>>, Read), String> {
    let r = http
        .post(common::clickhouse_url())
        .query(&[
            ("database", db),
            ("default_format", "JSONCompact"),
            ("readonly", "1"),
        ])
        .body(sql.to_owned())
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = r.status();
    let summary: Value = r
        .headers()
        .get("x-clickhouse-summary")
        .and_then(|v| serde_json::from_slice(v.as_bytes()).ok())
        .unwrap_or_default();
    // ClickHouse writes the summary's counts as strings.
    let count = |k: &str| summary[k].as_str().and_then(|v| v.parse().ok());
    let text = r.text().await.map_err(|e| e.to_string())?;
    if !status.is_success() {
        return Err(text);
    }
    let read = match (count("read_rows"), count("read_bytes")) {
        (Some(rows), Some(bytes)) => Read { rows, bytes },
        _ => return Err(format!("no X-ClickHouse-Summary read counts: {summary}")),
    };
    let v: Value = serde_json::from_str(&text).map_err(|e| format!("{e}: {text}"))?;
    let cols = v["meta"]
        .as_array()
        .ok_or(text.clone())?
        .iter()
        .map(|m| m["name"].as_str().unwrap_or_default().to_owned())
        .collect();
    let rows = v["data"]
        .as_array()
        .ok_or(text)?
        .iter()
        .map(|r| r.as_array().cloned().unwrap_or_default())
        .collect();
    Ok((cols, rows, read))
}

fn start_router(p: &Pipeline) -> (Proc, String) {
    p.router(
        KEY,
        TENANT,
        &[
            "--refresh-ms",
            "500",
            "--policy",
            "epsilon_greedy",
            "--epsilon",
            "0.3",
        ],
    )
}

/// `n` route -> feedback cycles over the router's HTTP API, 8 callers at once (each
/// feedback waits for its Kafka acknowledgement).
async fn route(base: &str, n: usize) {
    let http = reqwest::Client::new();
    let mut tasks = Vec::new();
    for w in 0..8 {
        let (http, base) = (http.clone(), base.to_owned());
        tasks.push(tokio::spawn(async move {
            for i in (w..n).step_by(8) {
                cycle(&http, &base, i).await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

async fn cycle(http: &reqwest::Client, base: &str, i: usize) {
    let req = json!({
        "context": {"intent": "summarize", "request_id": format!("dash-route-{i}")},
        "candidates": [
            {"candidate_id": "alpha", "candidate_type": "tool"},
            {"candidate_id": "beta", "candidate_type": "tool"}
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
    let fb = json!({
        "decision_id": d["decision_id"],
        "candidate_id": id,
        "success": id == "beta" || i.is_multiple_of(3),
        "timestamp": weft_schemas::time::now_rfc3339(),
        "latency_ms": if id == "beta" { 300 } else { 120 } + (i as u64 % 7) * 10,
        "cost": {"usd": if id == "beta" { 0.01 } else { 0.002 }},
    });
    let r = http
        .post(format!("{base}/v1/feedback"))
        .bearer_auth(KEY)
        .json(&fb)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 202, "{}", r.text().await.unwrap());
}

/// One garbage record: (topic suffix, value, `weft-kind` header, expected reason).
type Garbage = (
    &'static str,
    &'static [u8],
    Option<&'static [u8]>,
    &'static str,
);

/// A few records ingest cannot decode, so the dead-letter panels have rows. Returns the
/// expected reasons.
async fn publish_garbage(p: &Pipeline) -> Vec<&'static str> {
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let producer: FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", common::brokers())
        .create()
        .unwrap();
    let bad: [Garbage; 3] = [
        ("frames", &[0xff, 0xfe, 0x00, 0x13], None, "undecodable"),
        (
            "trace_events",
            b"{\"event_id\": \"e1\", ",
            None,
            "undecodable_json",
        ),
        ("handles", b"{}", Some(b"telemetry_blob"), "unknown_kind"),
    ];
    for (i, (suffix, value, kind, _)) in bad.iter().enumerate() {
        let mut headers = OwnedHeaders::new().insert(Header {
            key: "weft-tenant",
            value: Some(TENANT.as_bytes()),
        });
        if let Some(k) = kind {
            headers = headers.insert(Header {
                key: "weft-kind",
                value: Some(*k),
            });
        }
        let key = format!("garbage-{i}");
        producer
            .send(
                FutureRecord::to(&format!("{}{}", p.prefix, suffix))
                    .key(&key)
                    .payload(*value)
                    .headers(headers),
                Duration::from_secs(10),
            )
            .await
            .map_err(|(e, _)| e)
            .unwrap();
    }
    bad.iter().map(|b| b.3).collect()
}

/// Ingest writes its telemetry best effort, about once a second (lag every 5 s): poll until
/// every garbage record is a dead letter with its reason, and batches and lag samples exist.
async fn wait_for_telemetry(p: &Pipeline, reasons: &[&str]) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut want: Vec<String> = reasons.iter().map(|r| r.to_string()).collect();
    want.sort();
    loop {
        let mut got: Vec<String> = p
            .client()
            .query(
                "SELECT any(reason) FROM weft_dead_letters WHERE tenant = ? \
                 GROUP BY topic, partition, offset",
            )
            .bind(TENANT)
            .fetch_all()
            .await
            .unwrap();
        got.sort();
        let stored = p.scalar("SELECT sum(rows) FROM weft_ingest_batches").await;
        let dead = p.scalar("SELECT sum(dead) FROM weft_ingest_batches").await;
        let lag = p.scalar("SELECT count() FROM weft_ingest_lag").await;
        let facts = p.scalar("SELECT count() FROM weft_events").await;
        // Every stored fact was counted in some flush's batch row; every dead letter too.
        if got == want && stored == facts && dead == want.len() as u64 && lag > 0 {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "telemetry: dead letters {got:?} (want {want:?}), batch rows {stored} of {facts} \
             facts, batch dead {dead}, lag samples {lag}:\n{}",
            p.ingest_log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn now_micros() -> i64 {
    weft_schemas::time::parse_micros(&weft_schemas::time::now_rfc3339()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_panel_query_runs_on_simulated_data() {
    let started = std::time::Instant::now();
    let p = Pipeline::new("it_dash");
    let now = now_micros();
    let start = weft_schemas::time::micros_to_rfc3339(now - 20 * 60 * 1_000_000);
    // Every variation, often enough that each one occurs in 120 flows.
    let truth = p.simulate(&[
        "--flows",
        "120",
        "--seed",
        "77",
        "--tenant",
        TENANT,
        "--start",
        &start,
        "--deny",
        "0.08",
        "--failure",
        "0.08",
        "--partial",
        "0.05",
        "--expired-token",
        "0.05",
        "--reused-token",
        "0.05",
        "--out-of-scope",
        "0.05",
        "--unauthorized",
        "0.08",
        "--raw-output",
        "0.05",
        "--orphan",
        "0.05",
        "--id-conflict",
        "0.05",
        "--unknown-token",
        "0.05",
        "--pending-routing",
        "0.1",
    ]);
    for inv in ["I-01", "I-02", "I-06", "orphan", "id_conflict"] {
        let n = serde_json::to_value(&truth.totals.violations).unwrap()[inv].as_u64();
        assert!(
            n.unwrap_or(0) > 0,
            "seed 77 injects no {inv}: pick another seed"
        );
    }
    // I-06 `token_unknown` too (an allow decision naming a token never sent): the panel
    // must show it like the check's other I-06 rules.
    assert!(
        truth
            .requests
            .iter()
            .any(|r| r.scenario == weft_sim::Scenario::UnknownToken && !r.violations.is_empty()),
        "seed 77 injects no unknown token: pick another seed"
    );
    let _ingest = p.ingest(None);
    common::wait_for(Duration::from_secs(60), || {
        let log = p.ingest_log_all();
        log.contains("narrative projector loaded").then_some(())
    })
    .unwrap_or_else(|| panic!("ingest did not start:\n{}", p.ingest_log()));
    eprintln!("{:?}: ingest up", started.elapsed());
    let events = p.path("events.jsonl");
    p.publish(&events);
    let retry = p.path("retry.jsonl");
    let retried = retried_decision(&truth, &events, &retry);
    p.publish(&retry);
    let garbage = publish_garbage(&p).await;
    eprintln!("{:?}: published", started.elapsed());
    let (router, base) = start_router(&p);
    eprintln!("{:?}: router up", started.elapsed());
    const ROUTES: usize = 40;
    route(&base, ROUTES).await;
    eprintln!("{:?}: published and routed", started.elapsed());
    // Simulated facts + one decision and one feedback per route.
    let want = distinct_facts(&[events.as_path(), retry.as_path()]) + 2 * ROUTES as u64;
    p.wait_for_facts(want, Duration::from_secs(120)).await;
    eprintln!("{:?}: facts stored", started.elapsed());
    drop(router);
    // Narratives cover every stored identity.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let ids = p
            .scalar("SELECT uniqExact(kind, id) FROM weft_events")
            .await;
        let nodes = p
            .scalar("SELECT uniqExact(kind, id) FROM weft_narrative_nodes")
            .await;
        if nodes >= ids {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "narratives cover {nodes} of {ids} ids:\n{}",
            p.ingest_log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let out = p
        .weft()
        .args([
            "eval",
            "--tenant",
            TENANT,
            "--since-s",
            "3600",
            "--policy",
            "greedy",
        ])
        .args(["--bootstrap", "50", "--store", "--out"])
        .arg(p.path("eval.json"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "weft eval --store: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let artifact: Value =
        serde_json::from_slice(&std::fs::read(p.path("eval.json")).unwrap()).unwrap();
    assert_eq!(
        artifact["metrics"]["n"], ROUTES,
        "every routed decision evaluated"
    );
    eprintln!("{:?}: narratives and eval done", started.elapsed());
    wait_for_telemetry(&p, &garbage).await;
    eprintln!("{:?}: ingest telemetry stored", started.elapsed());

    let range = TimeRange {
        from_ms: (now - 2 * 3600 * 1_000_000) / 1000,
        to_ms: (now_micros() + 10 * 60 * 1_000_000) / 1000,
        interval_ms: 60_000,
    };
    let clean = clean_requests(&truth);
    let http = reqwest::Client::new();
    let expect = expectations();
    let mut checked = 0;
    let mut failures = Vec::new();
    for (file, d) in dashboards() {
        let uid = d["uid"].as_str().unwrap().to_owned();
        // Variables first, in order: a later one may depend on an earlier one.
        let mut vars: BTreeMap<&str, String> = BTreeMap::new();
        for v in d["templating"]["list"].as_array().unwrap() {
            // The grace period: every event was just ingested, so none (the check's
            // `--grace-secs 0`); any other textbox keeps its default.
            if v["type"] == "textbox" {
                let name = v["name"].as_str().unwrap();
                let value = match name {
                    "grace" => "0".to_owned(),
                    _ => v["query"].as_str().unwrap().to_owned(),
                };
                vars.insert(name, value);
                continue;
            }
            if v["type"] != "query" {
                continue;
            }
            let name = v["name"].as_str().unwrap();
            let sql = expand_macros(&interpolate(v["query"].as_str().unwrap(), &vars), range);
            let (_, rows) = run_sql(&http, &p.db, &sql)
                .await
                .unwrap_or_else(|e| panic!("{file}: variable {name}: {e}\n{sql}"));
            let values: Vec<String> = rows
                .iter()
                .map(|r| r[0].as_str().unwrap_or_default().to_owned())
                .collect();
            let value = match name {
                "tenant" => {
                    assert!(
                        values.iter().any(|t| t == TENANT),
                        "{file}: tenants {values:?}"
                    );
                    TENANT.to_owned()
                }
                // The trace panel shows a clean simulated flow (every step executed).
                "narrative" => values
                    .iter()
                    .find(|n| clean.contains(n.as_str()))
                    .cloned()
                    .unwrap_or_else(|| panic!("{file}: no clean flow in {values:?}")),
                _ => values.first().cloned().unwrap_or_default(),
            };
            vars.insert(name, value);
        }
        for panel in panels(&d) {
            if !is_ch(&panel["datasource"]) {
                continue;
            }
            let id = panel["id"].as_u64().unwrap().to_string();
            let title = panel["title"].as_str().unwrap();
            let (cols_want, non_empty) = &expect[&uid][&id];
            for t in panel["targets"].as_array().unwrap() {
                let sql = expand_macros(&interpolate(t["rawSql"].as_str().unwrap(), &vars), range);
                match run_sql(&http, &p.db, &sql).await {
                    Err(e) => failures.push(format!("{file}: {title}: {e}")),
                    Ok((cols, rows)) => {
                        checked += 1;
                        if &cols != cols_want {
                            failures.push(format!(
                                "{file}: {title}: columns {cols:?}, want {cols_want:?}"
                            ));
                        }
                        if *non_empty && rows.is_empty() {
                            failures.push(format!("{file}: {title}: no rows"));
                        }
                        if panel["title"] == "Invariant violations" {
                            check_violations(&truth, &retried, &cols, &rows, &mut failures);
                        }
                        if title == "Latest `weft eval` estimates" {
                            check_eval(&artifact, &cols, &rows, &mut failures);
                        }
                        if t["queryType"] == "traces" {
                            check_trace(&vars["narrative"], &cols, &rows, &mut failures);
                        }
                    }
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(checked >= 20, "only {checked} queries ran");
    eprintln!(
        "{checked} panel queries ok in {:?} (whole test)",
        started.elapsed()
    );
}

/// The eval panel shows the stored artifact's figures.
fn check_eval(artifact: &Value, cols: &[String], rows: &[Vec<Value>], failures: &mut Vec<String>) {
    let at = |c: &str| cols.iter().position(|x| x == c).unwrap();
    let want = artifact["candidate_policy"].as_str().unwrap();
    let Some(row) = rows.iter().find(|r| r[at("candidate_policy")] == want) else {
        return failures.push(format!("eval: no row for {want}: {rows:?}"));
    };
    // ClickHouse's JSON output quotes 64-bit integers.
    let num = |v: &Value| {
        v.as_f64()
            .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
    };
    for (col, metric) in [("n", "n"), ("ips", "ips"), ("snips", "snips"), ("dr", "dr")] {
        let got = num(&row[at(col)]);
        let exp = artifact["metrics"][metric].as_f64();
        if got.zip(exp).is_none_or(|(g, e)| (g - e).abs() > 1e-9) {
            failures.push(format!("eval: {col} = {got:?}, artifact says {exp:?}"));
        }
    }
}

/// The request ids of the simulated flows with no variation injected.
fn clean_requests(truth: &weft_sim::GroundTruth) -> BTreeSet<&str> {
    truth
        .requests
        .iter()
        .filter(|r| r.scenario == weft_sim::Scenario::Clean)
        .map(|r| r.request_id.as_str())
        .collect()
}

/// A kernel retry: an allow decision of a clean flow that spends a single-use token once
/// (and so breaks no invariant), written to `out` again with another reason, which ingest
/// stores as an id conflict. Returns the decision's id. The violations panel counted that
/// second version as a second use of the token (an I-06 finding `weft audit check` does
/// not make).
fn retried_decision(
    truth: &weft_sim::GroundTruth,
    events: &std::path::Path,
    out: &std::path::Path,
) -> String {
    let clean = clean_requests(truth);
    let lines: Vec<Value> = std::fs::read_to_string(events)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let single_use: BTreeSet<&str> = lines
        .iter()
        .filter(|e| e["kind"] == "capability_token" && e["payload"]["single_use"] == true)
        .filter_map(|e| e["payload"]["token_id"].as_str())
        .collect();
    let allows: Vec<&Value> = lines
        .iter()
        .filter(|e| e["kind"] == "policy_decision" && e["payload"]["decision"] == "allow")
        .collect();
    let uses = |t: &str| {
        allows
            .iter()
            .filter(|e| e["payload"]["token_id"] == t)
            .count()
    };
    let mut retry = allows
        .iter()
        .find(|e| {
            let t = e["payload"]["token_id"].as_str().unwrap_or_default();
            let request = e["request_id"].as_str().unwrap_or_default();
            clean.contains(request) && single_use.contains(t) && uses(t) == 1
        })
        .map(|e| (*e).clone())
        .expect("an allow decision spending a single-use token once");
    retry["payload"]["reason"] = json!("retried by the kernel (dashboards test)");
    std::fs::write(out, format!("{retry}\n")).unwrap();
    retry["payload"]["decision_id"].as_str().unwrap().to_owned()
}

/// The violation table names exactly the injected violations (and the retried decision's id
/// conflict): (rule, subject kind, id).
fn check_violations(
    truth: &weft_sim::GroundTruth,
    retried: &str,
    cols: &[String],
    rows: &[Vec<Value>],
    failures: &mut Vec<String>,
) {
    let mut want: BTreeSet<(String, String, String)> = truth
        .requests
        .iter()
        .flat_map(|r| &r.violations)
        .map(|v| {
            (
                v.invariant.as_str().to_owned(),
                v.subject.kind.as_str().to_owned(),
                v.subject.id.clone(),
            )
        })
        .collect();
    // The retried decision is an id conflict, and still one use of its single-use token.
    want.insert((
        "id_conflict".into(),
        "policy_decision".into(),
        retried.into(),
    ));
    let at = |c: &str| cols.iter().position(|x| x == c).unwrap();
    let (r, k, i) = (at("rule"), at("subject_kind"), at("subject_id"));
    let got: BTreeSet<(String, String, String)> = rows
        .iter()
        .map(|row| {
            let s = |j: usize| row[j].as_str().unwrap_or_default().to_owned();
            (s(r), s(k), s(i))
        })
        .collect();
    if got != want {
        failures.push(format!(
            "violations: missing {:?}, unexpected {:?}",
            want.difference(&got).collect::<Vec<_>>(),
            got.difference(&want).collect::<Vec<_>>()
        ));
    }
}

/// The trace is one tree rooted at the narrative, with a decision -> execution -> frame ->
/// handle chain, and every row carries the trace panel's fields.
fn check_trace(narrative: &str, cols: &[String], rows: &[Vec<Value>], failures: &mut Vec<String>) {
    let at = |c: &str| cols.iter().position(|x| x == c).unwrap();
    let (tr, sp, pa, dur) = (
        at("traceID"),
        at("spanID"),
        at("parentSpanID"),
        at("duration"),
    );
    let spans: BTreeSet<&str> = rows.iter().filter_map(|r| r[sp].as_str()).collect();
    let mut parent_of = BTreeMap::new();
    let mut roots = 0;
    for r in rows {
        if r[tr].as_str() != Some(narrative) {
            failures.push(format!("trace: row of another trace {r:?}"));
        }
        let (s, par) = (r[sp].as_str().unwrap_or(""), r[pa].as_str().unwrap_or(""));
        if par.is_empty() {
            roots += 1;
        } else if !spans.contains(par) {
            failures.push(format!("trace: {s} has unknown parent {par}"));
        }
        if !r[dur].as_f64().is_some_and(|d| d >= 0.0) {
            failures.push(format!("trace: {s} has duration {:?}", r[dur]));
        }
        parent_of.insert(s, par);
    }
    if roots != 1 {
        failures.push(format!("trace: {roots} roots"));
    }
    let chain = parent_of.iter().any(|(s, f)| {
        s.starts_with("handle:")
            && f.starts_with("frame:")
            && parent_of.get(f).is_some_and(|e| {
                e.starts_with("trace_event:")
                    && parent_of
                        .get(e)
                        .is_some_and(|d| d.starts_with("policy_decision:"))
            })
    });
    if !chain {
        failures.push(format!(
            "trace: no decision -> execution -> frame -> handle chain in {parent_of:?}"
        ));
    }
}

/// The violations panel's grace period (`$grace`, the check's `--grace-secs`), on the real
/// ClickHouse: an I-02 finding a late event could still undo (a PolicyDecision no TraceEvent
/// names yet, an execution whose `capability_authorized` has not arrived) is not shown while
/// its events were ingested less than the grace period ago, and is shown once they were
/// ingested longer ago; an execution naming no decision is shown at once. The grace is the
/// variable, so no clock has to pass: every event is seconds old, so a grace of an hour holds
/// them and a grace of 0 has passed. The panel and `weft audit check` agree at both.
/// Finding: an execution on an allow decision that a stored `capability_denied` TraceEvent
/// also names was `execution_after_deny` for the check, at once, and nothing for the panel
/// (or, past the grace and without `capability_authorized`, the wrong rule): it is now
/// "executed after a deny" at once there too. Finding: an execution whose
/// `capability_authorized` carries a later event time was `authorized_after_execution` for
/// the check, past the grace, and nothing for the panel: it is now "executed before its
/// capability_authorized" there too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_violations_panel_waits_the_grace_period_like_the_check() {
    let p = Pipeline::new("it_dash_grace");
    let now = now_micros();
    let at = |ms: i64| weft_schemas::time::micros_to_rfc3339(now - 60_000_000 + ms * 1000);
    let cap = "org.weaver.web_search";
    let decision = |id: &str, ts: &str| {
        format!(
            r#"{{"kind":"policy_decision","request_id":"r-grace","payload":{{"decision_id":"{id}","decision":"allow","capability_id":"{cap}","principal":"p","reason":"r","timestamp":"{ts}"}}}}"#
        )
    };
    let executed = |id: &str, decision: Option<&str>, ts: &str| {
        let decision = decision
            .map(|d| format!(r#","decision_id":"{d}""#))
            .unwrap_or_default();
        format!(
            r#"{{"kind":"trace_event","request_id":"r-grace","payload":{{"event_id":"{id}","event_type":"capability_executed","timestamp":"{ts}","capability_id":"{cap}","principal":"p"{decision},"outcome":"success"}}}}"#
        )
    };
    let traced = |id: &str, event_type: &str, decision: &str, ts: &str| {
        format!(
            r#"{{"kind":"trace_event","request_id":"r-grace","payload":{{"event_id":"{id}","event_type":"{event_type}","timestamp":"{ts}","capability_id":"{cap}","principal":"p","decision_id":"{decision}"}}}}"#
        )
    };
    let lines = [
        // No TraceEvent names it (yet): `decision_untraced`, past the grace period.
        decision("pd-untraced", &at(0)),
        // Executed on an allow, but no capability_authorized (yet): past the grace period.
        decision("pd-unauthorized", &at(100)),
        executed("te-unauthorized", Some("pd-unauthorized"), &at(200)),
        // Names no decision: no late event can undo it, shown at once.
        executed("te-bypass", None, &at(300)),
        // An allow, authorized, but also denied by a stored capability_denied: executed
        // after a deny, shown at once (no late event can undo the deny).
        decision("pd-denied", &at(400)),
        traced("te-denied", "capability_denied", "pd-denied", &at(500)),
        traced(
            "te-authorized",
            "capability_authorized",
            "pd-denied",
            &at(510),
        ),
        executed("te-after-deny", Some("pd-denied"), &at(600)),
        // An allow whose capability_authorized carries an event time after the execution's:
        // the check's `authorized_after_execution`, past the grace period.
        decision("pd-late", &at(700)),
        executed("te-before-auth", Some("pd-late"), &at(800)),
        traced(
            "te-late-authorized",
            "capability_authorized",
            "pd-late",
            &at(900),
        ),
    ];
    let _ingest = p.ingest_events("grace.jsonl", &lines).await;

    let board = dashboards()
        .into_iter()
        .map(|(_, d)| d)
        .find(|d| d["uid"] == "weft-compliance")
        .expect("the compliance dashboard");
    let panel = panels(&board)
        .into_iter()
        .find(|p| p["title"] == "Invariant violations" && p["type"] == "table")
        .cloned()
        .expect("the violations table");
    let sql = panel["targets"][0]["rawSql"].as_str().unwrap().to_owned();
    let range = TimeRange {
        from_ms: (now - 2 * 3600 * 1_000_000) / 1000,
        to_ms: (now + 10 * 60 * 1_000_000) / 1000,
        interval_ms: 60_000,
    };
    let (from, to) = (
        weft_schemas::time::micros_to_rfc3339(now - 3600 * 1_000_000),
        weft_schemas::time::micros_to_rfc3339(now + 10 * 60 * 1_000_000),
    );
    let http = reqwest::Client::new();
    let subjects = |pairs: &[(&str, &str)]| -> BTreeSet<(String, String)> {
        pairs
            .iter()
            .map(|(k, i)| ((*k).to_owned(), (*i).to_owned()))
            .collect()
    };
    let at_once = [
        ("trace_event", "te-bypass"),
        ("trace_event", "te-after-deny"),
    ];
    let cases = [
        ("3600", subjects(&at_once)),
        (
            "0",
            subjects(&[
                at_once[0],
                at_once[1],
                ("trace_event", "te-unauthorized"),
                ("trace_event", "te-before-auth"),
                ("policy_decision", "pd-untraced"),
            ]),
        ),
    ];
    for (grace, want) in cases {
        let vars = BTreeMap::from([
            ("tenant", weft_schemas::DEFAULT_TENANT.to_owned()),
            ("grace", grace.to_owned()),
        ]);
        let q = expand_macros(&interpolate(&sql, &vars), range);
        let (cols, rows) = run_sql(&http, &p.db, &q)
            .await
            .unwrap_or_else(|e| panic!("violations panel: {e}\n{q}"));
        let at = |c: &str| cols.iter().position(|x| x == c).unwrap();
        let details: BTreeMap<(String, String), String> = rows
            .iter()
            .filter(|r| r[at("rule")] == "I-02")
            .map(|r| {
                let s = |c: &str| r[at(c)].as_str().unwrap_or_default().to_owned();
                ((s("subject_kind"), s("subject_id")), s("detail"))
            })
            .collect();
        let shown: BTreeSet<(String, String)> = details.keys().cloned().collect();
        assert_eq!(shown, want, "panel, grace {grace} s: {rows:?}");
        assert_eq!(
            details[&("trace_event".to_owned(), "te-after-deny".to_owned())],
            "executed after a deny",
            "panel, grace {grace} s: {rows:?}"
        );
        let out = common::pipeline::check(
            p.weft()
                .args(["audit", "check", "--format", "json", "--grace-secs", grace])
                .args(["--from", &from, "--to", &to])
                .output()
                .unwrap(),
            "weft audit check",
        );
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        let found: BTreeSet<(String, String)> = common::findings(&report, "I-02")
            .iter()
            .map(|f| {
                let s = |v: &Value| v.as_str().unwrap_or_default().to_owned();
                (s(&f["subject"]["kind"]), s(&f["subject"]["id"]))
            })
            .collect();
        assert_eq!(found, want, "weft audit check, grace {grace} s: {report:#}");
        let rule_of = |id: &str| {
            common::findings(&report, "I-02")
                .iter()
                .find(|f| f["subject"]["id"] == id)
                .map(|f| f["rule"].clone())
        };
        assert_eq!(
            rule_of("te-after-deny"),
            Some(json!("execution_after_deny")),
            "weft audit check, grace {grace} s: {report:#}"
        );
        if grace == "0" {
            assert_eq!(
                details[&("trace_event".to_owned(), "te-before-auth".to_owned())],
                "executed before its capability_authorized",
                "panel, grace {grace} s: {rows:?}"
            );
            assert_eq!(
                rule_of("te-before-auth"),
                Some(json!("authorized_after_execution")),
                "weft audit check, grace {grace} s: {report:#}"
            );
        }
    }
}

/// The one row of an answer that must have exactly one, by column name.
fn only_row<'a>(
    cols: &'a [String],
    rows: &'a [Vec<Value>],
    what: &str,
) -> impl Fn(&str) -> &'a Value {
    assert_eq!(rows.len(), 1, "{what}: {rows:?}");
    move |c| {
        &rows[0][cols
            .iter()
            .position(|x| x == c)
            .unwrap_or_else(|| panic!("no column {c}"))]
    }
}

/// The narrative panels and the narrative picker read what their range or narrative needs,
/// not the tenant's history. With 200,000 older members of 10,000 narratives (each member
/// with a 1 KB payload, and a node row each), over the last hour: the Narratives panel and
/// the picker read the history's times but none of its keys or payloads, and the Failed
/// narratives and trace panels read one narrative's rows. They used to read every member's
/// payload (4.8 GB and 17 s at 10M events), every node row, every trace event's node row,
/// and every node row five times (25 s):
/// docs/BENCHMARKS.md, "Dashboards at 10M events".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_narrative_panels_read_their_range_not_the_history() {
    const HISTORY: u64 = 200_000;
    const PAD: u64 = 1_000;
    let p = Pipeline::new("it_dash_read");
    let c = p.client();
    let history =
        "SELECT {t:String} AS tenant, concat('old-', toString(intDiv(number, 20))) AS nid, \
        'trace_event' AS kind, concat('te-old-', toString(number)) AS id, \
        addSeconds(now64(6) - toIntervalDay(30), number) AS at FROM numbers({n:UInt64})";
    c.query(&format!(
        "INSERT INTO weft_narratives (tenant, narrative_id, kind, id, content_hash, ts, \
         request_id, payload, version, is_deleted) \
         SELECT tenant, nid, kind, id, toFixedString(leftPad(id, 32, '0'), 32), at, nid, \
           concat('{{\"principal\":\"agent-old\",\"x_test_pad\":\"', repeat('x', {{pad:UInt64}}), '\"}}'), 1, 0 \
         FROM ({history})"
    ))
    .param("t", TENANT)
    .param("n", HISTORY)
    .param("pad", PAD)
    .execute()
    .await
    .unwrap();
    c.query(&format!(
        "INSERT INTO weft_narrative_nodes (tenant, kind, id, narrative_id, request_id, ts, version) \
         SELECT tenant, kind, id, nid, nid, at, 1 FROM ({history})"
    ))
    .param("t", TENANT)
    .param("n", HISTORY)
    .execute()
    .await
    .unwrap();
    // The narrative of the last hour: five trace events (the last one its flow failing),
    // stored as facts and as members.
    const NEW: &str = "req-recent";
    let recent = "SELECT {t:String} AS tenant, 'trace_event' AS kind, \
        concat('te-recent-', toString(number)) AS id, \
        toFixedString(leftPad(toString(number), 32, '0'), 32) AS hash, \
        addSeconds(now64(6) - toIntervalMinute(10), number) AS at, \
        if(number = 4, 'flow_failed', 'capability_executed') AS type, \
        concat('{\"event_id\":\"te-recent-', toString(number), '\",\"event_type\":\"', type, \
          '\",\"principal\":\"agent-new\",\"error_message\":\"boom\"}') AS body \
        FROM numbers(5)";
    for sql in [
        format!(
            "INSERT INTO weft_events (tenant, kind, id, content_hash, ts, request_id, event_type, \
             principal, payload) \
             SELECT tenant, kind, id, hash, at, {{r:String}}, type, 'agent-new', body \
             FROM ({recent})"
        ),
        format!(
            "INSERT INTO weft_narratives (tenant, narrative_id, kind, id, content_hash, ts, \
             request_id, payload, version, is_deleted) \
             SELECT tenant, {{r:String}}, kind, id, hash, at, {{r:String}}, body, 1, 0 FROM ({recent})"
        ),
        format!(
            "INSERT INTO weft_narrative_nodes (tenant, kind, id, narrative_id, request_id, ts, version) \
             SELECT tenant, kind, id, {{r:String}}, {{r:String}}, at, 1 FROM ({recent})"
        ),
    ] {
        c.query(&sql)
            .param("t", TENANT)
            .param("r", NEW)
            .execute()
            .await
            .unwrap();
    }

    let (_, d) = dashboards()
        .into_iter()
        .find(|(_, d)| d["uid"] == "weft-compliance")
        .unwrap();
    let now = now_micros() / 1000;
    let range = TimeRange {
        from_ms: now - 3600 * 1000,
        to_ms: now + 60 * 1000,
        interval_ms: 60_000,
    };
    let vars = BTreeMap::from([("tenant", TENANT.to_owned()), ("narrative", NEW.to_owned())]);
    let http = reqwest::Client::new();
    let run = |sql: &str| {
        let sql = expand_macros(&interpolate(sql, &vars), range);
        let http = http.clone();
        let db = p.db.clone();
        async move {
            run_sql_read(&http, &db, &sql)
                .await
                .unwrap_or_else(|e| panic!("{e}\n{sql}"))
        }
    };
    // What reading the history's times costs (8 bytes a row), and one more granule of
    // keys at most (the last granule of the history may hold the recent rows too). The
    // history's keys are 40-odd bytes a row and its payloads over PAD.
    let times = HISTORY * 8 + (1 << 20);

    let picker = d["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "narrative")
        .unwrap();
    let (_, rows, read) = run(picker["query"].as_str().unwrap()).await;
    assert_eq!(
        rows,
        vec![vec![json!(NEW)]],
        "the picker over the last hour"
    );
    assert!(
        read.bytes < times,
        "the picker read {read:?} for a range without history, over its times ({times} bytes)"
    );

    let panel = |title: &str| {
        panels(&d)
            .into_iter()
            .find(|p| p["title"] == title)
            .unwrap_or_else(|| panic!("no panel {title}"))["targets"][0]["rawSql"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let (cols, rows, read) = run(&panel("Narratives")).await;
    let col = only_row(&cols, &rows, "the Narratives panel over the last hour");
    assert_eq!(col("narrative_id"), &json!(NEW));
    assert_eq!(col("principals"), &json!("agent-new"));
    assert_eq!(col("failed"), &json!(1));
    // ClickHouse's JSON output quotes 64-bit integers.
    assert_eq!(col("events").to_string().trim_matches('"'), "5");
    assert!(
        read.bytes < times,
        "the Narratives panel read {read:?} for a range without history, over its times \
         ({times} bytes)"
    );

    let (cols, rows, read) = run(&panel("Failed narratives")).await;
    let col = only_row(&cols, &rows, "the failed narratives of the last hour");
    assert_eq!(col("narrative_id"), &json!(NEW));
    assert_eq!(col("error"), &json!("boom"));
    assert!(
        read.rows < HISTORY,
        "the Failed narratives panel read {read:?} for one failing event, \
         beside {HISTORY} node rows of other trace events"
    );

    let (_, rows, read) = run(&panel("Narrative trace: decision -> frame -> handle")).await;
    assert_eq!(
        rows.len(),
        6,
        "the narrative's span and its 5 members: {rows:?}"
    );
    assert!(
        read.rows < HISTORY,
        "the trace panel read {read:?} for one narrative of 5 members, \
         beside {HISTORY} node rows of others"
    );
}

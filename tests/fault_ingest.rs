//! Fault injection for `weft ingest` on the real stack. These tests stop services and kill
//! processes, so the test command runs this file alone, one test at a time.
//!
//! - SIGKILL at ten or more points during a large ingest, each followed by a restart: the
//!   final facts and narratives are exact (WEFT_FAULT_EVENTS sets the size; default 1M).
//! - ClickHouse stopped for 30 s in the middle of an ingest: nothing lost, nothing twice.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::pipeline::{distinct_facts, free_port, truth_membership, Pipeline, Proc};

fn stack(args: &[&str]) {
    let st = Command::new("bash")
        .arg(common::repo_root().join("deploy/local/stack.sh"))
        .args(args)
        .status()
        .unwrap();
    assert!(st.success(), "stack.sh {args:?} failed");
}

/// Restarts ClickHouse even if the test fails half-way.
struct ClickHouseBack;
impl Drop for ClickHouseBack {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(common::repo_root().join("deploy/local/stack.sh"))
            .args(["start", "clickhouse"])
            .status();
    }
}

/// The narrative graph's budget in the SIGKILL test: far below the test's events, so passes
/// evict and load components all the time and kills land inside loads too.
const SMALL_GRAPH: &[&str] = &["--narrative-max-nodes", "2000"];

/// What the narrative passes of the killed processes did, summed from each one's `/metrics`
/// read just before its kill (a lower bound: passes after the read are not counted).
#[derive(Debug, Default)]
struct Paths {
    projected: u64,
    direct: u64,
    loaded: u64,
    evicted: u64,
}

impl Paths {
    async fn add(&mut self, addr: &str) {
        let m = |name| common::metric(addr, name);
        self.projected += m("weft_narrative_projected_total").await.unwrap_or(0);
        self.direct += m("weft_narrative_direct_total").await.unwrap_or(0);
        self.loaded += m("weft_narrative_loaded_nodes_total").await.unwrap_or(0);
        self.evicted += m("weft_narrative_evicted_nodes_total").await.unwrap_or(0);
    }
}

/// Facts and narratives exact after 11 SIGKILLs, with a narrative graph that holds a small
/// part of them. Runs on tansu's sqlite engine. Its memory engine answers a fetch that starts
/// inside a record batch from the next batch, which every restart meets; ingest seeks back
/// for those records (`consumers/src/ingest/resume.rs`: 552 seeks, no gap, in a 50k-event run
/// on memory) and drops the copies of taken records that the memory engine delivers again
/// after them (session 30: passes on memory at 100k events). deploy/local/README.md, Known
/// limits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_ingest_survives_repeated_sigkill() {
    let events: u64 = std::env::var("WEFT_FAULT_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let p = Pipeline::new("it_kill");
    let events_s = events.to_string();
    let truth = p.simulate(&[
        "--events",
        &events_s,
        "--seed",
        "11",
        "--shuffle",
        "--no-request-id",
        "0.1",
        "--duplicates",
        "0.02",
    ]);
    let file = p.path("events.jsonl");
    p.publish(&file);
    let want = distinct_facts(&[&file]);
    assert_eq!(want, truth.totals.distinct_events);

    // Kill at 11 points spread over the run, each chosen by progress (a stored-row count)
    // plus a pseudo-random jitter, so the kills land mid-batch at different stages.
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut kills = 0;
    let mut paths = Paths::default();
    let mut addr = format!("127.0.0.1:{}", free_port());
    let mut ingest = p.ingest_args(Some(&addr), &[], SMALL_GRAPH);
    let started = Instant::now();
    for k in 1..=11u64 {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let jitter = (seed >> 33) % (want / 40).max(1);
        let threshold = (want * k / 13 + jitter).min(want - 1);
        let deadline = Instant::now() + Duration::from_secs(600);
        loop {
            let n = p.scalar("SELECT count() FROM weft_events").await;
            assert!(
                n <= want,
                "more rows ({n}) than distinct events ({want}): a duplicate was stored"
            );
            if n >= threshold {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "stalled at {n}/{want}:\n{}",
                p.ingest_log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        paths.add(&addr).await;
        ingest.sigkill();
        kills += 1;
        addr = format!("127.0.0.1:{}", free_port());
        ingest = p.ingest_args(Some(&addr), &[], SMALL_GRAPH);
    }
    assert!(kills >= 10);
    p.wait_for_facts(want, Duration::from_secs(900)).await;
    assert_eq!(
        p.scalar("SELECT count() FROM weft_events").await,
        want,
        "exact count after {kills} kills"
    );
    assert_eq!(
        p.scalar("SELECT uniqExact(tenant, kind, id, content_hash) FROM weft_events")
            .await,
        want
    );
    p.wait_for_narratives(&truth_membership(&truth), Duration::from_secs(300))
        .await;
    // Every resume point was served exactly by the broker (no record was skipped over).
    let log = p.ingest_log_all();
    assert!(
        !log.contains("the broker skipped offsets"),
        "the broker skipped offsets on resume:\n{}",
        p.ingest_log()
    );
    // The kills must have hit both placements and the cache: events placed directly and
    // through the graph, components evicted and loaded back (else this test would not
    // cover them).
    paths.add(&addr).await;
    assert!(
        paths.direct > 0 && paths.projected > paths.direct,
        "both placements taken: {paths:?}"
    );
    assert!(
        paths.evicted > 0 && paths.loaded > 0,
        "evicted and loaded: {paths:?}"
    );
    eprintln!(
        "{events} events, {kills} SIGKILLs, exact in {:.0}s; {paths:?}",
        started.elapsed().as_secs_f64()
    );
    drop(ingest);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_clickhouse_outage_loses_and_duplicates_nothing() {
    let p = Pipeline::new("it_chdown");
    let truth = p.simulate(&["--events", "60000", "--seed", "12", "--duplicates", "0.02"]);
    let file = p.path("events.jsonl");
    let want = distinct_facts(&[&file]);
    // Facts and narratives in two processes, so that every flush of the facts process is a
    // facts insert: with one process a flush is a facts insert and a narrative pass side by
    // side, and an outage that begins after the insert landed meets only the pass.
    let ingest = p.ingest_args(None, &[], &["--role", "facts"]);
    let narratives = p.ingest_args(None, &[], &["--role", "narratives"]);
    // Half the events go out before the outage and half during it, so that the facts
    // process has records to insert while ClickHouse is down whatever the machine's speed
    // (with everything published first, a fast facts process had stored it all before the
    // outage began, and only the narratives process met it).
    let text = std::fs::read_to_string(&file).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let (before, during) = (p.path("before.jsonl"), p.path("during.jsonl"));
    let half = lines.len() / 2;
    std::fs::write(&before, lines[..half].join("\n") + "\n").unwrap();
    std::fs::write(&during, lines[half..].join("\n") + "\n").unwrap();
    p.publish(&before);
    // Stop ClickHouse once the facts process holds every partition (it has stored rows of
    // each): a rebalance landing in the outage would retry its progress read instead of an
    // insert.
    let kinds: std::collections::BTreeSet<String> = lines
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["kind"].as_str().map(str::to_owned))
        .collect();
    let partitions = kinds.len() as u64 * 4;
    p.wait_for_count(
        "SELECT uniqExact(topic, partition) FROM weft_events",
        partitions,
        Duration::from_secs(300),
    )
    .await;
    let back = ClickHouseBack;
    let logged_before = p.ingest_log_all().len();
    stack(&["stop", "clickhouse"]);
    // The outage itself: ingest keeps reading, fails its inserts and must not commit. It
    // lasts until a facts insert has failed (this message is the facts insert's alone, not a
    // metadata or progress read's), so the test cannot pass without meeting one.
    p.publish(&during);
    let failed = common::wait_for(Duration::from_secs(300), || {
        p.ingest_log_all()
            .get(logged_before..)?
            .contains("insert failed; offsets not committed, retrying")
            .then_some(())
    });
    stack(&["start", "clickhouse"]);
    drop(back);
    assert!(
        failed.is_some(),
        "no facts insert failed during the outage, so the test proved nothing:\n{}",
        p.ingest_log()
    );
    p.wait_for_facts(want, Duration::from_secs(600)).await;
    assert_eq!(p.scalar("SELECT count() FROM weft_events").await, want);
    assert_eq!(
        p.scalar("SELECT uniqExact(tenant, kind, id, content_hash) FROM weft_events")
            .await,
        want
    );
    p.wait_for_narratives(&truth_membership(&truth), Duration::from_secs(120))
        .await;
    assert_eq!(
        ingest.terminate().code(),
        Some(0),
        "ingest survived the outage and stops cleanly"
    );
    assert_eq!(
        narratives.terminate().code(),
        Some(0),
        "so does the narratives process"
    );
}

/// Simulate `flows` flows of `seed` into the file `name` of the pipeline's folder and
/// publish them; the file's path.
fn publish_flows(p: &Pipeline, name: &str, flows: &str, seed: &str) -> std::path::PathBuf {
    let file = p.path(name);
    let out = p
        .weft()
        .args(["simulate", "--flows", flows, "--seed", seed, "--out"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(out.status.success(), "weft simulate: {out:?}");
    p.publish(&file);
    file
}

/// A topic deleted and recreated (or truncated) under a running pipeline starts again below
/// the offsets weft has stored. Ingest must stop with a clear error instead of taking the new
/// log's records for stored ones; and a restart of a caught-up ingest must not trip it.
/// (On the sqlite log: tansu's memory engine reports a high watermark one short, which turns
/// every caught-up resume into such a reset.)
///
/// The topic is NOT deleted here: on tansu 0.6 deleting one topic deletes every topic of the
/// broker (and has wiped the sqlite store under a fetching consumer), so weft's tests and
/// scripts refuse topic deletion (`stack.sh delete-topic`, `tests/deploy_static.rs`). The
/// same state -- weft's resume point past the log's end -- is made from the other side: the
/// stored offsets of one partition are moved past the broker's end, as if the log had been
/// cut back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_ingest_refuses_a_recreated_topic() {
    let p = Pipeline::new("it_recreate");
    p.simulate(&["--flows", "20", "--seed", "31"]);
    let file = p.path("events.jsonl");
    let want = distinct_facts(&[&file]);
    p.publish(&file);
    let ingest = p.ingest(None);
    p.wait_for_facts(want, Duration::from_secs(120)).await;
    assert_eq!(ingest.terminate().code(), Some(0));

    // Caught up: a restart resumes at the end of every partition without complaint.
    let ingest = p.ingest(None);
    common::wait_for(Duration::from_secs(60), || {
        let log = p.ingest_log_all();
        (log.matches("assigned every partition").count() >= 2).then_some(())
    })
    .expect("second ingest did not start");
    // ... and goes on storing from there (its first fetches are past the resume points).
    let more = publish_flows(&p, "more.jsonl", "1", "33");
    p.wait_for_facts(distinct_facts(&[&file, &more]), Duration::from_secs(120))
        .await;
    assert_eq!(ingest.terminate().code(), Some(0), "{}", p.ingest_log());

    // The log of one trace-event partition now ends 1000 offsets before weft's resume point,
    // for the facts and for the narratives alike (ingest resumes at the lower of the two).
    let topic = format!("{}trace_events", p.prefix);
    let partition: u32 = p
        .client()
        .query("SELECT partition FROM weft_events WHERE topic = ? ORDER BY partition LIMIT 1")
        .bind(&topic)
        .fetch_one()
        .await
        .unwrap();
    for sql in [
        "INSERT INTO weft_events SELECT * REPLACE (offset + 1000 AS offset, \
         concat(id, '-cut') AS id) FROM weft_events WHERE topic = ? AND partition = ? \
         ORDER BY offset DESC LIMIT 1",
        "INSERT INTO weft_projector_progress SELECT topic, partition, offset + 1000, version + 1, shard \
         FROM weft_projector_progress WHERE topic = ? AND partition = ? \
         ORDER BY version DESC LIMIT 1",
    ] {
        p.client()
            .query(sql)
            .bind(&topic)
            .bind(partition)
            .execute()
            .await
            .unwrap();
    }
    publish_flows(&p, "fresh.jsonl", "2", "32");

    let ingest = p.ingest(None);
    stops_on_the_rewound_log(&p, ingest, &topic, "ingest");

    // A facts-role group member (a fresh group, so it reads every partition from its start)
    // meets the same log when the partition's first record reaches it, and stops too; it
    // used to skip that log's records as stored ones.
    let group = common::unique("facts");
    let member = p.ingest_args(None, &[], &["--role", "facts", "--group", &group]);
    stops_on_the_rewound_log(&p, member, &topic, "a facts member");
}

/// `ingest` exits with an error, and the log gains a clear one naming `topic`.
fn stops_on_the_rewound_log(p: &Pipeline, mut ingest: Proc, topic: &str, what: &str) {
    let said = || p.ingest_log_all().matches("recreated or truncated").count();
    let before = said();
    let status = ingest
        .exit_within(Duration::from_secs(120))
        .unwrap_or_else(|| {
            panic!(
                "{what} kept running on a recreated topic:\n{}",
                p.ingest_log()
            )
        });
    assert!(!status.success(), "{what} must fail on a rewound partition");
    assert!(
        said() > before && p.ingest_log_all().contains(topic),
        "{what}: no clear error naming the topic:\n{}",
        p.ingest_log()
    );
}

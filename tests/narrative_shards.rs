//! Several narrative processes (tenant sharding, docs/NARRATIVES.md "Several processes"): one
//! `--role facts` process stores the facts while two `--role narratives` processes,
//! `--narrative-shard 0/2` and `1/2`, share the tenants. Four tenants, two per shard, their
//! streams shuffled together with late events and events without a request id; two of them
//! (in different shards) use the same simulator seed, so the same ids exist under two tenants.
//! Shard 1 is SIGKILLed half-way through the stream and restarted after the rest has been
//! published. The narratives must equal the ground truth (the one-process result) for every
//! event of every tenant, each shard must have projected exactly its own tenants (a share of
//! the work, not all or none of it), and `weft rebuild` must give the same narratives.
//!
//! The restarted shard resumes mid-partition, so this runs in the sqlite phase of
//! `deploy/local/test.sh` (tansu's memory engine answers a fetch that starts inside a record
//! batch from the next batch); since ingest seeks back when that happens
//! (`consumers/src/ingest/resume.rs`) it passes on the memory engine too. It only kills its
//! own `weft` processes.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::pipeline::{check, first_difference, free_port, Pipeline, Proc};
use weft_consumers::narrative::shard::NarrativeShard;
use weft_sim::GroundTruth;

/// (tenant, narrative id) -> its live members as (kind, id).
type Membership = BTreeMap<(String, String), BTreeSet<(String, String)>>;

/// Small budgets, as in `tests/ingest_narratives.rs`: passes evict and load components.
const NARRATIVE_ARGS: &[&str] = &[
    "--role",
    "narratives",
    "--narrative-max-nodes",
    "150",
    "--batch-max-rows",
    "50",
];

fn shard(i: u32) -> NarrativeShard {
    NarrativeShard::new(i, 2).unwrap()
}

/// Two tenants of each shard, from a fixed list (the hash decides which shard is whose).
fn tenants() -> [[String; 2]; 2] {
    let names = [
        "acme",
        "globex",
        "initech",
        "umbrella",
        "hooli",
        "stark",
        "wayne",
        "tyrell",
        "cyberdyne",
        "soylent",
    ];
    let of = |s: NarrativeShard| -> [String; 2] {
        let mine: Vec<String> = names
            .iter()
            .filter(|t| s.owns(t))
            .take(2)
            .map(|t| t.to_string())
            .collect();
        mine.try_into()
            .expect("two tenants of the shard in the list")
    };
    [of(shard(0)), of(shard(1))]
}

/// Simulate one tenant's stream of one round: its main events, its late ones and the truth.
fn simulate(p: &Pipeline, round: u32, tenant: &str, seed: u64) -> GroundTruth {
    let path = |what: &str| p.path(&format!("{what}-{round}-{tenant}"));
    let out = p
        .weft()
        .args(["simulate", "--flows", "30", "--seed", &seed.to_string()])
        .args(["--tenant", tenant, "--shuffle", "--no-request-id", "0.2"])
        .args(["--delay", "0.1", "--held-back-out"])
        .arg(path("late.jsonl"))
        .arg("--out")
        .arg(path("main.jsonl"))
        .arg("--truth")
        .arg(path("truth.json"))
        .output()
        .unwrap();
    check(out, "weft simulate");
    serde_json::from_slice(&std::fs::read(path("truth.json")).unwrap()).unwrap()
}

/// One round of traffic: every tenant's stream (tenant, seed), shuffled together. Returns
/// the expected membership, the main lines and the late lines.
fn round(p: &Pipeline, n: u32, plan: &[(&String, u64)]) -> (Membership, Vec<String>, Vec<String>) {
    let mut want = Membership::new();
    let (mut mains, mut lates) = (Vec::new(), Vec::new());
    for (tenant, seed) in plan {
        let truth = simulate(p, n, tenant, *seed);
        assert!(truth.totals.held_back > 0 && truth.totals.without_request_id > 0);
        for r in &truth.requests {
            let members = r
                .members
                .iter()
                .map(|m| (m.kind.as_str().to_owned(), m.id.clone()))
                .collect();
            want.insert(((*tenant).clone(), r.request_id.clone()), members);
        }
        mains.push(p.path(&format!("main.jsonl-{n}-{tenant}")));
        lates.push(p.path(&format!("late.jsonl-{n}-{tenant}")));
    }
    (want, shuffled_lines(&mains), shuffled_lines(&lates))
}

/// The lines of every file, shuffled together (a fixed permutation).
fn shuffled_lines(files: &[std::path::PathBuf]) -> Vec<String> {
    let mut lines: Vec<String> = files
        .iter()
        .flat_map(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            text.lines().map(str::to_owned).collect::<Vec<_>>()
        })
        .filter(|l| !l.trim().is_empty())
        .collect();
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    for i in (1..lines.len()).rev() {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        lines.swap(i, (seed >> 33) as usize % (i + 1));
    }
    lines
}

fn write_lines(p: &Pipeline, name: &str, lines: &[String]) -> std::path::PathBuf {
    let path = p.path(name);
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

async fn membership(p: &Pipeline) -> Membership {
    let rows: Vec<(String, String, String, String)> = p
        .client()
        .query(
            "SELECT tenant, narrative_id, kind, id FROM ( \
               SELECT tenant, narrative_id, kind, id, content_hash, \
                      argMax(is_deleted, version) AS gone \
               FROM weft_narratives GROUP BY tenant, narrative_id, kind, id, content_hash) \
             WHERE gone = 0",
        )
        .fetch_all()
        .await
        .unwrap();
    let mut m = Membership::new();
    for (t, n, k, i) in rows {
        m.entry((t, n)).or_default().insert((k, i));
    }
    m
}

async fn wait_for_membership(p: &Pipeline, want: &Membership, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let got = membership(p).await;
        if &got == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "narratives differ from the ground truth: {}\ningest log:\n{}",
            first_difference(&got, want),
            p.ingest_log()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Stored facts of one shard's tenants, counted by ClickHouse's own hash.
async fn facts_of(p: &Pipeline, s: NarrativeShard) -> u64 {
    let sql = format!("SELECT count() FROM weft_events{}", s.where_sql("tenant"));
    p.scalar(&sql).await
}

async fn metric(addr: &str, name: &str) -> u64 {
    common::metric(addr, name)
        .await
        .unwrap_or_else(|| panic!("{addr} does not answer /metrics"))
}

/// Wait until `names` summed over `addrs` reach `n`, and return the sum. A pass counts its
/// facts once its progress row is written, a moment after its narratives are visible, so the
/// counters are waited for, not read as soon as the membership matches.
async fn wait_metrics(addrs: &[&str], names: &[&str], n: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut sum = 0;
        for addr in addrs {
            for name in names {
                sum += metric(addr, name).await;
            }
        }
        if sum >= n || Instant::now() >= deadline {
            return sum;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn narratives(p: &Pipeline, s: NarrativeShard, addr: &str) -> Proc {
    let s = s.to_string();
    let mut args = NARRATIVE_ARGS.to_vec();
    args.extend(["--narrative-shard", &s]);
    p.ingest_args(Some(addr), &[], &args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_two_narrative_shards_one_killed_and_restarted_give_the_one_process_result() {
    let started = Instant::now();
    let p = Pipeline::new("it_shards");
    let tenants = tenants();
    // The first tenant of each shard shares a seed: the same ids under two tenants.
    let plan: [(&String, u64); 4] = [
        (&tenants[0][0], 61),
        (&tenants[0][1], 62),
        (&tenants[1][0], 61),
        (&tenants[1][1], 63),
    ];
    let (want, main, late) = round(&p, 1, &plan);
    let (first, second) = main.split_at(main.len() / 2);
    let first = write_lines(&p, "first.jsonl", first);
    let second = write_lines(&p, "second.jsonl", second);
    let late_file = write_lines(&p, "late.jsonl", &late);
    let total = (main.len() + late.len()) as u64;

    let facts = p.ingest_args(None, &[], &["--role", "facts", "--batch-max-rows", "50"]);
    let addrs = [0, 1].map(|_| format!("127.0.0.1:{}", free_port()));
    let shard0 = narratives(&p, shard(0), &addrs[0]);
    let shard1 = narratives(&p, shard(1), &addrs[1]);

    // The first half of the stream; shard 1 dies once it has projected part of it.
    p.publish(&first);
    let shard1_nodes = format!(
        "SELECT count() FROM weft_narrative_nodes{}",
        shard(1).where_sql("tenant")
    );
    p.wait_for_count(&shard1_nodes, 200, Duration::from_secs(120))
        .await;
    shard1.sigkill();
    let progressed = p
        .scalar("SELECT count() FROM weft_projector_progress WHERE shard = '1/2'")
        .await;
    assert!(
        progressed > 0,
        "shard 1 had completed no pass before it died"
    );

    // The rest arrives while it is down; shard 0 goes on alone.
    p.publish(&second);
    p.wait_for_facts(main.len() as u64, Duration::from_secs(180))
        .await;
    let shard1 = narratives(&p, shard(1), &addrs[1]);
    p.publish(&late_file);
    p.wait_for_facts(total, Duration::from_secs(120)).await;
    wait_for_membership(&p, &want, Duration::from_secs(120)).await;

    // Each shard projected its own tenants and passed over the others': the one that ran
    // throughout fed every fact of its tenants exactly once, and none of the others.
    let (own, other) = (facts_of(&p, shard(0)).await, facts_of(&p, shard(1)).await);
    assert!(own > 0 && other > 0 && own + other == total);
    let a = &addrs[0];
    let counted = [
        "weft_narrative_projected_total",
        "weft_narrative_shard_skipped_total",
    ];
    assert_eq!(wait_metrics(&[a], &counted, total).await, total);
    assert_eq!(metric(a, "weft_narrative_projected_total").await, own);
    assert_eq!(metric(a, "weft_narrative_shard_skipped_total").await, other);
    // The restarted one projected what its tenants still needed, and only that.
    let b = &addrs[1];
    let b_projected = metric(b, "weft_narrative_projected_total").await;
    assert!(
        b_projected > 0 && b_projected < other,
        "shard 1 projected {b_projected} of its {other} after its restart"
    );
    assert!(metric(b, "weft_narrative_shard_skipped_total").await > 0);
    for (addr, index) in [(a, 0), (b, 1)] {
        assert_eq!(metric(addr, "weft_narrative_shard_count").await, 2);
        assert_eq!(metric(addr, "weft_narrative_shard_index").await, index);
    }
    // The bounded paths were taken.
    for name in [
        "weft_narrative_evicted_nodes_total",
        "weft_narrative_loaded_nodes_total",
    ] {
        assert!(
            metric(a, name).await > 0,
            "{name}: the small budget was not exercised"
        );
    }
    // Exactly once, and each shard kept its own progress.
    assert_eq!(p.scalar("SELECT count() FROM weft_events").await, total);
    assert_eq!(p.progress_shards().await, ["0/2", "1/2"]);
    let log = p.ingest_log_all();
    assert!(
        log.contains("narrative_shard=1/2") && log.contains("narratives.1of2"),
        "the start-up line names the shard and its group:\n{}",
        p.ingest_log()
    );
    assert!(
        !log.contains("the broker skipped offsets"),
        "{}",
        p.ingest_log()
    );

    for proc in [facts, shard0, shard1] {
        assert_eq!(proc.terminate().code(), Some(0));
    }

    // Two shards become three with `weft reshard` (a dry run first changes nothing), and a
    // second round of traffic (other seeds) is projected exactly by the three.
    let reshard = |args: &[&str]| {
        let out = p.weft().arg("reshard").args(args).output().unwrap();
        let said = String::from_utf8_lossy(&out.stdout).into_owned();
        check(out, "weft reshard");
        said
    };
    let said = reshard(&["--narrative-shards", "3", "--dry-run"]);
    assert!(
        said.contains("would move narrative progress from shards 0/2, 1/2 to 0/3, 1/3, 2/3"),
        "{said}"
    );
    assert_eq!(p.progress_shards().await, ["0/2", "1/2"]);
    let said = reshard(&["--narrative-shards", "3"]);
    assert!(said.contains("moved narrative progress"), "{said}");
    assert_eq!(p.progress_shards().await, ["0/3", "1/3", "2/3"]);
    let said = reshard(&["--narrative-shards", "3"]);
    assert!(said.contains("nothing to move"), "{said}");
    let plan2: Vec<(&String, u64)> = plan.iter().map(|(t, seed)| (*t, seed + 10)).collect();
    let (want2, main2, late2) = round(&p, 2, &plan2);
    let facts = p.ingest_args(None, &[], &["--role", "facts", "--batch-max-rows", "50"]);
    let addrs3: Vec<String> = (0..3)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    let three: Vec<Proc> = (0..3)
        .map(|i| narratives(&p, NarrativeShard::new(i, 3).unwrap(), &addrs3[i as usize]))
        .collect();
    p.publish(&write_lines(&p, "main2.jsonl", &main2));
    p.publish(&write_lines(&p, "late2.jsonl", &late2));
    let total2 = total + (main2.len() + late2.len()) as u64;
    p.wait_for_facts(total2, Duration::from_secs(120)).await;
    let mut want_all = want.clone();
    want_all.extend(want2);
    wait_for_membership(&p, &want_all, Duration::from_secs(120)).await;
    assert_eq!(p.progress_shards().await, ["0/3", "1/3", "2/3"]);
    // ... starting where the old shards had stopped, not from the first offset: between
    // them they fed the second round's facts (and at most a few replayed ones).
    let round2 = total2 - total;
    let addrs3: Vec<&str> = addrs3.iter().map(String::as_str).collect();
    let fed = wait_metrics(&addrs3, &["weft_narrative_projected_total"], round2).await;
    assert!(
        fed >= round2 && fed < round2 + total / 4,
        "the three shards fed {fed} facts for a second round of {round2}"
    );
    for proc in three.into_iter().chain([facts]) {
        assert_eq!(proc.terminate().code(), Some(0));
    }

    // Narratives are a projection: a rebuild from the facts gives the same result.
    // It writes progress for the shards the processes will run as.
    let rebuilt = p
        .weft()
        .args(["rebuild", "--narrative-shards", "3"])
        .output()
        .unwrap();
    check(rebuilt, "weft rebuild");
    assert_eq!(membership(&p).await, want_all);
    assert_eq!(p.progress_shards().await, ["0/3", "1/3", "2/3"]);
    eprintln!(
        "{total2} events, 4 tenants, 2 shards (one killed and restarted), then 3: exact in {:.0}s",
        started.elapsed().as_secs_f64()
    );
}

/// A shard that cannot be, or a role that cannot be sharded, stops `weft ingest` at once
/// with a message saying why (no stack needed: it fails before connecting).
#[test]
fn bad_shards_and_sharded_fact_roles_are_refused() {
    for (args, says) in [
        (
            &["--narrative-shard", "2/2"][..],
            "INDEX must be below COUNT",
        ),
        (
            &["--narrative-shard", "0/0"][..],
            "COUNT must be at least 1",
        ),
        (&["--narrative-shard", "one"][..], "expected INDEX/COUNT"),
        (
            &["--narrative-shard", "0/2", "--role", "facts"][..],
            "only `--role narratives`",
        ),
        (&["--narrative-shard", "1/2"][..], "--role all"),
    ] {
        let out = common::weft()
            .arg("ingest")
            .args(["--listen", ""])
            .args(args)
            .env("WEFT_CLICKHOUSE_URL", "http://127.0.0.1:1")
            .env("WEFT_KAFKA_BROKERS", "127.0.0.1:1")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(says),
            "{args:?}: {err}"
        );
    }
    // The environment variable is read too.
    let out = common::weft()
        .args(["ingest", "--listen", "", "--role", "facts"])
        .env("WEFT_NARRATIVE_SHARD", "0/3")
        .env("WEFT_CLICKHOUSE_URL", "http://127.0.0.1:1")
        .env("WEFT_KAFKA_BROKERS", "127.0.0.1:1")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("0/3"), "{err}");
}

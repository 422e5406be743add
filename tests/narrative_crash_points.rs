//! The narrative projector killed at every point of its passes, on the real ClickHouse, many
//! times over: the narratives must end exactly as the simulator's ground truth says.
//!
//! `fault_ingest_survives_repeated_sigkill` kills a whole `weft ingest` at points chosen by
//! progress, so whether a kill lands inside a narrative pass, and after which of its writes, is
//! left to chance: a fault there showed on one machine and not on another. This test takes
//! chance out. It feeds a shuffled simulation to the projector in passes of random sizes, as
//! ingest does, and after some passes plays a kill: the writes the pass had not made yet are
//! removed (a pass writes links, narrative rows, node rows, progress, in that order, one insert
//! each), the in-memory state is thrown away, and a fresh projector loads from ClickHouse and
//! resumes from its progress rows, as a restarted process would.
//!
//! Two of the three runs give the graph a tiny memory budget, so nearly every pass evicts and
//! loads components back from ClickHouse: the narratives must still be exact. A kill while a
//! component loads needs no case of its own: loading only reads, so such a kill leaves what
//! the kill after the previous pass's progress leaves.

mod common;

use std::collections::BTreeMap;

use common::facts::{unwrite, KillAfter};
use common::pipeline::{truth_membership, Pipeline};
use weft_consumers::decode::Fact;
use weft_consumers::narrative::projector::{ProjectBatch, Projector};
use weft_schemas::{Envelope, Topics};
use weft_store::{ClickHouseConfig, Store};

/// The facts of one simulated topic partition, in offset order.
struct Log {
    topic: String,
    partition: i32,
    facts: Vec<Fact>,
}

fn logs(file: &std::path::Path) -> Vec<Log> {
    let topics = Topics::default();
    let mut by_topic: BTreeMap<(String, i32), Vec<Fact>> = BTreeMap::new();
    let text = std::fs::read_to_string(file).unwrap();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let env: Envelope = serde_json::from_str(line).unwrap();
        let topic = topics.topic(env.kind);
        // Two partitions per topic, by request id (or identity), as the Publisher keys them.
        let key = env.request_id.clone().unwrap_or_else(|| line.to_owned());
        let partition = (key.bytes().fold(7u32, |h, b| h.wrapping_mul(31) ^ b as u32) % 2) as i32;
        let log = by_topic.entry((topic.clone(), partition)).or_default();
        log.push(common::facts::fact(&env, partition, log.len() as i64));
    }
    by_topic
        .into_iter()
        .map(|((topic, partition), facts)| Log {
            topic,
            partition,
            facts,
        })
        .collect()
}

/// A small deterministic generator, so a failure replays exactly.
struct Lcg(u64);
impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n.max(1)
    }
}

/// One pass of the test: how many facts per partition at most, and whether it dies.
struct Step {
    size: u64,
    tiny: bool,
    kill: Option<KillAfter>,
}

impl Step {
    fn random(rng: &mut Lcg) -> Self {
        let kill = match rng.below(8) {
            0 => Some(KillAfter::Links),
            1 | 2 => Some(KillAfter::Narratives),
            3 => Some(KillAfter::Nodes),
            4 => Some(KillAfter::Progress),
            _ => None,
        };
        Self::sized(40, kill)
    }
    fn sized(size: u64, kill: Option<KillAfter>) -> Self {
        Self {
            size,
            tiny: false,
            kill,
        }
    }
    /// One fact of one partition.
    fn tiny_then(kill: KillAfter) -> Self {
        Self {
            size: 1,
            tiny: true,
            kill: Some(kill),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn narratives_are_exact_whatever_write_of_a_pass_a_kill_interrupts() {
    let default = weft_consumers::narrative::projector::DEFAULT_MAX_NODES;
    for (sim_seed, kill_seed, max_nodes) in [
        ("11", 0x5EED, default),
        ("12", 0xBEEF, 40),
        ("13", 0xF00D, 300),
    ] {
        kill_and_replay(sim_seed, kill_seed, max_nodes).await;
    }
}

async fn kill_and_replay(sim_seed: &str, kill_seed: u64, max_nodes: usize) {
    let p = Pipeline::new("it_crashpts");
    let truth = p.simulate(&[
        "--events",
        "2000",
        "--seed",
        sim_seed,
        "--shuffle",
        "--no-request-id",
        "0.2",
        "--duplicates",
        "0.02",
    ]);
    let logs = logs(&p.path("events.jsonl"));
    let store = Store::new(ClickHouseConfig {
        url: common::clickhouse_url(),
        database: p.db.clone(),
        ..ClickHouseConfig::default()
    })
    .unwrap();
    let mut rng = Lcg(kill_seed);
    let mut projector = Projector::load(store.clone(), max_nodes).await.unwrap();
    let (mut kills, mut loaded, mut evicted, mut direct) = (0, 0, 0, 0);
    // After a kill between a pass's narrative rows and its node rows, play the sequence that
    // once lost narratives on a fresh machine: the restarted process completes a pass that
    // feeds only part of the killed one (after a restart the flush timer cuts batches
    // short), dies again, and its successor replays the rest in a pass larger than the
    // killed one, so that some of its members now land elsewhere.
    let mut script: Vec<Step> = Vec::new();
    loop {
        let step = script.pop().unwrap_or_else(|| Step::random(&mut rng));
        // One pass: a run of each partition's next facts.
        let mut batches = Vec::new();
        for log in &logs {
            let from = (projector.projected(&log.topic, log.partition) + 1) as usize;
            if from >= log.facts.len() || (step.tiny && !batches.is_empty()) {
                continue;
            }
            let n = if step.tiny {
                1
            } else {
                1 + rng.below(step.size) as usize
            };
            let to = (from + n).min(log.facts.len());
            batches.push(ProjectBatch {
                topic: &log.topic,
                partition: log.partition,
                facts: log.facts[from..to].iter().collect(),
                last_offset: to as i64 - 1,
            });
        }
        if batches.is_empty() {
            break;
        }
        let stats = projector.apply(&batches).await.unwrap();
        loaded += stats.loaded;
        evicted += stats.evicted;
        direct += stats.direct;
        let Some(at) = step.kill else { continue };
        let version: u64 = store
            .client()
            .query("SELECT max(version) FROM weft_projector_progress")
            .fetch_one()
            .await
            .unwrap();
        unwrite(&store, version, at).await;
        kills += 1;
        projector = Projector::load(store.clone(), max_nodes).await.unwrap();
        // Every other restart lets the id filters finish their background rebuild, so
        // passes after it may place facts directly (before it, every id is looked up).
        if kills % 2 == 0 {
            common::facts::wait_for_id_filters(&projector).await;
        }
        if matches!(at, KillAfter::Narratives) && script.is_empty() {
            // Popped from the end: tiny pass + restart, then a large pass.
            script = vec![Step::sized(200, None), Step::tiny_then(KillAfter::Progress)];
        }
    }
    assert!(kills >= 10, "only {kills} kills were played");
    if max_nodes < 1000 {
        assert!(
            evicted > 1000 && loaded > 1000,
            "the budget of {max_nodes} nodes should evict and reload often: {evicted} evicted, {loaded} loaded"
        );
    }
    assert!(
        direct > 0,
        "no fact was placed directly: the kills never met that path"
    );
    eprintln!(
        "seed {sim_seed}: {kills} kills played, {evicted} nodes evicted, {loaded} loaded, {direct} placed directly"
    );
    // Compares once (no waiting: every write has landed) and names the first difference.
    p.wait_for_narratives(&truth_membership(&truth), std::time::Duration::ZERO)
        .await;
}

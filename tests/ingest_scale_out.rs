//! Scale-out: two `weft ingest --role facts` processes share the partitions through one
//! consumer group while one `--role narratives` process builds the narratives. One facts
//! process stops half-way (SIGTERM: it leaves the group); the other takes its partitions
//! over after the rebalance. The result is exact.
//!
//! A member that dies without leaving is only noticed after the session timeout; the local
//! broker, tansu 0.6, then gives the dead member its partitions again, so that variant is
//! ignored here (see its doc).
//!
//! The survivor resumes the partitions it takes over from the group's committed offsets, so
//! this test runs in the sqlite phase of `deploy/local/test.sh` (tansu's memory engine skips
//! records when a fetch starts inside a record batch). It once failed here: the narratives
//! process committed into the facts group, so the survivor started past records that nobody
//! had stored (`IngestConfig::kafka_group`).

mod common;

use std::time::Duration;

use common::pipeline::{distinct_facts, truth_membership, Pipeline};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_facts_member_leaves_and_the_survivor_takes_its_partitions_over() {
    survivor_takes_over(Stop::Leave, "it_scale").await;
}

/// Ignored on the local broker: tansu 0.6 keeps a killed member in the group after its
/// session timeout, so the rebalance hands the dead member's half of the partitions back to
/// it (the survivor's log shows `rebalanced partitions=16`, never 32) and they stay unread.
/// Run it with `--ignored` against a broker that evicts dead members (Apache Kafka).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tansu 0.6 keeps a killed member in the group: run against Apache Kafka"]
async fn fault_facts_member_is_killed_and_the_survivor_takes_its_partitions_over() {
    survivor_takes_over(Stop::Kill, "it_scale_kill").await;
}

/// How the first facts member stops half-way.
enum Stop {
    /// SIGTERM: it flushes and leaves the group, which rebalances at once.
    Leave,
    /// SIGKILL: the group notices after the session timeout (10 s).
    Kill,
}

async fn survivor_takes_over(stop: Stop, name: &str) {
    let p = Pipeline::new(name);
    let truth = p.simulate(&[
        "--events",
        "20000",
        "--seed",
        "21",
        "--no-request-id",
        "0.2",
        "--shuffle",
    ]);
    let file = p.path("events.jsonl");
    let want = distinct_facts(&[&file]);
    p.publish(&file);

    let a = p.ingest_args(None, &[], &["--role", "facts", "--batch-max-rows", "500"]);
    let b = p.ingest_args(None, &[], &["--role", "facts", "--batch-max-rows", "500"]);
    let narratives = p.ingest_args(None, &[], &["--role", "narratives"]);
    p.wait_for_facts(want / 3, Duration::from_secs(300)).await;
    match stop {
        Stop::Leave => assert_eq!(a.terminate().code(), Some(0)),
        Stop::Kill => a.sigkill(),
    }
    p.wait_for_facts(want, Duration::from_secs(300)).await;

    assert_eq!(
        p.scalar("SELECT count() FROM weft_events").await,
        want,
        "no event stored twice"
    );
    assert_eq!(
        p.scalar("SELECT uniqExact(tenant, kind, id, content_hash) FROM weft_events")
            .await,
        want
    );
    p.wait_for_narratives(&truth_membership(&truth), Duration::from_secs(120))
        .await;
    drop((b, narratives));
}

//! Time-aligned reading (`consumers/src/ingest/align.rs`), end to end: the same backlog,
//! drained once aligned (the default, 500 ms) and once as fetched (`--align-skew-ms 0`), each
//! into its own database with a narrative graph far smaller than the backlog.
//!
//! weft's topics differ tenfold in size. Read as fetched, the small topics' backlog comes
//! first, so their events meet the trace events that name them only after those components
//! were evicted, and are loaded back from ClickHouse. Aligned, they are read together. Both
//! drains must give the exact narratives; the aligned one must load far fewer nodes back.

mod common;

use std::time::Duration;

use common::pipeline::{free_port, truth_membership, Pipeline};

/// Events in the backlog: the effect needs a backlog of several fetches per partition
/// (measured in release builds: 150k events loaded 1.7x fewer nodes aligned, 300k 3.7x).
const EVENTS: &str = "300000";

/// Drain the pipeline's topics into its database; the nodes loaded back, from `/metrics`.
async fn drain(p: &Pipeline, want: u64, skew_ms: &str) -> u64 {
    let addr = format!("127.0.0.1:{}", free_port());
    let ingest = p.ingest_args(
        Some(&addr),
        &[],
        &["--narrative-max-nodes", "2000", "--align-skew-ms", skew_ms],
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(900);
    loop {
        let projected = common::metric(&addr, "weft_narrative_projected_total").await;
        if projected.is_some_and(|n| n >= want) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "skew {skew_ms}: projected {projected:?} of {want}:\n{}",
            p.ingest_log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let loaded = common::metric(&addr, "weft_narrative_loaded_nodes_total")
        .await
        .expect("metrics answer");
    ingest.terminate();
    loaded
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aligned_reading_loads_fewer_components_back_and_both_are_exact() {
    let aligned = Pipeline::new("it_align");
    // The same topics, another database.
    let mut fetched = Pipeline::new("it_align_off");
    fetched.prefix = aligned.prefix.clone();

    // Published at a steady rate, so the records' timestamps span the flows' order.
    let truth = aligned.simulate(&[
        "--events",
        EVENTS,
        "--seed",
        "3",
        "--no-request-id",
        "0.5",
        "--publish",
        "--rate",
        "30000",
    ]);
    let want = truth.totals.distinct_events;
    let membership = truth_membership(&truth);

    let loaded_aligned = drain(&aligned, want, "500").await;
    aligned
        .wait_for_narratives(&membership, Duration::from_secs(300))
        .await;
    let loaded_fetched = drain(&fetched, want, "0").await;
    fetched
        .wait_for_narratives(&membership, Duration::from_secs(300))
        .await;
    eprintln!("nodes loaded back: aligned {loaded_aligned}, as fetched {loaded_fetched}");
    assert!(
        loaded_aligned * 2 < loaded_fetched,
        "aligned reading loaded {loaded_aligned} nodes back, reading as fetched {loaded_fetched}"
    );
}

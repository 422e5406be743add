//! A facts insert whose HTTP exchange breaks, end to end: `weft ingest` talks to ClickHouse
//! through a proxy (`common::proxy`) that spoils the first insert into `weft_events`.
//!
//! - Its reply is lost: the insert landed, but ingest sees a network error. The retry must
//!   wait for the attempt's `query_id` to stop running, see that every partition is stored
//!   up to the batch's end, and resend nothing (`Flusher::insert_facts`, `rows_left_after`):
//!   a blind resend stores the whole batch twice.
//! - Its request is cut in the middle of the body: nothing landed, and the retry must resend
//!   all of it.
//!
//! Either way every event is stored exactly once and the narratives are complete. The proxy
//! stands in front of ingest alone; the test reads ClickHouse directly. Nothing of the shared
//! stack is stopped, but the test command runs these with the other fault tests, one at a time.

mod common;

use std::time::Duration;

use common::pipeline::{distinct_facts, truth_membership, Pipeline};
use common::proxy::{Fault, Proxy};

/// What the retry path logs once it knows the spoiled insert had landed whole.
const LANDED: &str = "the failed-looking insert had landed; not repeating it";
/// What it logs when part of it had.
const PART_LANDED: &str = "part of the insert had landed; sending the rest";
/// What a failed facts insert logs (a transient error: the connection broke).
const FAILED: &str = "insert failed; offsets not committed, retrying";

/// Publish a few thousand simulated events (with copies), run ingest through a proxy that
/// spoils the first facts insert with `fault`, and check that every event is stored once
/// and every narrative is complete. Returns the pipeline and the proxy, for the
/// fault-specific checks.
async fn ingest_through(fault: Fault, tag: &str) -> (Pipeline, Proxy) {
    let p = Pipeline::new(tag);
    let truth = p.simulate(&["--events", "6000", "--seed", "41", "--duplicates", "0.02"]);
    let file = p.path("events.jsonl");
    let want = distinct_facts(&[&file]);
    assert_eq!(want, truth.totals.distinct_events);
    // Everything is in Kafka before ingest starts, so its first insert carries a large batch
    // over many partitions.
    p.publish(&file);

    let proxy = Proxy::start(&common::clickhouse_url(), "weft_events", fault);
    let ingest = p.ingest_args(None, &[], &["--clickhouse-url", &proxy.url]);

    p.wait_for_facts(want, Duration::from_secs(300)).await;
    // Until the retry of the spoiled insert has run its course (else a late resend could
    // still come after the counts below), or has stored rows twice. After a lost reply that
    // is the message saying the insert had landed; after a cut request, the failure: the
    // cut insert stored nothing, so the rows counted above are its resend's.
    let resolved = if fault == Fault::LoseReply {
        LANDED
    } else {
        FAILED
    };
    common::wait_for_async(Duration::from_secs(120), || async {
        let said = p.ingest_log_all().contains(resolved);
        (said || p.scalar("SELECT count() FROM weft_events").await > want).then_some(())
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "the ingest log never said {resolved:?} (proxy spoiled {} insert(s)):\n{}",
            proxy.hits(),
            p.ingest_log()
        )
    });
    stored_once(&p, &proxy, fault, want).await;
    p.wait_for_narratives(&truth_membership(&truth), Duration::from_secs(300))
        .await;
    assert_eq!(
        ingest.terminate().code(),
        Some(0),
        "ingest stops cleanly:\n{}",
        p.ingest_log()
    );
    // Nothing writes any more: the final counts.
    stored_once(&p, &proxy, fault, want).await;
    assert_eq!(
        proxy.hits(),
        1,
        "the proxy spoiled exactly one insert into weft_events"
    );
    assert!(
        p.ingest_log_all().contains(FAILED),
        "the spoiled insert failed in ingest's eyes:\n{}",
        p.ingest_log()
    );
    let retry: Vec<String> = p
        .ingest_log_all()
        .lines()
        .filter(|l| [FAILED, LANDED, PART_LANDED].iter().any(|m| l.contains(m)))
        .map(str::to_owned)
        .collect();
    eprintln!(
        "{fault:?}: {want} events stored once; spoiled {:?}, ClickHouse's lost reply {:?}; \
         the retry:\n{}",
        proxy.target(),
        proxy.lost_status(),
        retry.join("\n")
    );
    (p, proxy)
}

/// `weft_events` holds `want` rows, as many distinct identities, and no offset twice.
async fn stored_once(p: &Pipeline, proxy: &Proxy, fault: Fault, want: u64) {
    let rows = p.scalar("SELECT count() FROM weft_events").await;
    let distinct = p
        .scalar("SELECT uniqExact(tenant, kind, id, content_hash) FROM weft_events")
        .await;
    let twice = p
        .scalar(
            "SELECT count() FROM (SELECT topic, partition, offset FROM weft_events \
             GROUP BY topic, partition, offset HAVING count() > 1)",
        )
        .await;
    assert_eq!(
        (rows, distinct, twice),
        (want, want, 0),
        "(rows, distinct identities, offsets stored twice) after a {fault:?} of {:?}; \
         want {want} rows of {want} distinct events, no offset twice:\n{}",
        proxy.target(),
        p.ingest_log()
    );
}

/// The insert lands, its reply is lost: ingest must find it stored and not send it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_lost_reply_of_a_landed_insert_is_not_stored_twice() {
    let (p, proxy) = ingest_through(Fault::LoseReply, "it_lostreply").await;
    let status = proxy.lost_status();
    assert!(
        status.as_deref().is_some_and(|s| s.contains(" 200 ")),
        "ClickHouse accepted the insert whose reply was lost: {status:?}"
    );
    assert!(
        p.ingest_log_all().contains(LANDED),
        "the retry found the insert landed:\n{}",
        p.ingest_log()
    );
}

/// The insert is cut in the middle of its body: nothing of it lands, ingest must send it all
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_cut_insert_is_sent_again_whole() {
    let (p, _proxy) = ingest_through(Fault::CutRequest, "it_cutinsert").await;
    let log = p.ingest_log_all();
    assert!(
        !log.contains(LANDED) && !log.contains(PART_LANDED),
        "nothing of a cut insert can have landed:\n{}",
        p.ingest_log()
    );
}

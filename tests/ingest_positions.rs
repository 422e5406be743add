//! Where ingest stands in a partition, seen from outside: the consumer lag gauge on
//! `/metrics`, and records the broker delivers again below the stored offset.
//!
//! Every record is produced on its own (one record per batch), so a consumer that resumes
//! mid-partition fetches exactly the offset it asks for even on tansu's memory engine (which
//! answers a fetch starting inside a batch from the next batch).

mod common;

use std::time::{Duration, Instant};

use common::kafka::{consumer, event, producer, send, wait_for_topic};
use common::pipeline::{free_port, wait_for_port, Pipeline};
use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::{Offset, TopicPartitionList};

/// The high watermark of partition 0 of `topic`, as the broker reports it.
fn high(topic: &str) -> i64 {
    consumer(None)
        .fetch_watermarks(topic, 0, Duration::from_secs(10))
        .unwrap()
        .1
}

/// The consumer lag gauge of partition 0 of `topic` on `addr`'s `/metrics`, if shown.
async fn lag(addr: &str, topic: &str) -> Option<i64> {
    let labels = [("topic", topic), ("partition", "0")];
    let values = common::series(addr, "weft_ingest_consumer_lag", &labels).await?;
    values.first().map(|v| *v as i64)
}

/// Wait until the gauge shows `want` (the monitor samples every 5 s).
async fn wait_for_lag(addr: &str, topic: &str, want: i64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = lag(addr, topic).await;
        if got == Some(want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "weft_ingest_consumer_lag of {topic}/0 is {got:?}, not {want}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The gauge is the broker's high watermark minus the next offset to *store*: records
/// fetched and buffered, but not yet in ClickHouse, count as lag until their flush.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lag_gauge_counts_records_not_yet_stored_until_their_flush() {
    let p = Pipeline::new("it_lag_gauge");
    let topic = format!("{}trace_events", p.prefix);
    let addr = format!("127.0.0.1:{}", free_port());
    // A batch is flushed when it holds 10 records, never by time.
    let args = ["--batch-max-rows", "10", "--flush-interval-ms", "3600000"];
    let _ingest = p.ingest_args(Some(&addr), &[], &args);
    assert!(wait_for_port(&addr, Duration::from_secs(60)));
    wait_for_topic(&topic);
    let prod = producer();
    for i in 0..10 {
        send(&prod, &topic, "k", &event(&format!("te-lag-{i}"))).await;
    }
    p.wait_for_facts(10, Duration::from_secs(60)).await;
    // The broker's own count (tansu's memory engine reports one short), clamped as ingest does.
    wait_for_lag(&addr, &topic, (high(&topic) - 10).max(0)).await;

    // Four more are fetched and buffered, not flushed: they are lag.
    for i in 10..14 {
        send(&prod, &topic, "k", &event(&format!("te-lag-{i}"))).await;
    }
    let behind = high(&topic) - 10;
    assert!(
        behind >= 3,
        "the broker reports {behind} records past the stored ones"
    );
    wait_for_lag(&addr, &topic, behind).await;
    assert_eq!(p.scalar("SELECT count() FROM weft_events").await, 10);

    // Six more fill the batch: it is flushed, and the lag falls back.
    for i in 14..20 {
        send(&prod, &topic, "k", &event(&format!("te-lag-{i}"))).await;
    }
    p.wait_for_facts(20, Duration::from_secs(60)).await;
    wait_for_lag(&addr, &topic, (high(&topic) - 20).max(0)).await;
}

/// The gauge shows a partition from its assignment on, before any flush has landed (here
/// none is due: the batch never fills and the interval is an hour), so records that wait
/// after a start (ClickHouse down, say) show as lag rather than as no series at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lag_gauge_shows_a_partition_before_its_first_flush() {
    let p = Pipeline::new("it_lag_first");
    let topic = format!("{}trace_events", p.prefix);
    let none = p.path("none.jsonl");
    std::fs::write(&none, "").unwrap();
    p.publish(&none); // the topics
    wait_for_topic(&topic);
    let prod = producer();
    for i in 0..3 {
        send(&prod, &topic, "k", &event(&format!("te-first-{i}"))).await;
    }
    let addr = format!("127.0.0.1:{}", free_port());
    let args = ["--batch-max-rows", "1000", "--flush-interval-ms", "3600000"];
    let _ingest = p.ingest_args(Some(&addr), &[], &args);
    assert!(wait_for_port(&addr, Duration::from_secs(60)));
    wait_for_lag(&addr, &topic, high(&topic)).await;
    assert_eq!(
        p.scalar("SELECT count() FROM weft_events").await,
        0,
        "no flush landed"
    );
}

/// The high watermarks of the dead-letter topic, summed: what it has received so far.
fn received(dlq: &str) -> i64 {
    let c = consumer(None);
    let md = c
        .fetch_metadata(Some(dlq), Duration::from_secs(10))
        .unwrap();
    md.topics()[0]
        .partitions()
        .iter()
        .map(|part| {
            c.fetch_watermarks(dlq, part.id(), Duration::from_secs(10))
                .unwrap()
                .1
        })
        .sum()
}

/// A facts member resumes from its group's committed offset, which may lie below what is
/// stored (a member killed between its insert and its commit). The records it fetches again
/// are skipped and counted: not stored twice, not dropped as copies, and the dead letter
/// among them not sent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_fetched_again_below_the_stored_offset_are_skipped() {
    let p = Pipeline::new("it_refetch");
    let topic = format!("{}trace_events", p.prefix);
    let dlq = format!("{}dead_letter", p.prefix);
    let addr = format!("127.0.0.1:{}", free_port());
    let args = ["--role", "facts"];
    let ingest = p.ingest_args(Some(&addr), &[], &args);
    assert!(wait_for_port(&addr, Duration::from_secs(60)));
    wait_for_topic(&topic);
    let prod = producer();
    // Offsets 0-4 and 6-10 valid, 5 a dead letter: offset 10 is stored.
    for i in 0..11 {
        let value = if i == 5 {
            b"{\"event_id\": ".to_vec()
        } else {
            event(&format!("te-re-{i}"))
        };
        send(&prod, &topic, "k", &value).await;
    }
    p.wait_for_facts(10, Duration::from_secs(120)).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while received(&dlq) < 1 {
        assert!(Instant::now() < deadline, "the dead letter never went out");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(ingest.terminate().code(), Some(0));

    // The group's committed offset goes back to the start, as if the member had been killed
    // before any commit.
    let group = consumer(Some(&p.db));
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&topic, 0, Offset::Offset(0))
        .unwrap();
    group.commit(&tpl, CommitMode::Sync).unwrap();
    let committed = group
        .committed_offsets(tpl.clone(), Duration::from_secs(10))
        .unwrap();
    assert_eq!(
        committed.find_partition(&topic, 0).map(|e| e.offset()),
        Some(Offset::Offset(0)),
        "the rewind of the committed offset did not take"
    );
    drop(group);

    // Restarted, it reads the eleven again, then one new event behind them.
    let addr = format!("127.0.0.1:{}", free_port());
    let _ingest = p.ingest_args(Some(&addr), &[], &args);
    send(&prod, &topic, "k", &event("te-re-after")).await;
    p.wait_for_facts(11, Duration::from_secs(120)).await;
    assert!(wait_for_port(&addr, Duration::from_secs(10)));
    let metric = |name| common::metric(&addr, name);
    // The counters move once ClickHouse has answered the insert, a moment after the count.
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric("weft_ingest_inserted_total").await != Some(1) {
        assert!(Instant::now() < deadline, "the new event was never counted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(metric("weft_ingest_replay_skipped_total").await, Some(11));
    assert_eq!(metric("weft_ingest_deduplicated_total").await, Some(0));
    assert_eq!(received(&dlq), 1, "the dead letter was sent again");
    assert_eq!(
        p.scalar("SELECT count() FROM weft_events").await,
        11,
        "a record stored twice"
    );
}

//! A consumer that resumes inside a record batch (`consumers/src/ingest/resume.rs`).
//!
//! Ten events are produced as one Kafka record batch (offsets 0..9). Ingest flushes every
//! four records and never by time, so it stores 0..7 and holds 8 and 9 in memory when it is
//! SIGKILLed: its resume point, offset 8, lies inside the batch. Ten more events follow as a
//! second batch (10..19), then ingest restarts. tansu's memory engine answers a fetch at
//! offset 8 with the second batch (8 and 9 would never come); weft must seek back, and store
//! every event exactly once. On a broker that serves offset 8 itself (Kafka, Redpanda, tansu's
//! sqlite engine) nothing is sought, and the same must hold.
//!
//! The same inside the log's last batch, with nothing produced after it, where no later record
//! shows the jump (`resume_inside_the_last_batch`).
//!
//! Both ways of resuming: `--role all` (the resume point read from ClickHouse) and
//! `--role facts` (the group's committed offset), each after a `--role all` first run.
//!
//! `--role all` resumes at the lower of two points: after the last stored fact, and after
//! the last projected one. A flush inserts the facts and projects them concurrently, so the
//! facts of 4..7 may be stored before their narrative pass has written its progress row: a
//! kill then leaves the projection at 3, and the restart rereads 4..19 (16 records, 4..7
//! projected only). So the first run is killed only once both have reached offset 7; the
//! third case makes the lagging projection on purpose and counts what it rereads.

mod common;

use std::time::{Duration, Instant};

use common::kafka::{consumer, event, wait_for_topic};
use common::pipeline::{free_port, wait_for_port, Pipeline};
use rdkafka::consumer::Consumer;
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

/// Produce events `ids` to partition 0 of `topic` as one record batch: all are handed to a
/// lingering producer before any is awaited.
async fn send_batch(topic: &str, tag: &str, ids: std::ops::Range<u32>) {
    let prod: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", common::brokers())
        .set("linger.ms", "200")
        .create()
        .unwrap();
    let values: Vec<(String, Vec<u8>)> = ids
        .map(|i| (format!("k{i}"), event(&format!("te-{tag}-{i}"))))
        .collect();
    // Every record is queued before any delivery is awaited: one batch.
    let queued: Vec<_> = values
        .iter()
        .map(|(k, v)| {
            prod.send_result(FutureRecord::to(topic).key(k).payload(v).partition(0))
                .map_err(|(e, _)| e)
                .expect("the record was queued")
        })
        .collect();
    for delivery in queued {
        let r = delivery.await.expect("a delivery report");
        r.map_err(|(e, _)| e).expect("the broker took the record");
    }
}

/// The offsets of the records the broker serves first to a plain consumer assigned at
/// `from` (no seek back): the broker's own answer to a fetch inside a batch.
fn first_served(topic: &str, from: i64) -> i64 {
    // librdkafka wants a group even for an assignment (nothing is committed).
    let c = consumer(Some(&format!("{topic}.probe")));
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Offset(from))
        .unwrap();
    c.assign(&tpl).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        assert!(Instant::now() < deadline, "nothing served from {from}");
        if let Some(Ok(m)) = c.poll(Duration::from_millis(500)) {
            return m.offset();
        }
    }
}

/// The group's committed offset of partition 0 of `topic`, if any.
fn committed(group: &str, topic: &str) -> Option<i64> {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(topic, 0);
    let c = consumer(Some(group));
    let got = c.committed_offsets(tpl, Duration::from_secs(10)).ok()?;
    let offset = got.find_partition(topic, 0)?.offset();
    offset.to_raw().filter(|o| *o >= 0)
}

/// The last offset of partition 0 of `topic` the narrative pass has recorded as projected,
/// read as the projector reads it (-1: none yet).
async fn projected(p: &Pipeline, topic: &str) -> i64 {
    p.client()
        .query(
            "SELECT if(count() = 0, -1, argMax(offset, version)) FROM weft_projector_progress \
             WHERE topic = ? AND partition = 0 AND shard = ''",
        )
        .bind(topic)
        .fetch_one::<i64>()
        .await
        .unwrap()
}

/// Wait until the narrative pass has recorded `offset` of partition 0 of `topic`.
async fn wait_until_projected(p: &Pipeline, topic: &str, offset: i64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while projected(p, topic).await != offset {
        assert!(Instant::now() < deadline, "offset {offset} never projected");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What the first run leaves behind when it is killed.
#[derive(Clone, Copy)]
enum Left {
    /// Facts and narratives both done through offset 7: every role resumes at 8.
    Both,
    /// Facts stored through 7, the narrative pass of 4..7 without its progress row (killed
    /// between the two): `--role all` resumes at 4, and projects 4..7 again.
    ProjectionBehind,
}

/// The first run: a batch 0..9, of which ingest stores and projects 0..7 (and, for a
/// `--role facts` second run, commits offset 8), then dies by SIGKILL holding 8 and 9.
async fn first_run_stops_at_8(p: &Pipeline, topic: &str, role: &str) {
    let addr = format!("127.0.0.1:{}", free_port());
    // A batch is flushed when it holds 4 records, never by time. `--role all` (it assigns
    // partitions itself, so a SIGKILL leaves no group member behind, which tansu 0.6 would
    // go on handing partitions to) commits into the same group as `--role facts`.
    let args = ["--batch-max-rows", "4", "--flush-interval-ms", "3600000"];
    let first = p.ingest_args(Some(&addr), &[], &args);
    assert!(wait_for_port(&addr, Duration::from_secs(60)));
    wait_for_topic(topic);
    send_batch(topic, "a", 0..10).await;
    p.wait_for_facts(8, Duration::from_secs(120)).await;
    // The facts of 4..7 may land before their narrative pass does (they run concurrently):
    // killed in between, `--role all` would resume at 4, not 8.
    wait_until_projected(p, topic, 7).await;
    if role == "facts" {
        // A facts member resumes at the group's committed offset (committed each second).
        let deadline = Instant::now() + Duration::from_secs(30);
        while committed(&p.db, topic) != Some(8) {
            assert!(Instant::now() < deadline, "offset 8 never committed");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    first.sigkill();
}

async fn resume_inside_a_batch(tag: &str, role: &str, left: Left) {
    let p = Pipeline::new(tag);
    let topic = format!("{}trace_events", p.prefix);
    first_run_stops_at_8(&p, &topic, role).await;
    assert_eq!(
        p.scalar("SELECT max(offset) + 1 FROM weft_events").await,
        8,
        "the resume point is offset 8, inside the first batch (0..9)"
    );
    assert_eq!(p.scalar("SELECT count() FROM weft_events").await, 8);
    assert_eq!(projected(&p, &topic).await, 7);
    // Where `--role all` resumes: after the lower of the last stored and projected offsets.
    let resume = match left {
        Left::Both => 8,
        Left::ProjectionBehind => {
            // What a kill between the facts insert of 4..7 and the progress row of their
            // narrative pass leaves: the progress row of the pass before (offset 3) is the
            // newest.
            p.client()
                .query(
                    "INSERT INTO weft_projector_progress SELECT topic, partition, 3, version + 1, shard \
                     FROM weft_projector_progress WHERE topic = ? AND partition = 0 \
                     ORDER BY version DESC LIMIT 1",
                )
                .bind(&topic)
                .execute()
                .await
                .unwrap();
            assert_eq!(projected(&p, &topic).await, 3);
            4
        }
    };

    send_batch(&topic, "b", 10..20).await;
    let served = first_served(&topic, resume);
    eprintln!("a fetch at offset {resume} is answered from offset {served}");

    let addr = format!("127.0.0.1:{}", free_port());
    let _second = p.ingest_args(Some(&addr), &[], &["--role", role]);
    assert!(wait_for_port(&addr, Duration::from_secs(60)));
    p.wait_for_facts(20, Duration::from_secs(120)).await;
    let metric = |name| common::metric(&addr, name);
    // The counters move once ClickHouse has answered the insert, a moment after the count.
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric("weft_ingest_inserted_total").await != Some(12) {
        assert!(
            Instant::now() < deadline,
            "inserted: {:?}",
            metric("weft_ingest_inserted_total").await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Every event once: offsets 0..19, each a distinct event.
    let q = "SELECT count() FROM weft_events";
    assert_eq!(p.scalar(q).await, 20, "{}", p.ingest_log());
    let q = "SELECT uniqExact(offset) FROM weft_events WHERE offset < 20";
    assert_eq!(p.scalar(q).await, 20, "an offset missing or stored twice");
    assert_eq!(p.scalar("SELECT uniqExact(id) FROM weft_events").await, 20);
    assert_eq!(metric("weft_ingest_offset_gaps_total").await, Some(0));
    let seek_backs = metric("weft_ingest_seek_backs_total").await;
    if served > resume {
        assert!(
            seek_backs.is_some_and(|n| n > 0),
            "the broker answered from {served}, yet no seek back was counted"
        );
    } else {
        assert_eq!(
            seek_backs,
            Some(0),
            "a seek back on a broker that needs none"
        );
    }
    // Records a seek back brought before the resume point are counted nowhere: the process
    // read 8..19 (and, in the facts role, what the group replays below its committed offset);
    // resuming at 4 for the narratives, it read 4..19, each once (4..7 projected, not stored).
    if role == "all" {
        wait_until_projected(&p, &topic, 19).await;
        let consumed = match left {
            Left::Both => 12,
            Left::ProjectionBehind => 16,
        };
        assert_eq!(metric("weft_ingest_consumed_total").await, Some(consumed));
        assert_eq!(metric("weft_ingest_replay_skipped_total").await, Some(0));
    }
    let log = p.ingest_log_all();
    assert!(!log.contains("the broker skipped offsets"), "{log}");
    eprintln!("{role}: resumed at {resume}, served from {served}, {seek_backs:?} seek back(s)");
}

/// `--role all` resumes where ClickHouse says, offset 8, inside a batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_inside_a_record_batch_stores_every_event_once() {
    resume_inside_a_batch("it_mid_batch_all", "all", Left::Both).await;
}

/// `--role facts` resumes at the group's committed offset, 8, inside a batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_facts_member_resuming_inside_a_record_batch_stores_every_event_once() {
    resume_inside_a_batch("it_mid_batch_facts", "facts", Left::Both).await;
}

/// `--role all` killed after the facts of 4..7 landed but before their narrative pass did:
/// it resumes at 4, inside the batch, seeks back, and reads 4..19 once each (storing 8..19,
/// projecting 4..19).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_whose_projection_lags_its_facts_reads_each_record_once() {
    resume_inside_a_batch("it_mid_batch_lag", "all", Left::ProjectionBehind).await;
}

/// The resume point inside the log's *last* batch, with nothing produced after it: tansu's
/// memory engine answers a fetch at offset 8 of the batch 0..9 with nothing (there is no next
/// batch to answer from), so no later record comes to show the jump, and ingest used to wait
/// for one forever (4 and 8 events of a partition's tail missing in `ingest_scale_out` on the
/// memory log). A partition quiet for `resume::QUIET` after its position was set is sought
/// back; 8 and 9 are stored. On a broker that serves offset 8 itself nothing is sought.
async fn resume_inside_the_last_batch(tag: &str, role: &str) {
    let p = Pipeline::new(tag);
    let topic = format!("{}trace_events", p.prefix);
    first_run_stops_at_8(&p, &topic, role).await;
    assert_eq!(p.scalar("SELECT count() FROM weft_events").await, 8);
    let (_, high) = watermarks(&topic);
    eprintln!("the log of offsets 0..9, one batch, reports a high watermark of {high}");

    let addr = format!("127.0.0.1:{}", free_port());
    let _second = p.ingest_args(Some(&addr), &[], &["--role", role]);
    assert!(wait_for_port(&addr, Duration::from_secs(60)));
    p.wait_for_facts(10, Duration::from_secs(60)).await;
    let q = "SELECT uniqExact(offset) FROM weft_events WHERE offset < 10";
    assert_eq!(p.scalar(q).await, 10, "an offset missing or stored twice");
    assert_eq!(p.scalar("SELECT count() FROM weft_events").await, 10);
    let log = p.ingest_log_all();
    let sought = log.contains("no record came from the expected offset");
    if high < 10 {
        assert!(
            sought,
            "the tail came without a seek back on this broker: {log}"
        );
    } else {
        assert!(
            !sought,
            "a seek back on a broker that serves offset 8: {log}"
        );
    }
    assert!(!log.contains("the broker skipped offsets"), "{log}");
}

/// `--role all` resumes at offset 8 of the log's last batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_inside_the_last_record_batch_stores_its_tail() {
    resume_inside_the_last_batch("it_mid_last_batch_all", "all").await;
}

/// `--role facts` resumes at the group's committed offset, 8, in the log's last batch: the
/// partition delivers no record at all, and a group member loads a partition on its first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_facts_member_resuming_inside_the_last_record_batch_stores_its_tail() {
    resume_inside_the_last_batch("it_mid_last_batch_facts", "facts").await;
}

/// The low and high watermarks of partition 0 of `topic`.
fn watermarks(topic: &str) -> (i64, i64) {
    consumer(None)
        .fetch_watermarks(topic, 0, Duration::from_secs(10))
        .expect("watermarks")
}

/// A first ingest stores and projects a log of one batch, 0..9, and is SIGKILLed caught up:
/// its resume point is offset 9, the log's last record. The pipeline and its topic.
async fn caught_up_on_one_batch(tag: &str) -> (Pipeline, String) {
    let p = Pipeline::new(tag);
    let topic = format!("{}trace_events", p.prefix);
    let addr = format!("127.0.0.1:{}", free_port());
    let first = p.ingest_args(Some(&addr), &[], &[]);
    assert!(wait_for_port(&addr, Duration::from_secs(60)));
    wait_for_topic(&topic);
    send_batch(&topic, "a", 0..10).await;
    p.wait_for_facts(10, Duration::from_secs(120)).await;
    wait_until_projected(&p, &topic, 9).await;
    first.sigkill();
    (p, topic)
}

/// A restart that had caught up goes on, whatever high watermark the broker reports for a
/// log that holds the resume point. tansu's memory engine answers ListOffsets with its last
/// batch's base offset plus one (here 1, for one batch of 0..9): ingest's recreated-topic
/// guard used to take that for a rewound log and stop (`consumers/src/ingest/log_end.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caught_up_restart_goes_on_below_an_under_reported_high_watermark() {
    let (p, topic) = caught_up_on_one_batch("it_caught_up").await;
    let (low, high) = watermarks(&topic);
    eprintln!("a log of offsets 0..9 reports watermarks {low}..{high}");

    let addr = format!("127.0.0.1:{}", free_port());
    let env = [("RUST_LOG", "info,weft_consumers::ingest::seek=debug")];
    let _second = p.ingest_args(Some(&addr), &env, &[]);
    assert!(
        wait_for_port(&addr, Duration::from_secs(60)),
        "{}",
        p.ingest_log()
    );
    // The guard runs before the assignment, and the partition, read to its end, delivers
    // nothing: once quiet it is left alone, not sought back (its fetch answers' end is 10,
    // whatever ListOffsets says). Only then may the log grow.
    let alone = format!("left alone topic=\"{topic}\" partition=0 ");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !p.ingest_log_all().contains(&alone) {
        assert!(
            Instant::now() < deadline,
            "the quiet partition was not left alone: {}",
            p.ingest_log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    send_batch(&topic, "b", 10..12).await;
    p.wait_for_facts(12, Duration::from_secs(120)).await;
    let q = "SELECT uniqExact(offset) FROM weft_events WHERE offset < 12";
    assert_eq!(p.scalar(q).await, 12, "an offset missing or stored twice");
    let log = p.ingest_log_all();
    assert!(!log.contains("below weft's resume point"), "{log}");
    assert!(!log.contains("seeking back"), "{log}");
    if high < 10 {
        assert!(
            log.contains("resuming"),
            "the guard's read was not logged: {log}"
        );
    }
}

/// A resume point past the log's end stops ingest, and the error names the log's end as the
/// broker's fetch answers state it. On tansu's memory engine ListOffsets answers 1 for a log
/// of one batch 0..9; the guard's error used to name that, and the guard took the end it
/// reads there for the log's end (`consumers/src/ingest/log_end.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_point_past_the_log_end_is_refused_naming_the_exact_end() {
    let (p, topic) = caught_up_on_one_batch("it_past_end").await;
    // weft's resume point moves 1000 offsets past the log's end, facts and narratives alike.
    for sql in [
        "INSERT INTO weft_events SELECT * REPLACE (offset + 1000 AS offset, \
         concat(id, '-cut') AS id) FROM weft_events WHERE topic = ? AND partition = 0 \
         ORDER BY offset DESC LIMIT 1",
        "INSERT INTO weft_projector_progress SELECT topic, partition, offset + 1000, version + 1, shard \
         FROM weft_projector_progress WHERE topic = ? AND partition = 0 \
         ORDER BY version DESC LIMIT 1",
    ] {
        p.client().query(sql).bind(&topic).execute().await.unwrap();
    }
    let (low, high) = watermarks(&topic);
    eprintln!("a log of offsets 0..9 reports watermarks {low}..{high}");

    let mut second = p.ingest_args(None, &[], &[]);
    let status = second
        .exit_within(Duration::from_secs(120))
        .unwrap_or_else(|| {
            panic!(
                "ingest kept running past the log's end:\n{}",
                p.ingest_log()
            )
        });
    assert!(!status.success());
    let said =
        format!("{topic}[0]: the broker's log is at offset 10, below weft's resume point 1010");
    assert!(p.ingest_log_all().contains(&said), "{}", p.ingest_log());
}

/// A restart inside the log's last batch (100..109, after a batch 0..99) whose seek back
/// lands inside the batch before it. tansu's memory engine answers a fetch at 41 with the
/// batch 100..109 repeated (it advances its read by the records it found, 41 + 10, and finds
/// the same batch again): 100..104 (dropped by the seek back), 105..109, then 100..109 once
/// more. Those copies are dropped; ingest used to take 100 for a rewound log and stop ("the
/// broker's log is at offset 1088, below weft's resume point 1120" in the 11-SIGKILL test).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seek_back_into_an_earlier_batch_drops_the_batches_the_broker_repeats() {
    let p = Pipeline::new("it_repeat");
    let topic = format!("{}trace_events", p.prefix);
    let addr = format!("127.0.0.1:{}", free_port());
    // Flushed every 7 records, never by time: 0..97 (14 batches), then 98..104 once the
    // second batch comes; 105..109 are held when the process dies.
    let args = ["--batch-max-rows", "7", "--flush-interval-ms", "3600000"];
    let first = p.ingest_args(Some(&addr), &[], &args);
    assert!(wait_for_port(&addr, Duration::from_secs(60)));
    wait_for_topic(&topic);
    send_batch(&topic, "a", 0..100).await;
    p.wait_for_facts(98, Duration::from_secs(120)).await;
    send_batch(&topic, "b", 100..110).await;
    p.wait_for_facts(105, Duration::from_secs(120)).await;
    wait_until_projected(&p, &topic, 104).await;
    first.sigkill();
    assert_eq!(p.scalar("SELECT count() FROM weft_events").await, 105);
    let (_, high) = watermarks(&topic);
    eprintln!("a log of batches 0..99 and 100..109 reports a high watermark of {high}");

    let addr = format!("127.0.0.1:{}", free_port());
    let mut second = p.ingest_args(Some(&addr), &[], &[]);
    assert!(wait_for_port(&addr, Duration::from_secs(60)));
    p.wait_for_facts(110, Duration::from_secs(60)).await;
    let q = "SELECT uniqExact(offset) FROM weft_events WHERE offset < 110";
    assert_eq!(p.scalar(q).await, 110, "an offset missing or stored twice");
    assert_eq!(p.scalar("SELECT count() FROM weft_events").await, 110);
    // Still running: the copies did not stop it.
    assert!(second.0.try_wait().unwrap().is_none(), "{}", p.ingest_log());
    let log = p.ingest_log_all();
    if high < 110 {
        // The memory engine: the scenario happened (else this test proves nothing here).
        assert!(
            log.contains("a record taken already came again"),
            "the broker repeated no batch: {log}"
        );
    }
    assert!(!log.contains("the broker skipped offsets"), "{log}");
}

//! Does a partition's log still reach weft's resume point? (the recreated-topic guard)
//!
//! A resume point past the log's end means the log is not the one weft stored: the topic was
//! recreated or truncated, and its new records would pass for stored ones. The end the
//! broker answers to ListOffsets (`fetch_watermarks`) is exact on Apache Kafka, but tansu's
//! memory engine answers there the base offset plus one of the record batch it wrote last,
//! which can lie many records before the log's end. The high watermark each fetch answer
//! carries is the log's end on both. So a ListOffsets end at or below the resume point is
//! only a suspicion: a consumer of its own fetches the partition, and its fetch answers
//! decide.

use std::ffi::CString;
use std::time::{Duration, Instant};

use rdkafka::bindings as rd;
use rdkafka::client::{Client, ClientContext};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

/// How long [`reaches`] goes on reading after the first fetch answer before it takes the log
/// to end below the target. Fetch answers come every `fetch.wait.max.ms` (500 ms by default)
/// on an idle partition, so this is several of them: a watermark one answer reports from a
/// stale cache (tansu serves them from one shared among its request tasks) is outvoted.
pub(super) const PROBE_WAIT: Duration = Duration::from_secs(5);

/// How many times [`PROBE_WAIT`] [`reaches`] waits for a first fetch answer before it gives
/// up (a broker under load is slow to answer a new client's first requests).
const FIRST_ANSWER_WAITS: u32 = 4;

/// What [`reaches`] learned about a partition's log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct LogEnd {
    /// The log holds a record at the target offset or later.
    pub(super) reaches: bool,
    /// The log's end (the offset its next record gets) as the broker's fetch answers state
    /// it, the highest of them; `None` when no answer came.
    pub(super) fetched: Option<i64>,
}

/// Whether `topic[partition]` holds a record at offset `target` or later. A consumer of its
/// own, assigned rather than subscribed (it joins no group and commits nothing), fetches from
/// the last record below the ListOffsets end `high` (never below `low`): a record at or past
/// `target`, or a fetch answer whose high watermark passes `target`, shows the log reaches
/// it; fetch answers for [`PROBE_WAIT`] that all end at or below `target` show it does not.
pub(super) async fn reaches(
    mut config: ClientConfig,
    topic: &str,
    partition: i32,
    (low, high): (i64, i64),
    target: i64,
    wait: Duration,
) -> Result<LogEnd, KafkaError> {
    let topic = topic.to_owned();
    config
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "false")
        .set("auto.offset.reset", "error");
    let probe = move || -> Result<LogEnd, KafkaError> {
        let consumer: BaseConsumer = config.create()?;
        let from = high.saturating_sub(1).max(low).max(0);
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&topic, partition, Offset::Offset(from))?;
        consumer.assign(&tpl)?;
        let started = Instant::now();
        let mut first_answer: Option<Instant> = None;
        let mut fetched: Option<i64> = None;
        loop {
            // An error (an out-of-range start among them) is no record: read on.
            if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
                if m.offset() >= target {
                    return Ok(LogEnd {
                        reaches: true,
                        fetched,
                    });
                }
            }
            if let Some(end) = fetched_end(consumer.client(), &topic, partition) {
                let end = fetched.map_or(end, |seen| seen.max(end));
                fetched = Some(end);
                if end > target {
                    return Ok(LogEnd {
                        reaches: true,
                        fetched,
                    });
                }
                first_answer.get_or_insert_with(Instant::now);
            }
            let done = match first_answer {
                Some(at) => at.elapsed() >= wait,
                None => started.elapsed() >= wait * FIRST_ANSWER_WAITS,
            };
            if done {
                return Ok(LogEnd {
                    reaches: false,
                    fetched,
                });
            }
        }
    };
    match tokio::task::spawn_blocking(probe).await {
        Ok(r) => r,
        // The probe panicked: no answer, so the log is not shown to reach the target.
        Err(_) => Ok(LogEnd {
            reaches: false,
            fetched: None,
        }),
    }
}

/// The high watermark of the last fetch answer `client` received for the partition
/// (librdkafka keeps it per partition; rust-rdkafka has no safe call for it), or `None`
/// before the first answer.
pub(super) fn fetched_end<C: ClientContext>(
    client: &Client<C>,
    topic: &str,
    partition: i32,
) -> Option<i64> {
    let topic = CString::new(topic).ok()?;
    let (mut low, mut high) = (-1i64, -1i64);
    // SAFETY: the client handle lives as long as `client`, which outlives the call;
    // `topic` is a NUL-terminated string alive for the call; `low` and `high` are valid
    // places for the two answers. The call only reads librdkafka's partition state.
    let err = unsafe {
        rd::rd_kafka_get_watermark_offsets(
            client.native_ptr(),
            topic.as_ptr(),
            partition,
            &mut low,
            &mut high,
        )
    };
    // Before the first answer librdkafka reports RD_KAFKA_OFFSET_INVALID (-1001).
    (err == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR && high >= 0).then_some(high)
}

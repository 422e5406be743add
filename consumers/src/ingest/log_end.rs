//! Does a partition's log still reach weft's resume point? (the recreated-topic guard)
//!
//! A resume point past the log's end means the log is not the one weft stored: the topic was
//! recreated or truncated, and its new records would pass for stored ones. The broker's high
//! watermark says where the log ends, but tansu's memory engine reports its last record
//! batch's base offset plus one there, so a log whose last batch holds several records looks shorter
//! than it is, and a restart that had caught up would be refused. So a watermark below the
//! resume point is only a suspicion: ingest then reads the log back from the reported end,
//! and only a log with no record at or past the resume point is taken as rewound.

use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

/// How long [`reaches`] waits for a record, and for the next one after it, before it takes
/// the log to end there.
pub(super) const PROBE_WAIT: Duration = Duration::from_secs(5);

/// Whether `topic[partition]` holds a record at offset `target` or later, read back from just
/// below the reported high watermark `high`. A fetch inside a record batch is answered from
/// the next batch on tansu, so a read that gets nothing starts again further back (1, 64,
/// 4,096 … offsets below `high`, never below `low`); one that gets records below `target` and
/// then none has read to the log's end. On a broker whose watermark is exact, the first read
/// starts at the last record. A consumer of its own, assigned rather than subscribed: it
/// joins no group and commits nothing.
pub(super) async fn reaches(
    mut config: ClientConfig,
    topic: &str,
    partition: i32,
    (low, high): (i64, i64),
    target: i64,
    wait: Duration,
) -> Result<bool, KafkaError> {
    let topic = topic.to_owned();
    config
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "false")
        .set("auto.offset.reset", "error");
    let probe = move || -> Result<bool, KafkaError> {
        let consumer: BaseConsumer = config.create()?;
        let low = low.max(0);
        let mut back = 1i64;
        loop {
            let from = high.saturating_sub(back).max(low);
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset(&topic, partition, Offset::Offset(from))?;
            consumer.assign(&tpl)?;
            let mut seen = false;
            let mut deadline = Instant::now() + wait;
            while Instant::now() < deadline {
                // An error (an out-of-range start among them) is no record: read on.
                if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
                    if m.offset() >= target {
                        return Ok(true);
                    }
                    seen = true;
                    deadline = Instant::now() + wait;
                }
            }
            if seen || from == low {
                return Ok(false);
            }
            back = back.saturating_mul(64);
        }
    };
    match tokio::task::spawn_blocking(probe).await {
        Ok(r) => r,
        // The probe panicked: no answer, so the log is not shown to reach the target.
        Err(_) => Ok(false),
    }
}

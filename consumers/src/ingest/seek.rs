//! Seeking a partition back: the Ingestor's side of [`super::resume`], which decides. A
//! record past the expected offset right after a (re)positioning ([`Ingestor::resumed`]),
//! and a partition that delivers nothing after one ([`Ingestor::nudge_quiet_partitions`]),
//! read the partition's watermarks and seek it back.

use std::time::{Duration, Instant};

use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::KafkaResult;
use rdkafka::Offset;
use tracing::{debug, error, info, warn};

use super::consume::DecodedRecord;
use super::log_end;
use super::rebalance::RebalanceWatch;
use super::resume::{self, SeekBack, Verdict};
use super::{retry_kafka, IngestError, Ingestor};
use crate::metrics::IngestMetrics;

impl Ingestor {
    /// Partitions whose position was set, or sought back, and that have delivered nothing
    /// for [`resume::QUIET`] (in the facts role, also those of the group's assignment that
    /// have delivered nothing at all): sought back when records wait below their high
    /// watermark or past it ([`resume::quiet`]: tansu's memory engine answers a fetch inside
    /// a log's last batch with nothing, until more records arrive), else left alone until
    /// their position is set again. Watermarks are asked once per quiet period and partition.
    pub(super) async fn nudge_quiet_partitions(&mut self) -> Result<(), IngestError> {
        // A group member loads a partition on its first record: one whose fetch lands inside
        // its log's last batch would never have one. Loaded now, it is looked at once quiet.
        if self
            .unloaded_since
            .is_some_and(|t| t.elapsed() >= resume::QUIET)
        {
            self.unloaded_since = None;
            let idle: Vec<(String, i32)> = self
                .consumer
                .assignment()?
                .elements()
                .iter()
                .map(|e| (e.topic().to_owned(), e.partition()))
                .filter(|k| !self.parts.contains_key(k))
                .collect();
            for (topic, partition) in idle {
                self.partition_state(&topic, partition).await?;
            }
        }
        let quiet: Vec<(String, i32)> = self
            .parts
            .iter()
            .filter(|(_, st)| st.quiet_since.is_some_and(|t| t.elapsed() >= resume::QUIET))
            .map(|(k, _)| k.clone())
            .collect();
        for key in quiet {
            let (topic, partition) = (key.0.as_str(), key.1);
            let (low, listed) = self.watermarks(topic, partition).await?;
            // The end the fetch answers state is exact where ListOffsets' may fall short
            // (tansu's memory engine: `log_end`), so a partition read to its end is left alone.
            let fetched = log_end::fetched_end(self.consumer.client(), topic, partition);
            let high = fetched.map_or(listed, |f| f.max(listed));
            let Some(st) = self.parts.get_mut(&key) else {
                continue;
            };
            let seek = st.expected.and_then(|expected| {
                Some((expected, resume::quiet(expected, st.seek_back, low, high)?))
            });
            st.quiet_since = None;
            let Some((expected, s)) = seek else {
                debug!(topic, partition, expected = ?st.expected, low, high,
                    "a quiet partition with nothing to fetch (read to its end, or below its low watermark); left alone");
                continue;
            };
            match seek_back(&self.consumer, &self.metrics, topic, partition, s.target) {
                Ok(()) => {
                    info!(
                        topic,
                        partition,
                        expected,
                        seek_to = s.target,
                        low,
                        high,
                        "no record came from the expected offset; seeking back for it"
                    );
                    st.seek_back = Some(s);
                    st.quiet_since = Some(Instant::now());
                }
                Err(e) => {
                    warn!(topic, partition, expected, error = %e,
                        "cannot seek back on a partition that delivers nothing; waiting for its next record");
                }
            }
        }
        Ok(())
    }

    /// A partition's low and high watermarks, asked until Kafka answers.
    async fn watermarks(&self, topic: &str, partition: i32) -> Result<(i64, i64), IngestError> {
        let consumer = &self.consumer;
        retry_kafka("read a partition's watermarks", &self.backoff, || {
            consumer.fetch_watermarks(topic, partition, Duration::from_secs(10))
        })
        .await
    }

    /// The first records of a partition whose position was just set, and those of a seek
    /// back in progress ([`super::resume`]): whether the record is taken, dropped, or dropped
    /// for a seek back (done here), or taken as a real gap. Reads the low watermark only for
    /// a record past the expected offset.
    pub(super) async fn resumed(
        &self,
        rec: &DecodedRecord,
        expected: Option<i64>,
        pending: Option<SeekBack>,
    ) -> Result<Verdict, IngestError> {
        let Some(expected) = expected else {
            return Ok(Verdict::Take);
        };
        if let Some(v) = resume::judge(expected, rec.offset, pending) {
            return Ok(v);
        }
        let (topic, partition) = (rec.topic.as_str(), rec.partition);
        let (low, _) = self.watermarks(topic, partition).await?;
        let verdict = resume::past(expected, rec.offset, pending, low);
        let Verdict::Seek(s) = verdict else {
            return Ok(verdict);
        };
        match seek_back(&self.consumer, &self.metrics, topic, partition, s.target) {
            Ok(()) => {
                info!(topic, partition, expected, got = rec.offset, seek_to = s.target, low,
                    "the broker answered from a later record batch; seeking back for the records in between");
                Ok(verdict)
            }
            Err(e) => {
                error!(topic, partition, expected, got = rec.offset, error = %e,
                    "cannot seek back for the records the broker passed over; they are counted as a gap");
                Ok(Verdict::Gap)
            }
        }
    }
}

/// Seek a partition back to `target` for the records a broker passed over
/// ([`super::resume`]), counted in `weft_ingest_seek_backs_total`.
fn seek_back(
    consumer: &StreamConsumer<RebalanceWatch>,
    metrics: &IngestMetrics,
    topic: &str,
    partition: i32,
    target: i64,
) -> KafkaResult<()> {
    consumer.seek(
        topic,
        partition,
        Offset::Offset(target),
        Duration::from_secs(10),
    )?;
    metrics.seek_backs.with_label_values(&[topic]).inc();
    Ok(())
}

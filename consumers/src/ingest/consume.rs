//! The consume loop's side: assignment, rebalances, decoding and buffering records.

use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use rdkafka::consumer::Consumer;
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::{Offset, TopicPartitionList};
use tracing::{debug, error, info, warn};

use super::align::Lanes;
use super::batch::PartitionState;
use super::dead_letter::DeadLetter;
use super::flush::FlusherSlot;
use super::headers;
use super::log_end;
use super::resume::{self, Order, Verdict};
use super::retry::backoff;
use super::{retry_kafka, retry_store, IngestError, Ingestor, Role};
use crate::decode::{self, Fact, Record};
use crate::facts::{self, DedupCache};

/// A consumed record, decoded, and owned so the consumer can be polled again while it is
/// buffered.
pub(super) struct DecodedRecord {
    pub(super) topic: String,
    pub(super) partition: i32,
    pub(super) offset: i64,
    /// The fact, or the whole record and the reason, for the dead-letter topic; `None` for
    /// a record of a tenant another narrative shard projects (not decoded at all).
    pub(super) decoded: Option<Result<Fact, Box<DeadLetter>>>,
}

/// How often the single-process roles ask for the metadata of event topics it lacks before
/// they start without them (about 40 s with the default backoff).
const METADATA_ATTEMPTS: u32 = 10;

/// Ask for the broker's metadata until every one of `topics` is in it (`has`: present, with
/// partitions and no error), retrying after `pause(attempt)`; an answer that still lacks some
/// after [`METADATA_ATTEMPTS`] is taken as it is (with an error naming them), an unavailable
/// one is retried for ever.
async fn wait_for_topics<M, E: std::fmt::Display>(
    topics: &[String],
    mut fetch: impl FnMut() -> Result<M, E>,
    has: impl Fn(&M, &str) -> bool,
    pause: impl Fn(u32) -> Duration,
) -> M {
    let mut attempt = 0;
    loop {
        attempt += 1;
        match fetch() {
            Ok(md) => {
                let missing: Vec<&str> = topics
                    .iter()
                    .map(String::as_str)
                    .filter(|n| !has(&md, n))
                    .collect();
                if missing.is_empty() {
                    return md;
                }
                if attempt >= METADATA_ATTEMPTS {
                    error!(missing = %missing.join(", "), "event topics missing from the broker's \
                        metadata: their records are not read until ingest restarts");
                    return md;
                }
                warn!(missing = %missing.join(", "), attempt, "event topics not in the broker's metadata yet; retrying");
            }
            Err(e) => warn!(error = %e, attempt, "kafka metadata unavailable; retrying"),
        }
        tokio::time::sleep(pause(attempt)).await;
    }
}

/// Partitions whose resume points and dedup windows load at once ([`Ingestor::load_partitions`]).
const PARALLEL_LOADS: usize = 8;

impl Ingestor {
    /// Group mode subscribes; the single-process roles assign every partition at the offset
    /// ClickHouse says comes next.
    pub(super) async fn subscribe(&mut self) -> Result<(), IngestError> {
        let topics = self.cfg.topics.event_topics();
        if self.cfg.role == Role::Facts {
            let names: Vec<&str> = topics.iter().map(String::as_str).collect();
            self.consumer.subscribe(&names)?;
            info!(group = %self.cfg.kafka_group(), "subscribed (facts role, partitions shared with the group)");
            return Ok(());
        }
        // Every event topic, each with its partitions: a topic created a moment ago may not
        // be in every broker's metadata yet, and one left out here would never be read.
        let consumer = &self.consumer;
        let max_backoff_ms = self.cfg.max_backoff_ms;
        let md = wait_for_topics(
            &topics,
            || consumer.fetch_metadata(None, Duration::from_secs(10)),
            |md, name| {
                md.topics()
                    .iter()
                    .any(|t| t.name() == name && t.error().is_none() && !t.partitions().is_empty())
            },
            |attempt| backoff(attempt, max_backoff_ms),
        )
        .await;
        let ours = || {
            md.topics()
                .iter()
                .filter(|t| topics.iter().any(|n| n == t.name()))
        };
        let keys: Vec<(String, i32)> = ours()
            .flat_map(|t| t.partitions().iter().map(|p| (t.name().to_owned(), p.id())))
            .collect();
        self.load_partitions(&keys).await?;
        let mut tpl = TopicPartitionList::new();
        let role = self.cfg.role;
        for t in ours() {
            for p in t.partitions() {
                let st = self.partition_state(t.name(), p.id()).await?;
                let from = match role {
                    Role::Narratives => st.projected,
                    _ => st.stored.min(st.projected),
                };
                st.expected = Some(from + 1);
                self.refuse_rewound(t.name(), p.id(), from).await?;
                tpl.add_partition_offset(t.name(), p.id(), Offset::Offset(from + 1))?;
            }
        }
        info!(partitions = tpl.count(), role = ?self.cfg.role, narrative_shard = %self.cfg.narrative_shard,
            group = %self.cfg.kafka_group(), "assigned every partition");
        self.consumer.assign(&tpl)?;
        if self.cfg.align_skew_ms > 0 {
            let partitions: Vec<(String, i32, i64)> = tpl
                .elements()
                .iter()
                .map(|e| {
                    let from = e.offset().to_raw().unwrap_or(-1);
                    (e.topic().to_owned(), e.partition(), from)
                })
                .collect();
            let skew = Duration::from_millis(self.cfg.align_skew_ms);
            let held = self.metrics.partitions_held.clone();
            self.lanes = Lanes::split(&self.consumer, &partitions, skew, held);
        }
        Ok(())
    }

    /// A resume point (`after`: the last offset done) past the log's end means the log is
    /// not the one weft stored: recreated or truncated (tansu answers fetches past its end
    /// with nothing, so waiting would only hide it). A ListOffsets end at or below `after` is
    /// checked against the broker's fetch answers ([`log_end::reaches`]): tansu's memory
    /// engine answers ListOffsets with the base offset plus one of the batch it wrote last.
    async fn refuse_rewound(
        &self,
        topic: &str,
        partition: i32,
        after: i64,
    ) -> Result<(), IngestError> {
        let consumer = &self.consumer;
        let (low, high) = retry_kafka("read a partition's watermarks", &self.backoff, || {
            consumer.fetch_watermarks(topic, partition, Duration::from_secs(10))
        })
        .await?;
        if after < high {
            return Ok(());
        }
        let mut probe = super::config::kafka_config(&self.cfg);
        probe.set("group.id", format!("{}.probe", self.cfg.kafka_group()));
        let marks = (low, high);
        let end =
            log_end::reaches(probe, topic, partition, marks, after, log_end::PROBE_WAIT).await?;
        if end.reaches {
            info!(topic, partition, listed_end = high, fetched_end = ?end.fetched, resume_after = after,
                "the broker's ListOffsets end is below a record its log holds (tansu's memory \
                 engine answers the base offset plus one of the batch it wrote last); resuming");
            return Ok(());
        }
        Err(IngestError::Rewound {
            topic: topic.to_owned(),
            partition,
            expected: after + 1,
            got: end.fetched.unwrap_or(high),
        })
    }

    pub(super) async fn partition_state(
        &mut self,
        topic: &str,
        partition: i32,
    ) -> Result<&mut PartitionState, IngestError> {
        let key = (topic.to_owned(), partition);
        if !self.parts.contains_key(&key) {
            let mut st = self.load_partition(topic, partition).await?;
            if self.cfg.role == Role::Facts {
                // The single-process roles check this when they assign (`subscribe`); a
                // group member, when a partition first reaches it: otherwise a recreated
                // log's records would all pass for stored ones and be skipped.
                self.refuse_rewound(topic, partition, st.stored).await?;
                st.expected = Some(self.group_resume_point(topic, partition, st.stored).await?);
            }
            self.adopt(key.clone(), st);
        }
        Ok(self
            .parts
            .entry(key)
            .or_insert_with(|| unreachable!("inserted above")))
    }

    /// [`Ingestor::load_partition`] for every partition of `keys` not held yet, up to
    /// [`PARALLEL_LOADS`] at a time. A single-process role loads them all before it reads a
    /// record; one after another (three ClickHouse round trips each, slow while the id
    /// filters load beside them) they were half of a 10 s restart over 10M stored events.
    async fn load_partitions(&mut self, keys: &[(String, i32)]) -> Result<(), IngestError> {
        let this = &*self;
        let loaded: Vec<_> =
            futures::stream::iter(keys.iter().filter(|k| !this.parts.contains_key(*k)))
                .map(|(topic, partition)| async move {
                    let st = this.load_partition(topic, *partition).await?;
                    Ok::<_, IngestError>(((topic.clone(), *partition), st))
                })
                .buffer_unordered(PARALLEL_LOADS)
                .try_collect()
                .await?;
        for (key, st) in loaded {
            self.adopt(key, st);
        }
        Ok(())
    }

    /// Hold a partition just loaded.
    fn adopt(&mut self, key: (String, i32), st: PartitionState) {
        // The lag monitor measures from here until a flush lands: lag shows from the
        // assignment on, during an outage right after a start too.
        if let Ok(mut pos) = self.positions.lock() {
            pos.insert(key.clone(), st.next_offset());
        }
        self.parts.insert(key, st);
    }

    /// Where a group member's fetch of a partition it was just handed should start, at the
    /// latest: the group's committed offset (where the fetch starts), or the first offset not
    /// stored (`stored + 1`) when that is later (the previous owner committed only what it had
    /// stored) or when the group has committed nothing (the fetch then starts at the log's
    /// start). A first record past it is a skip ([`super::resume`]); on Kafka it never is.
    async fn group_resume_point(
        &self,
        topic: &str,
        partition: i32,
        stored: i64,
    ) -> Result<i64, IngestError> {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(topic, partition);
        let consumer = &self.consumer;
        let committed = retry_kafka("read a partition's committed offset", &self.backoff, || {
            consumer.committed_offsets(tpl.clone(), Duration::from_secs(10))
        })
        .await?;
        let committed = committed
            .find_partition(topic, partition)
            .and_then(|e| e.offset().to_raw())
            .filter(|o| *o >= 0);
        debug!(topic, partition, stored, ?committed, "group resume point");
        Ok(committed.map_or(stored + 1, |c| c.max(stored + 1)))
    }

    /// Resume points and dedup window of a partition this process starts reading.
    pub(super) async fn load_partition(
        &self,
        topic: &str,
        partition: i32,
    ) -> Result<PartitionState, IngestError> {
        let (stored, dedup) = if self.cfg.role != Role::Narratives {
            let limits = self.cfg.dedup_limits();
            let store = &self.store;
            let stored = retry_store(&self.backoff, &self.metrics, "read progress", || {
                facts::stored_max_offset(store, topic, partition)
            })
            .await?;
            let dedup = retry_store(&self.backoff, &self.metrics, "load dedup window", || {
                facts::load_dedup(store, topic, partition, limits)
            })
            .await?;
            (stored, dedup)
        } else {
            let none = facts::DedupLimits {
                window: Duration::ZERO,
                max_entries: 1,
                filter_items: 1,
            };
            (i64::MAX, DedupCache::new(none))
        };
        let projected = match &self.flusher {
            FlusherSlot::Idle(f) => f
                .projector
                .as_ref()
                .map_or(i64::MAX, |p| p.projected(topic, partition)),
            // Unreachable in practice: the single-process roles load every partition before
            // the first flush, and the facts role (no projector) never leaves a flush in
            // flight. Should it happen, projecting the partition again is safe (every
            // projector write is idempotent).
            _ if self.cfg.role == Role::Facts => i64::MAX,
            _ => -1,
        };
        debug!(
            topic,
            partition,
            stored,
            projected,
            dedup = dedup.len(),
            "partition ready"
        );
        Ok(PartitionState {
            topic: topic.to_owned(),
            partition,
            stored,
            projected,
            dedup,
            facts: Vec::new(),
            dead: Vec::new(),
            bytes: 0,
            last_offset: -1,
            expected: None,
            fresh: true,
            seek_back: None,
            quiet_since: Some(Instant::now()),
            run_from: None,
            oldest: None,
            consumed: self.metrics.consumed.with_label_values(&[topic]),
        })
    }

    /// Decode a record while it is still borrowed from librdkafka: a valid one is copied
    /// once, into its fact; only a rejected one is copied whole, for the dead-letter topic.
    pub(super) fn decode_record(&self, m: &BorrowedMessage<'_>) -> DecodedRecord {
        let raw = headers::raw(m);
        let (headers, bad_name) = headers::utf8(&raw);
        let shard = self.cfg.narrative_shard;
        // Another shard's tenant (or a tenant header decode would refuse): passed over from
        // the headers, before the value is decoded. Its offset still moves this shard's
        // progress.
        if !shard.is_whole()
            && !weft_schemas::wire::tenant_of(&headers).is_some_and(|t| shard.owns(t))
        {
            self.metrics.narrative.shard_skipped.inc();
            return DecodedRecord {
                topic: m.topic().to_owned(),
                partition: m.partition(),
                offset: m.offset(),
                decoded: None,
            };
        }
        let r = Record {
            topic: m.topic(),
            partition: m.partition(),
            offset: m.offset(),
            key: m.key(),
            value: m.payload(),
            headers: &headers,
            timestamp_ms: m.timestamp().to_millis(),
        };
        let size = m.payload().map_or(0, <[u8]>::len);
        let decoded = if let Some(name) = bad_name {
            Err(decode::Rejection {
                code: "bad_header",
                message: format!(
                    "a header name is not UTF-8 (its first bytes: {})",
                    hex::encode(&name[..name.len().min(32)])
                ),
            })
        } else if size > self.cfg.max_message_bytes {
            Err(decode::Rejection {
                code: "too_large",
                message: format!(
                    "record value of {size} bytes is over max_message_bytes ({})",
                    self.cfg.max_message_bytes
                ),
            })
        } else {
            decode::decode_parsed(&r, &self.cfg.topics, self.schemas.ids())
        };
        // The parsed payload is looked at here once, and dropped.
        let decoded = decoded.map(|(fact, payload)| {
            self.note_nonconforming(&fact, &payload);
            fact
        });
        let decoded = decoded.map_err(|reason| {
            Box::new(DeadLetter {
                key: m.key().map(<[u8]>::to_vec),
                value: m.payload().unwrap_or_default().to_vec(),
                headers: raw
                    .iter()
                    .map(|(k, v)| (String::from_utf8_lossy(k).into_owned(), v.to_vec()))
                    .collect(),
                offset: m.offset(),
                reason,
            })
        });
        DecodedRecord {
            topic: m.topic().to_owned(),
            partition: m.partition(),
            offset: m.offset(),
            decoded: Some(decoded),
        }
    }

    /// Count (and log, once per key) the fact's top-level payload keys neither defined by its
    /// kind nor of the `x_<org>_<field>` shape. The spec allows them, so the fact is stored.
    fn note_nonconforming(&self, fact: &Fact, payload: &serde_json::Value) {
        let kind = fact.envelope.kind;
        let odd = weft_schemas::extensions::nonconforming_keys(kind, payload);
        if odd.is_empty() {
            return;
        }
        self.metrics.nonconforming_keys.inc_by(odd.len() as u64);
        let new = self.reported.first_seen(kind, &odd);
        if !new.is_empty() {
            info!(%kind, keys = %new.join(", "), tenant = %fact.envelope.tenant,
                "payload keys neither in the spec nor x_<org>_<field> (logged once per key)");
        }
    }

    /// Buffer one decoded record; returns true when a batch is full.
    pub(super) async fn accept(&mut self, rec: DecodedRecord) -> Result<bool, IngestError> {
        // Counted now, while `self` is free; taken back where a record turns out to be one
        // read before (those are counted in `replay_skipped` only, or nowhere).
        self.totals.consumed += 1;
        let (max_rows, max_bytes) = (self.cfg.batch_max_rows, self.cfg.batch_max_bytes);
        let role = self.cfg.role;
        let metrics = self.metrics.clone();
        let buffered = self.buffered;
        let mut st = self.partition_state(&rec.topic, rec.partition).await?;
        // Just (re)positioned, or seeking back: a record past `expected` may be the broker's
        // answer from a later batch (`resume`). Records a seek back drops are counted nowhere
        // (their fate was decided, and counted, when first read).
        if st.fresh || st.seek_back.is_some() {
            let (expected, pending) = (st.expected, st.seek_back);
            let verdict = self.resumed(&rec, expected, pending).await?;
            if matches!(verdict, Verdict::Discard | Verdict::Seek(_)) {
                self.totals.consumed -= 1;
            }
            st = self.partition_state(&rec.topic, rec.partition).await?;
            match verdict {
                Verdict::Take | Verdict::Gap => {
                    if verdict == Verdict::Take {
                        st.run_from = resume::run_after_seek(st.run_from, rec.offset, pending);
                    }
                    st.fresh = false;
                    st.seek_back = None;
                    st.quiet_since = None;
                }
                // Records flow again: what follows decides (a log read to its end stops here).
                Verdict::Discard => {
                    st.quiet_since = None;
                    return Ok(false);
                }
                Verdict::Seek(s) => {
                    st.seek_back = Some(s);
                    st.quiet_since = Some(Instant::now());
                    return Ok(false);
                }
            }
        }
        let order = resume::order(st.expected, st.run_from, rec.offset);
        match order {
            // Facts come back in the facts role too, when the group refetches a kept
            // partition; there the stored offsets and `last_offset` below guard instead.
            Order::Copy if role != Role::Facts => {
                self.totals.consumed -= 1;
                self.metrics.replay_skipped.inc();
                info!(topic = %rec.topic, partition = rec.partition, offset = rec.offset,
                    "a record taken already came again; dropped");
                return Ok(false);
            }
            // The resume point lay beyond the log's end, and the broker sent us back.
            Order::Back { expected } if role != Role::Facts => {
                return Err(IngestError::Rewound {
                    topic: rec.topic,
                    partition: rec.partition,
                    expected,
                    got: rec.offset,
                });
            }
            Order::Gap { expected } => {
                warn!(topic = %rec.topic, partition = rec.partition, expected, got = rec.offset,
                    "the broker skipped offsets: records in between were never delivered");
                metrics
                    .offset_gaps
                    .with_label_values(&[&rec.topic])
                    .inc_by((rec.offset - expected) as u64);
            }
            _ => {}
        }
        st.run_from = resume::run_start(st.run_from, rec.offset, order);
        st.expected = Some(rec.offset + 1);
        // Fetched again: in the facts role a rebalance refetches a kept partition from its
        // committed offset, and this process holds those records already (buffered, or
        // flushed). Taken twice, a dead letter would be sent twice. Counted once, as read.
        if rec.offset <= st.last_offset {
            self.totals.consumed -= 1;
            self.metrics.replay_skipped.inc();
            return Ok(false);
        }
        st.consumed.inc();
        let need_fact = role != Role::Narratives && rec.offset > st.stored;
        let need_projection = rec.offset > st.projected;
        st.last_offset = st.last_offset.max(rec.offset);
        if !need_fact && !need_projection {
            self.metrics.replay_skipped.inc();
            return Ok(false);
        }
        st.oldest.get_or_insert_with(Instant::now);
        metrics.health.waiting();
        let (mut rows, mut bytes) = buffered;
        match rec.decoded {
            Some(Ok(fact)) => {
                let n = fact_bytes(&fact);
                st.bytes += n;
                (rows, bytes) = (rows + 1, bytes + n);
                st.facts.push((rec.offset, Box::new(fact)));
            }
            Some(Err(dead)) if need_fact => {
                let n = dead.held_bytes();
                st.bytes += n;
                (rows, bytes) = (rows + 1, bytes + n);
                st.dead.push(*dead);
            }
            // The facts role owns dead-lettering; a projector-only pass just skips it, as it
            // skips another shard's tenants.
            _ => {}
        }
        self.buffered = (rows, bytes);
        Ok(rows >= max_rows || bytes >= max_bytes)
    }
}

/// A fact's bytes for the batch's byte budget: its payload, and what its headers brought
/// (the ids from the payload are bounded by it; these are not).
fn fact_bytes(fact: &Fact) -> usize {
    let e = &fact.envelope;
    e.payload.get().len()
        + [&e.request_id, &e.producer_id, &e.emitted_at]
            .iter()
            .map(|f| f.as_ref().map_or(0, String::len))
            .sum::<usize>()
}

#[cfg(test)]
mod tests {
    use super::{fact_bytes, wait_for_topics, METADATA_ATTEMPTS};
    use std::time::Duration;

    /// A metadata answer: each topic with its partition count and whether it has an error.
    type Md = Vec<(&'static str, usize, bool)>;

    fn has(md: &Md, name: &str) -> bool {
        md.iter()
            .any(|(n, parts, err)| *n == name && *parts > 0 && !err)
    }

    /// Answers `script` in turn (its last answer from then on), counting the calls.
    async fn wait_on(script: Vec<Result<Md, &'static str>>) -> (Md, usize) {
        let topics = vec!["a".to_owned(), "b".to_owned()];
        let mut calls = 0;
        let md = wait_for_topics(
            &topics,
            || {
                calls += 1;
                script[(calls - 1).min(script.len() - 1)].clone()
            },
            has,
            |_| Duration::ZERO,
        )
        .await;
        (md, calls)
    }

    /// A topic absent, then known without partitions, then with an error, is waited for:
    /// the assignment is made from the answer that has every topic with its partitions.
    #[tokio::test]
    async fn ingest_waits_until_every_event_topic_has_its_partitions() {
        let whole = vec![("a", 2, false), ("b", 2, false)];
        let (md, calls) = wait_on(vec![
            Ok(vec![("a", 2, false)]),
            Ok(vec![("a", 2, false), ("b", 0, false)]),
            Err("broker down"),
            Ok(vec![("a", 2, false), ("b", 2, true)]),
            Ok(whole.clone()),
        ])
        .await;
        assert_eq!((md, calls), (whole, 5));
    }

    /// A fact counts the ids its headers brought besides its payload.
    #[test]
    fn a_fact_counts_its_header_ids_besides_its_payload() {
        let rec = crate::decode::Record {
            topic: "weaver.trace_events",
            partition: 0,
            offset: 0,
            key: None,
            value: Some(br#"{"event_id":"e","event_type":"flow_failed","timestamp":"2026-03-08T06:00:05Z"}"#),
            headers: &[
                (weft_schemas::wire::header::REQUEST_ID, &[b'r'; 1000][..]),
                (weft_schemas::wire::header::PRODUCER_ID, &b"pp"[..]),
            ],
            timestamp_ms: None,
        };
        let topics = weft_schemas::Topics::default();
        let fact = crate::decode::decode(&rec, &topics, &Default::default()).expect("valid");
        let payload = fact.envelope.payload.get().len();
        assert_eq!(fact_bytes(&fact), payload + 1000 + 2);
    }

    /// A topic that never shows up does not hold ingest for ever: after the last attempt it
    /// starts with the topics it has.
    #[tokio::test]
    async fn ingest_starts_without_a_topic_missing_after_every_attempt() {
        let partial = vec![("a", 2, false)];
        let (md, calls) = wait_on(vec![Ok(partial.clone())]).await;
        assert_eq!((md, calls), (partial, METADATA_ATTEMPTS as usize));
    }
}

//! The `[ingest]` settings, the Kafka clients they configure, and topic creation.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use rdkafka::config::ClientConfig;
use serde::{Deserialize, Serialize};
use weft_kafka::{ClientSettings, TopicLayout, Topics};

use super::IngestError;
use crate::narrative::shard::NarrativeShard;

/// Which parts of the pipeline this process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Facts and narratives over every partition: one process, the default.
    #[default]
    All,
    /// Facts only, partitions shared with other `facts` processes through a consumer group:
    /// the scale-out mode. Run exactly one `narratives` process beside them, or one per
    /// narrative shard ([`IngestConfig::narrative_shard`]).
    Facts,
    /// Narratives only, over every partition (of every tenant, or of one narrative shard's).
    Narratives,
}

impl Role {
    /// The name used in configuration and telemetry (`all`, `facts`, `narratives`).
    pub fn as_str(self) -> &'static str {
        match self {
            Role::All => "all",
            Role::Facts => "facts",
            Role::Narratives => "narratives",
        }
    }
}

/// Settings of `weft ingest` (the `[ingest]` TOML section).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IngestConfig {
    /// Kafka bootstrap servers. The CLI fills it from `[kafka]` and `[kafka.ingest]`; in the
    /// file, `[ingest] brokers` is a deprecated alias of `[kafka.ingest] brokers`.
    pub brokers: String,
    /// Consumer group; offsets are committed there (for lag dashboards and resumption).
    /// The `narratives` role commits under `<group_id>.narratives` instead: see
    /// [`IngestConfig::kafka_group`].
    pub group_id: String,
    /// Topic names; the CLI fills them from `[publisher.topics]`, so both sides agree.
    #[serde(skip)]
    pub topics: Topics,
    /// The Confluent schema registry, for records framed `avro-confluent`; the CLI fills it
    /// from `[publisher] schema_registry_url`, so both sides agree. Without it such records
    /// are dead-lettered (`unknown_schema`).
    #[serde(skip)]
    pub schema_registry_url: Option<String>,
    /// Which parts of the pipeline this process runs.
    pub role: Role,
    /// Partitions for topics this process creates when they are missing.
    pub partitions: i32,
    /// Replication factor for topics this process creates (1 suits one local broker; use
    /// the cluster's usual factor, typically 3, in production).
    pub replication_factor: i32,
    /// Flush when this many records are buffered (over all partitions). Two batches are in
    /// memory while ingest drains a backlog (one written while the next is read), decoded:
    /// with the default 50,000 the whole process peaked at 874 MB draining a 2M-event
    /// backlog (~350 B payloads), for about 15% less CPU per event than 20,000.
    pub batch_max_rows: usize,
    /// ... or this many payload bytes.
    pub batch_max_bytes: usize,
    /// ... or when the oldest buffered record is this old (milliseconds).
    pub flush_interval_ms: u64,
    /// How long identities are remembered for deduplication (seconds; default 7 days).
    pub dedup_window_secs: u64,
    /// Identities each partition holds exactly, per generation (two generations; default
    /// 20,000, under 3 MB for both). Older ones of the window are found through the filter and a
    /// ClickHouse check, so the bound costs lookups, never exactness.
    pub dedup_max_entries: usize,
    /// Identities each partition's window filter is sized for, per half window (two
    /// generations; default 2,000,000, about 2.4 MB each at 1% false positives). Every
    /// topic partition has its own: 8 kinds x 4 partitions is 32.
    pub dedup_filter_items: usize,
    /// Status server (`/metrics`, `/healthz`, `/v1/narratives/{id}`); empty disables it.
    pub listen: String,
    /// Longest wait between ClickHouse retries (milliseconds).
    pub max_backoff_ms: u64,
    /// Extra librdkafka properties for every Kafka client (security.protocol, sasl.*, debug...).
    /// The CLI fills them from `[kafka.properties]` and `[kafka.ingest.properties]`; in the
    /// file, `[ingest.kafka_properties]` is a deprecated alias of the latter.
    pub kafka_properties: BTreeMap<String, String>,
    /// Largest record value ingest stores, in bytes; larger records are dead-lettered
    /// (`too_large`). Also the largest dead letter it produces (its `message.max.bytes`):
    /// a rejected record over it goes out in a bounded form. Keep it equal to the
    /// publishers' `[publisher] max_message_bytes` (both default to 1,000,000) and under the
    /// broker's `message.max.bytes`.
    pub max_message_bytes: usize,
    /// Seconds with records fetched but none stored (judged from this process's own positions)
    /// after which `/healthz` answers 503 and `weft_ingest_stalled` is 1; 0 disables.
    pub stall_after_secs: u64,
    /// Nodes the narrative graph keeps in memory between passes (default 300,000, about
    /// 180 MB); the least recently touched components are evicted beyond it and load again
    /// from ClickHouse when an event names them.
    pub narrative_max_nodes: usize,
    /// How far ahead in record time (Kafka timestamps, milliseconds) one partition may be
    /// read of the slowest partition with records waiting (default 500; 0 reads them as
    /// librdkafka fetches them). Keeps the events of one request, spread over several
    /// topics, close together in the narrative pass while a backlog drains, so their
    /// components are still in memory (see `ingest/align.rs`). The `facts` role ignores it.
    pub align_skew_ms: u64,
    /// Which tenants this `narratives` process projects (`i/N`, see
    /// [`crate::narrative::shard`]); the default `0/1` is every tenant. Only the
    /// `narratives` role can be sharded.
    pub narrative_shard: NarrativeShard,
}

impl Default for IngestConfig {
    fn default() -> Self {
        Self {
            brokers: String::new(),
            group_id: "weft-ingest".into(),
            topics: Topics::default(),
            schema_registry_url: None,
            role: Role::All,
            partitions: 4,
            replication_factor: 1,
            batch_max_rows: 50_000,
            batch_max_bytes: 64 << 20,
            flush_interval_ms: 1_000,
            dedup_window_secs: 7 * 24 * 3600,
            dedup_max_entries: 20_000,
            dedup_filter_items: 2_000_000,
            listen: weft_schemas::ports::loopback(weft_schemas::ports::INGEST).to_string(),
            max_backoff_ms: 10_000,
            kafka_properties: BTreeMap::new(),
            max_message_bytes: 1_000_000,
            stall_after_secs: 120,
            narrative_max_nodes: crate::narrative::projector::DEFAULT_MAX_NODES,
            align_skew_ms: 500,
            narrative_shard: NarrativeShard::WHOLE,
        }
    }
}

impl IngestConfig {
    /// The bounds of each partition's dedup state.
    pub fn dedup_limits(&self) -> crate::facts::DedupLimits {
        crate::facts::DedupLimits {
            window: std::time::Duration::from_secs(self.dedup_window_secs),
            max_entries: self.dedup_max_entries,
            filter_items: self.dedup_filter_items,
        }
    }

    /// The Kafka consumer group this process commits offsets to. A `facts` member that takes
    /// a partition over starts reading at the group's committed offset, trusting that it
    /// never passes what is stored in ClickHouse. The `narratives` process commits after
    /// projecting, not after storing facts, so it must commit under a group of its own, or a
    /// facts member could start past records nobody stored. Each narrative shard commits
    /// under its own (`<group_id>.narratives.<i>of<N>`).
    pub fn kafka_group(&self) -> String {
        match self.role {
            Role::Narratives => format!(
                "{}.narratives{}",
                self.group_id,
                self.narrative_shard.group_suffix()
            ),
            Role::All | Role::Facts => self.group_id.clone(),
        }
    }

    /// Refuse a narrative shard on a role that stores facts: `facts` projects nothing, and
    /// `all` would also store only its shard's share of the facts (facts members share the
    /// partitions through their group instead).
    pub fn check_shard(&self) -> Result<(), IngestError> {
        if self.narrative_shard.is_whole() || self.role == Role::Narratives {
            return Ok(());
        }
        Err(IngestError::ShardRole {
            shard: self.narrative_shard,
            role: self.role.as_str(),
        })
    }
}

/// Base client settings: brokers plus the configured librdkafka extras.
pub(super) fn kafka_config(cfg: &IngestConfig) -> ClientConfig {
    client_settings(cfg).client_config()
}

/// Bound what librdkafka prefetches, unless `[kafka.ingest.properties]` sets it.
///
/// It prefetches up to 64 MB by default; 16 MB keeps a backlog's records in Kafka rather than
/// in this process, and still covers many batches. With one queue per partition (`align`)
/// the bound applies to each, so the 16 MB are shared out among the partitions expected
/// (`partitions` per event topic; the count is not known before assignment, so topics with
/// more partitions prefetch more). The bound counts the records' bytes; a fetch may bring
/// each partition up to `max.partition.fetch.bytes` more (docs/OPERATIONS.md, "Memory").
pub(super) fn bound_prefetch(cfg: &IngestConfig, c: &mut ClientConfig) {
    if cfg
        .kafka_properties
        .contains_key("queued.max.messages.kbytes")
    {
        return;
    }
    let queues = if cfg.role != Role::Facts && cfg.align_skew_ms > 0 {
        cfg.topics.event_topics().len() * cfg.partitions.max(1) as usize
    } else {
        1
    };
    let kbytes = (16384 / queues.max(1)).max(512);
    c.set("queued.max.messages.kbytes", kbytes.to_string());
}

fn client_settings(cfg: &IngestConfig) -> ClientSettings {
    ClientSettings::new(&cfg.brokers, &cfg.kafka_properties)
}

/// Create the event and dead-letter topics that do not exist yet ([`weft_kafka::ensure_topics`]).
/// The admin client takes the same librdkafka extras as the consumer, so SASL/TLS settings
/// apply to it too.
pub(super) async fn ensure_topics(cfg: &IngestConfig) -> Result<(), IngestError> {
    let layout = TopicLayout {
        partitions: cfg.partitions,
        replication_factor: cfg.replication_factor,
    };
    weft_kafka::ensure_topics(&client_settings(cfg), &cfg.topics, layout).await?;
    Ok(())
}

/// Parse the status server address (empty = disabled).
pub fn listen_addr(cfg: &IngestConfig) -> Result<Option<SocketAddr>, IngestError> {
    if cfg.listen.is_empty() {
        return Ok(None);
    }
    cfg.listen
        .parse()
        .map(Some)
        .map_err(|_| IngestError::Listen(cfg.listen.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With one queue per partition the 16 MB are shared out; a value the operator set is
    /// left alone.
    #[test]
    fn the_prefetch_is_shared_out_among_the_queues() {
        let get = |cfg: &IngestConfig| {
            let mut c = ClientConfig::new();
            bound_prefetch(cfg, &mut c);
            c.get("queued.max.messages.kbytes").map(str::to_owned)
        };
        let aligned = IngestConfig::default();
        assert_eq!(aligned.role, Role::All);
        assert!(aligned.align_skew_ms > 0);
        let queues = aligned.topics.event_topics().len() * 4;
        assert_eq!(get(&aligned), Some((16384 / queues).max(512).to_string()));
        let facts = IngestConfig {
            role: Role::Facts,
            ..IngestConfig::default()
        };
        assert_eq!(get(&facts), Some("16384".into()), "one queue: all 16 MB");
        let mut set = IngestConfig::default();
        set.kafka_properties
            .insert("queued.max.messages.kbytes".into(), "64".into());
        assert_eq!(get(&set), None, "left to the operator's value");
    }

    #[test]
    fn only_the_narratives_role_commits_under_a_group_of_its_own() {
        let mut cfg = IngestConfig {
            group_id: "g".into(),
            ..IngestConfig::default()
        };
        for (role, group) in [
            (Role::All, "g"),
            (Role::Facts, "g"),
            (Role::Narratives, "g.narratives"),
        ] {
            cfg.role = role;
            assert_eq!(cfg.kafka_group(), group, "{role:?}");
        }
    }

    #[test]
    fn each_narrative_shard_commits_under_its_own_group_and_only_narratives_shard() {
        let mut cfg = IngestConfig {
            group_id: "g".into(),
            role: Role::Narratives,
            narrative_shard: NarrativeShard::new(1, 3).unwrap(),
            ..IngestConfig::default()
        };
        assert_eq!(cfg.kafka_group(), "g.narratives.1of3");
        assert!(cfg.check_shard().is_ok());
        for role in [Role::All, Role::Facts] {
            cfg.role = role;
            let err = cfg.check_shard().unwrap_err().to_string();
            assert!(
                err.contains("1/3") && err.contains("--role narratives"),
                "{err}"
            );
        }
        // The whole stage is no shard: every role takes it.
        cfg.narrative_shard = NarrativeShard::WHOLE;
        assert!(cfg.check_shard().is_ok());
    }
}

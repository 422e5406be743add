//! Configuration of the publish path: the `[publisher]` and `[gateway]` TOML sections.
//!
//! Every knob has a default that is safe for production (acks=all, idempotence, fsync per
//! group commit), so an empty section is a working configuration. Unknown keys are errors:
//! a typo must not silently fall back to a default.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use weft_schemas::wire::ContentType;
use weft_schemas::Topics;

/// How the record value is encoded, as written in configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ValueFormat {
    /// The payload's JSON text, byte-for-byte as submitted.
    #[default]
    Json,
    /// Avro single-object encoding (`C3 01` + fingerprint + datum); needs no registry.
    Avro,
    /// Confluent framing (`00` + schema id + datum); needs `schema_registry_url`.
    AvroConfluent,
}

impl ValueFormat {
    /// The wire content type this format produces.
    pub fn content_type(self) -> ContentType {
        match self {
            ValueFormat::Json => ContentType::Json,
            ValueFormat::Avro => ContentType::AvroSingleObject,
            ValueFormat::AvroConfluent => ContentType::AvroConfluent,
        }
    }
}

impl FromStr for ValueFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "json" => Ok(Self::Json),
            "avro" => Ok(Self::Avro),
            "avro-confluent" => Ok(Self::AvroConfluent),
            other => Err(format!(
                "unknown content type `{other}` (expected json, avro or avro-confluent)"
            )),
        }
    }
}

/// When the spool calls `fsync`, and therefore what a spooled receipt promises.
///
/// - `always`: every group of appends is fsynced before its receipts resolve (survives power
///   loss; appends are batched, so this costs one fsync per batch, not per event);
/// - `interval:<ms>`: fsync at most every `ms`; receipts resolve after the fsync that covers
///   them, so latency grows by up to `ms` but the promise is the same as `always`;
/// - `never`: receipts resolve once the bytes are written to the OS (survives a crash of the
///   process, not of the machine).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FsyncPolicy {
    /// Fsync every group of appends before its receipts resolve (the default).
    #[default]
    Always,
    /// Fsync at most once per interval; receipts wait for the fsync that covers them.
    Interval(Duration),
    /// Never fsync: receipts resolve once the OS has the bytes.
    Never,
}

impl FromStr for FsyncPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "always" => Ok(Self::Always),
            "never" => Ok(Self::Never),
            other => other
                .strip_prefix("interval:")
                .and_then(|ms| ms.trim_end_matches("ms").parse::<u64>().ok())
                .filter(|ms| *ms > 0)
                .map(|ms| Self::Interval(Duration::from_millis(ms)))
                .ok_or_else(|| {
                    format!(
                        "bad fsync policy `{other}` (expected always, never or interval:<ms>, ms > 0)"
                    )
                }),
        }
    }
}

impl fmt::Display for FsyncPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Always => f.write_str("always"),
            Self::Never => f.write_str("never"),
            Self::Interval(d) => write!(f, "interval:{}", d.as_millis()),
        }
    }
}

impl Serialize for FsyncPolicy {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for FsyncPolicy {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Settings of the [`crate::Publisher`]: where events go, how they are encoded, how the
/// Kafka producer batches, and where and how the durable spool lives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PublisherConfig {
    /// Kafka bootstrap servers, comma-separated. The CLI fills it from `[kafka]` and
    /// `[kafka.publisher]`; in the file, `[publisher] brokers` is a deprecated alias of
    /// `[kafka.publisher] brokers`.
    pub brokers: String,
    /// Topic names (one per kind). Consumers read the same section, so both sides agree.
    pub topics: Topics,
    /// Partitions given to topics that `ensure_topics` creates. Per-request order holds within
    /// a partition, so more partitions only spread load, never reorder one request.
    pub partitions: i32,
    /// Replication factor for created topics (1 on a single local broker).
    pub replication_factor: i32,
    /// Record value encoding: `json` (default), `avro` (single-object) or `avro-confluent`.
    pub content_type: ValueFormat,
    /// Confluent schema registry base URL; required by `avro-confluent`, which registers each
    /// kind's schema under `<topic>-value` at start-up to learn its id.
    pub schema_registry_url: Option<String>,
    /// Tenant of events published through the typed helpers (`Publisher::publish_contract`).
    pub tenant: String,
    /// Stamped on events that carry none. Default `<hostname>-<pid>-<start>` (`<start>`: when
    /// the publisher started, in microseconds since the epoch), new at every start, so
    /// `(producer_id, seq)` identifies an emission even across restarts of a container,
    /// which restarts as PID 1 under the same host name. A configured id is used as it is:
    /// then it is the operator's to keep apart across restarts.
    pub producer_id: Option<String>,
    /// How long librdkafka waits to fill a batch (`linger.ms`): throughput vs latency.
    pub linger_ms: u64,
    /// Maximum batch size in bytes (`batch.size`).
    pub batch_bytes: u64,
    /// Maximum messages per batch (`batch.num.messages`).
    pub batch_messages: u64,
    /// Batch compression (`compression.type`): none, gzip, snappy, lz4 or zstd.
    pub compression: String,
    /// Producer acknowledgement level (`acks`). Idempotence requires `all`; a receipt means
    /// "acknowledged by all in-sync replicas" only with `all`.
    pub acks: String,
    /// Idempotent producer (`enable.idempotence`): no duplicates from internal retries.
    pub idempotence: bool,
    /// How long a message may wait for delivery before it counts as failed and is spooled
    /// (`message.timeout.ms`). This is how long a broker outage goes unnoticed.
    pub message_timeout_ms: u64,
    /// In-memory queue bound, in messages (`queue.buffering.max.messages`). When full, new
    /// events go to the spool instead of blocking the caller.
    pub queue_bound: u64,
    /// Most events sent and not yet acknowledged by the broker (0: no pacing). Within it, the
    /// bound follows what the broker acknowledges: about a quarter of `message_timeout_ms`
    /// at the measured acknowledgement rate (at least 500), re-measured every second.
    /// `publish` waits (up to `message_timeout_ms`) while the bound is reached, so a slow
    /// broker gets back-pressure instead of messages that time out in librdkafka's queue
    /// (which makes tansu 0.6's sqlite engine panic).
    pub max_in_flight: u64,
    /// Largest encoded record (key + value + headers) accepted. Larger events are refused by
    /// `publish` up front, because Kafka would refuse them forever and block the spool.
    pub max_message_bytes: usize,
    /// Extra librdkafka properties, applied last (e.g. `"socket.keepalive.enable" = "true"`).
    /// The CLI fills them from `[kafka.properties]` and `[kafka.publisher.properties]`; in
    /// the file, `[publisher.kafka_properties]` is a deprecated alias of the latter.
    pub kafka_properties: BTreeMap<String, String>,
    /// Directory of the durable spool. It must be stable across restarts (a restart replays
    /// it) and owned by one process at a time (a lock file enforces that).
    pub spool_dir: PathBuf,
    /// When the spool fsyncs: `always`, `interval:<ms>` or `never` (see [`FsyncPolicy`]).
    pub fsync: FsyncPolicy,
    /// Upper bound of spool disk use in bytes, its segments and `refused.jsonl` together.
    /// When reached, `publish` returns `SpoolFull` (back-pressure) rather than dropping
    /// anything.
    pub spool_max_bytes: u64,
    /// Size at which the spool starts a new segment file; delivered segments are deleted.
    pub spool_segment_bytes: u64,
    /// Records the replayer sends to Kafka per round before it commits its cursor (a round
    /// also stops at 64 MiB of records; one larger record goes alone).
    pub replay_batch: usize,
    /// Seconds after which a spooled record that keeps failing on replay, while Kafka
    /// acknowledges the records sent beside it or refuses its topic, is set aside in the
    /// spool's `refused.jsonl` like one refused for good (a topic deleted behind the spool,
    /// say), so that it cannot hold back every event behind it for ever. 0: retried for
    /// ever. Nothing is set aside while Kafka acknowledges nothing and says nothing.
    pub set_aside_after_secs: u64,
    /// Refuse events whose payload has top-level keys neither defined by their kind nor of
    /// the `x_<org>_<field>` shape (`nonconforming_key`); by default they are only counted
    /// (`weft_publisher_nonconforming_keys_total`) and logged. The gateway has its own
    /// setting (`[gateway] refuse_nonconforming_keys`) for the items it receives.
    pub refuse_nonconforming_keys: bool,
}

impl Default for PublisherConfig {
    fn default() -> Self {
        Self {
            brokers: String::new(),
            topics: Topics::default(),
            partitions: 4,
            replication_factor: 1,
            content_type: ValueFormat::Json,
            schema_registry_url: None,
            tenant: weft_schemas::DEFAULT_TENANT.into(),
            producer_id: None,
            linger_ms: 5,
            batch_bytes: 1_000_000,
            batch_messages: 10_000,
            compression: "lz4".into(),
            acks: "all".into(),
            idempotence: true,
            message_timeout_ms: 10_000,
            queue_bound: 200_000,
            max_in_flight: 20_000,
            max_message_bytes: 1_000_000,
            kafka_properties: BTreeMap::new(),
            spool_dir: PathBuf::from(".weft/spool"),
            fsync: FsyncPolicy::Always,
            spool_max_bytes: 1 << 30,
            spool_segment_bytes: 64 << 20,
            replay_batch: 5_000,
            set_aside_after_secs: 600,
            refuse_nonconforming_keys: false,
        }
    }
}

/// The largest `max_message_bytes`: a spooled record is the message plus its topic name (up
/// to 64 KiB) and header framing, and must stay within the spool's record limit
/// ([`crate::spool::MAX_RECORD`]), or the spool would refuse it when Kafka is down.
pub const MAX_MESSAGE_BYTES: usize = crate::spool::MAX_RECORD as usize - (1 << 20);

/// A configuration that cannot work, caught before any connection is made.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// `brokers` is empty.
    #[error("publisher: no Kafka brokers configured")]
    NoBrokers,
    /// `avro-confluent` was chosen without a `schema_registry_url`.
    #[error("publisher: content_type = \"avro-confluent\" needs schema_registry_url")]
    NoRegistry,
    /// `partitions` is below 1; holds the configured value.
    #[error("publisher: partitions must be >= 1 (got {0})")]
    Partitions(i32),
    /// `spool_max_bytes` is below `spool_segment_bytes`; holds (max, segment).
    #[error("publisher: spool_max_bytes must be >= spool_segment_bytes ({0} < {1})")]
    SpoolBounds(u64, u64),
    /// Idempotence is on but `acks` is not `all`; holds the configured acks.
    #[error("publisher: idempotence requires acks = \"all\" (got `{0}`)")]
    Acks(String),
    /// `max_message_bytes` is over [`MAX_MESSAGE_BYTES`]; holds the configured value.
    #[error(
        "publisher: max_message_bytes must be at most {MAX_MESSAGE_BYTES} (the spool's record limit less room for topic and headers; got {0})"
    )]
    MessageBytes(usize),
    /// `replay_batch` or `queue_bound` is 0.
    #[error("publisher: replay_batch and queue_bound must be >= 1")]
    Zero,
    /// A Kafka property would override a setting `check` validates; holds (property,
    /// the publisher setting to use instead).
    #[error(
        "publisher: the Kafka property `{0}` would bypass the checked `{1}`: set `{1}` instead"
    )]
    Overrides(String, &'static str),
}

/// The librdkafka properties the publisher derives from its own (checked) settings, with the
/// setting each comes from: in `kafka_properties`, applied last, they would silently undo the
/// check (acks=1 under receipts that promise acks=all, or a delivery timeout the spool's
/// replay and pacing do not know).
const DERIVED: [(&str, &str); 6] = [
    ("acks", "acks"),
    ("request.required.acks", "acks"),
    ("enable.idempotence", "idempotence"),
    ("message.timeout.ms", "message_timeout_ms"),
    ("delivery.timeout.ms", "message_timeout_ms"),
    ("message.max.bytes", "max_message_bytes"),
];

impl PublisherConfig {
    /// Reject combinations that would fail later, or silently weaken a guarantee.
    pub fn check(&self) -> Result<(), ConfigError> {
        if self.brokers.trim().is_empty() {
            return Err(ConfigError::NoBrokers);
        }
        if self.content_type == ValueFormat::AvroConfluent && self.schema_registry_url.is_none() {
            return Err(ConfigError::NoRegistry);
        }
        if self.partitions < 1 {
            return Err(ConfigError::Partitions(self.partitions));
        }
        if self.spool_max_bytes < self.spool_segment_bytes {
            return Err(ConfigError::SpoolBounds(
                self.spool_max_bytes,
                self.spool_segment_bytes,
            ));
        }
        if self.idempotence && self.acks != "all" && self.acks != "-1" {
            return Err(ConfigError::Acks(self.acks.clone()));
        }
        if self.max_message_bytes > MAX_MESSAGE_BYTES {
            return Err(ConfigError::MessageBytes(self.max_message_bytes));
        }
        if self.replay_batch == 0 || self.queue_bound == 0 {
            return Err(ConfigError::Zero);
        }
        if let Some((key, setting)) = DERIVED
            .iter()
            .find(|(key, _)| self.kafka_properties.contains_key(*key))
        {
            return Err(ConfigError::Overrides((*key).to_owned(), setting));
        }
        Ok(())
    }

    /// The producer id to stamp: configured, or `<hostname>-<pid>-<start>`, `<start>` the
    /// time of this call in microseconds since the epoch, later than the previous call's in
    /// this process. Each publisher counts `seq` from 1, and a container restarts as PID 1
    /// under the same host name, so the start time is what tells a restarted process's
    /// emissions from its predecessor's.
    pub fn effective_producer_id(&self) -> String {
        self.producer_id
            .clone()
            .unwrap_or_else(|| format!("{}-{}-{}", hostname(), std::process::id(), start_micros()))
    }
}

/// Now, in microseconds since the epoch, and later than every earlier call in this process
/// (two publishers started in one microsecond still differ).
fn start_micros() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64);
    let prev = LAST
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |last| {
            Some(now.max(last + 1))
        })
        .unwrap_or_else(|last| last);
    now.max(prev + 1)
}

/// This machine's host name (`unknown` if the OS will not say).
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its whole length; gethostname NUL-terminates within it
    // or truncates, and we stop at the first NUL or the end.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_section_is_the_default_and_unknown_keys_fail() {
        let c: PublisherConfig = toml::from_str("").unwrap();
        assert_eq!(c, PublisherConfig::default());
        assert!(toml::from_str::<PublisherConfig>("linger = 3").is_err());
    }

    #[test]
    fn parses_every_knob() {
        let c: PublisherConfig = toml::from_str(
            r#"
            brokers = "a:1,b:2"
            partitions = 8
            content_type = "avro-confluent"
            schema_registry_url = "http://reg:8081"
            fsync = "interval:50"
            compression = "zstd"
            [topics]
            prefix = "staging."
            [kafka_properties]
            "socket.keepalive.enable" = "true"
            "#,
        )
        .unwrap();
        assert_eq!(c.partitions, 8);
        assert_eq!(c.content_type, ValueFormat::AvroConfluent);
        assert_eq!(c.fsync, FsyncPolicy::Interval(Duration::from_millis(50)));
        assert_eq!(c.topics.prefix, "staging.");
        c.check().unwrap();
    }

    /// The default producer id differs for every publisher this process or a later one
    /// starts: a container restarts as PID 1 under the same host name (a StatefulSet pod
    /// keeps its name) and its `seq` restarts at 1, so `<hostname>-<pid>` alone gave the
    /// restarted process the ids of the emissions before it. It carries the start time, so
    /// a later start has a later one.
    #[test]
    fn the_default_producer_id_is_new_at_every_start() {
        let micros = || {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_micros() as u64
        };
        let before = micros();
        let c = PublisherConfig::default();
        let (a, b) = (c.effective_producer_id(), c.effective_producer_id());
        assert_ne!(a, b, "two starts, two ids");
        let prefix = format!("{}-{}-", hostname(), std::process::id());
        for id in [&a, &b] {
            let started = id
                .strip_prefix(&prefix)
                .and_then(|t| t.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("`{id}` is {prefix}<start, µs since the epoch>"));
            assert!((before..=micros() + 1).contains(&started), "{id}");
        }
        let named = PublisherConfig {
            producer_id: Some("kernel-7".into()),
            ..PublisherConfig::default()
        };
        assert_eq!(named.effective_producer_id(), "kernel-7");
    }

    #[test]
    fn fsync_policy_round_trips_and_rejects_garbage() {
        for s in ["always", "never", "interval:250"] {
            assert_eq!(s.parse::<FsyncPolicy>().unwrap().to_string(), s);
        }
        assert!("interval:0".parse::<FsyncPolicy>().is_err());
        assert!("sometimes".parse::<FsyncPolicy>().is_err());
    }

    #[test]
    fn check_catches_weakened_guarantees() {
        let ok = PublisherConfig {
            brokers: "k:1".into(),
            ..Default::default()
        };
        ok.check().unwrap();
        let c = PublisherConfig {
            acks: "1".into(),
            ..ok.clone()
        };
        assert!(matches!(c.check(), Err(ConfigError::Acks(_))));
        let c = PublisherConfig {
            content_type: ValueFormat::AvroConfluent,
            ..ok.clone()
        };
        assert!(matches!(c.check(), Err(ConfigError::NoRegistry)));
        // A property that would undo a checked setting names the setting to use.
        let mut c = ok.clone();
        c.kafka_properties.insert("acks".into(), "1".into());
        let e = c.check().unwrap_err();
        assert!(matches!(e, ConfigError::Overrides(..)), "{e}");
        assert!(e.to_string().contains("`acks`"), "{e}");
        let mut c = ok.clone();
        c.kafka_properties
            .insert("socket.keepalive.enable".into(), "true".into());
        assert!(c.check().is_ok(), "other properties pass");
        // Events the spool could not hold would fail exactly when Kafka is down.
        let c = PublisherConfig {
            max_message_bytes: crate::spool::MAX_RECORD as usize,
            ..ok.clone()
        };
        assert!(matches!(c.check(), Err(ConfigError::MessageBytes(_))));
        assert!(matches!(
            PublisherConfig::default().check(),
            Err(ConfigError::NoBrokers)
        ));
        assert!(!hostname().is_empty());
    }
}

//! `weft ingest`: Kafka -> ClickHouse facts and narratives.

use std::sync::Arc;

use clap::Args;
use tokio::sync::watch;
use weft_consumers::http::{self, AppState};
use weft_consumers::ingest::{listen_addr, IngestError, Ingestor, Role};
use weft_consumers::metrics::IngestMetrics;
use weft_consumers::narrative::shard::NarrativeShard;
use weft_http::ApiKeys;
use weft_store::Store;

use crate::config::Settings;

/// Consume the weaver topics into ClickHouse, exactly once, and build narratives.
///
/// Each record is decoded (JSON, Avro single-object or Confluent), validated against
/// weaver-spec 0.9.0, deduplicated by identity and stored in `weft_events`; records that
/// cannot be ingested go to the dead-letter topic with a `weft-dlq-reason` header. Where to
/// resume is read from ClickHouse, so a crash at any point neither loses nor duplicates.
///
/// Roles: `all` (default; one process over every partition, facts and narratives),
/// `facts` (scale-out: partitions shared via the consumer group), `narratives` (the single
/// projector beside several `facts` processes, or N of them with `--narrative-shard I/N`).
///
/// Run `weft migrate` first. Status server (default 127.0.0.1:8788): /healthz (503 while
/// stalled), /metrics and GET /v1/narratives/{id} (bearer key). SIGTERM/SIGINT: the
/// buffered records are flushed if that can be done quickly; the process ends within 10 s
/// in every state.
#[derive(Debug, Args)]
pub struct IngestArgs {
    /// Status server address; loopback unless --allow-remote.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Allow --listen on a non-loopback address.
    #[arg(long)]
    pub allow_remote: bool,
    /// Which stages this process runs.
    #[arg(long, value_enum)]
    pub role: Option<RoleArg>,
    /// Consumer group.
    #[arg(long, value_name = "GROUP")]
    pub group: Option<String>,
    /// Topic name prefix (default `weaver.`).
    #[arg(long, env = "WEFT_TOPIC_PREFIX", value_name = "PREFIX")]
    pub topic_prefix: Option<String>,
    /// Flush when this many records are buffered over all partitions (default 50000):
    /// one flush is one facts insert and one narrative pass, so larger is cheaper in CPU
    /// (fewer, larger parts for ClickHouse to write and merge) but holds more in memory
    /// (two decoded batches while a backlog drains).
    #[arg(long, value_name = "N")]
    pub batch_max_rows: Option<usize>,
    /// Flush batches at least this often, in milliseconds (default 1000).
    #[arg(long, value_name = "MS")]
    pub flush_interval_ms: Option<u64>,
    /// Largest record value stored, and largest dead letter produced, in bytes (default
    /// 1000000; keep equal to the publishers' `[publisher] max_message_bytes`). Larger
    /// records are dead-lettered (`too_large`), cut to fit, with their size and SHA-256.
    #[arg(long, value_name = "BYTES")]
    pub max_message_bytes: Option<usize>,
    /// Seconds with fetched records waiting and none stored before /healthz answers 503 and
    /// `weft_ingest_stalled` is 1 (default 120; 0 disables).
    #[arg(long, value_name = "SECS")]
    pub stall_after_secs: Option<u64>,
    /// Nodes the narrative graph keeps in memory (default 300000, about 180 MB; its tables
    /// are sized for it and a half at start, so they never grow later): beyond it
    /// the least recently touched components are evicted, and load again from ClickHouse
    /// when a later event names them. Narratives stay exact at any value.
    #[arg(long, value_name = "NODES")]
    pub narrative_max_nodes: Option<usize>,
    /// How far ahead in record time one partition may be read of the slowest one with
    /// records waiting, in milliseconds (default 500; 0 reads partitions as fetched).
    /// A request's events sit in several topics of different sizes: aligned, they meet in
    /// the same narrative pass while a backlog drains, rather than after eviction.
    #[arg(long, value_name = "MS")]
    pub align_skew_ms: Option<u64>,
    /// With `--role narratives`: project only shard I of N of the tenants (`I/N`, I from 0),
    /// so N processes share the narratives, one per shard, each reading every partition
    /// (default: every tenant). A tenant's shard is xxHash64(tenant) mod N; one tenant is
    /// one process's work. Changing N: docs/NARRATIVES.md, "Several processes".
    #[arg(long, env = "WEFT_NARRATIVE_SHARD", value_name = "I/N")]
    pub narrative_shard: Option<NarrativeShard>,
    /// Identities each partition holds exactly, per generation (default 20000; the two
    /// generations' tables are sized for it when the partition is assigned, about 1.3 MB
    /// each at the default): copies of older ones are found through the window's filter and
    /// a ClickHouse check, so deduplication stays exact at any value.
    #[arg(long, value_name = "IDENTITIES")]
    pub dedup_max_entries: Option<usize>,
    /// Keys for the narrative API: `KEY=TENANT[,KEY=TENANT...]`, each key scoped
    /// to one tenant (at least 16 characters).
    #[arg(
        long,
        env = "WEFT_API_KEYS",
        hide_env_values = true,
        value_name = "KEY=TENANT,..."
    )]
    pub api_keys: Option<String>,
    /// File with one `KEY=TENANT` per line.
    #[arg(long, env = "WEFT_API_KEYS_FILE", value_name = "FILE")]
    pub api_keys_file: Option<String>,
    /// The most rows any one ClickHouse query of a narrative API request may read
    /// (ClickHouse's max_rows_to_read; 0: no limit); past it the request is refused (422
    /// `too_large`). Ingest's own queries are not limited.
    #[arg(
        long,
        env = "WEFT_API_MAX_READ_ROWS",
        value_name = "ROWS",
        default_value_t = 5_000_000
    )]
    pub api_max_read_rows: u64,
}

/// `--role` values.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum RoleArg {
    All,
    Facts,
    Narratives,
}

/// The API keys from the flag/env list and the optional file.
pub fn api_keys(list: Option<&str>, file: Option<&str>) -> anyhow::Result<ApiKeys> {
    Ok(ApiKeys::load(&weft_http::KeySources {
        list,
        list_origin: "WEFT_API_KEYS / --api-keys",
        map: None,
        file: file.map(std::path::Path::new),
    })?)
}

/// How long `weft ingest` may take to stop after SIGTERM/SIGINT before it exits anyway.
const SHUTDOWN_DEADLINE: std::time::Duration = std::time::Duration::from_secs(9);

pub async fn run(a: IngestArgs, settings: Settings) -> anyhow::Result<()> {
    let mut cfg = settings.ingest.clone();
    if cfg.brokers.is_empty() {
        cfg.brokers = settings.kafka.brokers.clone();
    }
    // One place names the topics, for publishers and consumers alike: `[publisher.topics]`.
    cfg.topics = settings.publisher.topics.clone();
    // And the schema registry that numbers `avro-confluent` records: `[publisher]`'s.
    cfg.schema_registry_url = settings.publisher.schema_registry_url.clone();
    if let Some(v) = a.listen {
        cfg.listen = v;
    }
    if let Some(r) = a.role {
        cfg.role = match r {
            RoleArg::All => Role::All,
            RoleArg::Facts => Role::Facts,
            RoleArg::Narratives => Role::Narratives,
        };
    }
    if let Some(v) = a.group {
        cfg.group_id = v;
    }
    if let Some(v) = a.topic_prefix {
        cfg.topics.prefix = v;
    }
    if let Some(v) = a.batch_max_rows {
        cfg.batch_max_rows = v.max(1);
    }
    if let Some(v) = a.flush_interval_ms {
        cfg.flush_interval_ms = v;
    }
    if let Some(v) = a.max_message_bytes {
        cfg.max_message_bytes = v;
    }
    if let Some(v) = a.stall_after_secs {
        cfg.stall_after_secs = v;
    }
    if let Some(v) = a.align_skew_ms {
        cfg.align_skew_ms = v;
    }
    if let Some(v) = a.narrative_max_nodes {
        cfg.narrative_max_nodes = v;
    }
    if let Some(v) = a.dedup_max_entries {
        cfg.dedup_max_entries = v;
    }
    if let Some(v) = a.narrative_shard {
        cfg.narrative_shard = v;
    }
    cfg.check_shard()?;
    let keys = api_keys(a.api_keys.as_deref(), a.api_keys_file.as_deref())?;
    let store = Store::new(settings.clickhouse)?;
    let metrics = Arc::new(IngestMetrics::new());
    #[cfg(unix)]
    metrics.registry().register(crate::heap::Heap::new());
    metrics.health.set_stall_after(cfg.stall_after_secs);
    if let Some(addr) = listen_addr(&cfg)? {
        let listener = weft_http::bind(addr, a.allow_remote).await?;
        let app = http::router(AppState {
            store: store.with_read_limit(a.api_max_read_rows),
            metrics: metrics.clone(),
            keys: Arc::new(keys),
        });
        tracing::info!(%addr, "status server listening");
        tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(error = %e, "status server stopped");
            }
        });
    }
    let (tx, mut rx) = watch::channel(false);
    tokio::spawn(async move {
        weft_http::shutdown_signal().await;
        let _ = tx.send(true);
        // SIGTERM ends the process within 10 s in every state: whatever still waits then
        // (a Kafka or ClickHouse call that does not answer) is cut short. Nothing is lost:
        // a restart resumes from what ClickHouse stores, as after a crash.
        std::thread::spawn(|| {
            std::thread::sleep(SHUTDOWN_DEADLINE);
            tracing::warn!("still stopping {SHUTDOWN_DEADLINE:?} after the signal: exiting now (a restart resumes from the stored offsets)");
            std::process::exit(0);
        });
    });
    let ingestor = tokio::select! {
        i = Ingestor::start(cfg, store, metrics, rx.clone()) => i?,
        _ = rx.changed() => return Ok(()),
    };
    let totals = match ingestor.run().await {
        // Asked to stop while it waited before reading a partition's resume point.
        Err(IngestError::Stopped) => return Ok(()),
        r => r?,
    };
    eprintln!(
        "ingest stopped: {} consumed, {} stored, {} duplicates dropped, {} dead-lettered",
        totals.consumed, totals.inserted, totals.deduplicated, totals.dead_lettered
    );
    Ok(())
}

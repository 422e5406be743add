//! `weft bench ingest`: ingest throughput and CPU cost, against ClickHouse's own Kafka table
//! engine reading the same topics.
//!
//! One run, on the stack given by the usual settings (use a private one, see `docs/BENCHMARKS.md`):
//! 1. simulate N events (clean mix) and publish them through the Publisher into fresh topics
//!    (`bench-ingest-<run>.*`), and migrate a fresh database (`weft_bench_<run>`);
//! 2. run the real [`Ingestor`] in this process until every fact is stored (and, with role
//!    `all`, projected), measuring wall time, this process's CPU (getrusage, all threads), and
//!    the ClickHouse server's and the broker's CPU from `/proc/<pid>/stat`;
//! 3. for each requested variant, a `Kafka` engine table plus a materialized view into a
//!    MergeTree table drains the same topics under a fresh consumer group, measured the same way;
//! 4. with `--floor`, bare consumers that each add one required duty drain them too
//!    (see `floor`);
//! 5. offline, the per-event CPU of each ingest step on a sample (where the time goes).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use serde::Serialize;
use tokio::sync::watch;
use weft_consumers::decode::{self, Record};
use weft_consumers::facts::{copy_hash, identity_key, DedupCache};
use weft_consumers::ingest::{IngestConfig, IngestTotals, Ingestor, Role};
use weft_consumers::metrics::IngestMetrics;
use weft_producers::{Delivery, PublisherConfig, Receipt};
use weft_schemas::wire::{self, ContentType, SchemaIds};
use weft_schemas::{identity, links, Envelope, Topics};
use weft_sim::{Mix, SimConfig, Simulation};
use weft_store::{ClickHouseConfig, EventRow, Store};

use crate::ch::{count, exec, settle_merges};
use crate::cpu::{self, ThreadCpu, Who};
use floor::FloorPhase;
use kafka_engine::kafka_engine;
use report::{print_report, IngestReport, Phase, Spans, Step};
use steps::step_costs;

mod floor;
mod kafka_engine;
mod report;
mod steps;

/// The target: events per consumer CPU-second.
const TARGET_EVENTS_PER_CPU_S: f64 = 250_000.0;
/// How often the drain is polled (`SELECT count()`), in both phases alike.
const POLL: Duration = Duration::from_millis(100);

/// Measure `weft ingest` (in this process) against ClickHouse's Kafka engine + MV.
///
/// Publishes N simulated events (clean mix) into fresh topics, ingests them into a fresh
/// database, and reports wall seconds, events/s, consumer CPU-seconds (this process, all
/// threads, ingest phase only), events per consumer CPU-second, and the ClickHouse server's
/// and the broker's CPU-seconds over the same phase. Then ClickHouse's own Kafka table engine
/// with a materialized view drains the same topics, measured the same way.
///
/// Run it on a private stack with the memory storage engine (the sqlite engine makes the
/// broker the bottleneck):
///   export WEFT_KAFKA_PORT=39092 WEFT_CH_HTTP_PORT=38123 WEFT_CH_TCP_PORT=39000 \
///     WEFT_RUN_DIR=/tmp/weft-bench-run WEFT_KAFKA_STORAGE=memory
///   bash deploy/local/stack.sh up && source /tmp/weft-bench-run/env
///   weft bench ingest --events 1000000
///
/// The ClickHouse and broker pids come from $WEFT_RUN_DIR/{clickhouse,kafka}.pid, or from
/// whoever listens on the configured ports.
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct BenchIngestArgs {
    /// Events to generate and ingest (whole flows, so slightly more).
    #[arg(long, default_value_t = 1_000_000, value_name = "N")]
    pub events: u64,

    /// Partitions of each fresh topic.
    #[arg(long, default_value_t = 4, value_name = "N")]
    pub partitions: i32,

    /// Ingest role: `all` (facts and narratives) or `facts` (facts only, consumer group).
    #[arg(long, value_enum, default_value = "all")]
    pub role: RoleArg,

    /// Ingest batch size (records buffered over all partitions per flush); the default is
    /// `weft ingest`'s.
    #[arg(long, default_value_t = weft_consumers::ingest::IngestConfig::default().batch_max_rows, value_name = "N")]
    pub batch_max_rows: usize,

    /// Kafka engine variants to measure after weft's ingest: `raw` (payload, topic,
    /// partition, offset), `typed` (the weft_events columns extracted with JSONExtract,
    /// same sort key), or none.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "raw,typed")]
    pub kafka_engine: Vec<EngineVariant>,

    /// `kafka_max_block_size` of the Kafka engine table (default: ClickHouse's).
    #[arg(long, value_name = "ROWS")]
    pub kafka_engine_block_size: Option<u64>,

    /// Also drain the topics with three bare consumers that each add one required duty
    /// (consume; + parse and JSON Schema; + RowBinary insert): the floor that librdkafka,
    /// serde_json, jsonschema and the clickhouse crate set before any weft code runs.
    #[arg(long)]
    pub floor: bool,

    /// Simulation seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,

    /// Give up on a phase after this many seconds.
    #[arg(long, default_value_t = 900, value_name = "SECS")]
    pub timeout_secs: u64,

    /// Events in the offline per-step CPU sample (0 to skip it).
    #[arg(long, default_value_t = 100_000, value_name = "N")]
    pub sample: usize,

    /// Record the ingest phase with `perf record -F 999 -p <this pid>` into FILE.
    #[arg(long, value_name = "FILE")]
    pub perf_out: Option<PathBuf>,

    /// ClickHouse server pid (default: $WEFT_RUN_DIR/clickhouse.pid, else by port).
    #[arg(long, value_name = "PID")]
    pub clickhouse_pid: Option<u32>,

    /// Broker pid (default: $WEFT_RUN_DIR/kafka.pid, else by port).
    #[arg(long, value_name = "PID")]
    pub broker_pid: Option<u32>,

    /// Keep the database afterwards (it is dropped by default; topics are left).
    #[arg(long)]
    pub keep: bool,

    /// Print the report as JSON on stdout (the table goes to stderr).
    #[arg(long)]
    pub json: bool,
}

/// `--role` values (as `weft ingest --role`; `narratives` stores no facts and is refused).
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum RoleArg {
    All,
    Facts,
    Narratives,
}

/// What the benchmark runs against, resolved by the caller from its configuration.
#[derive(Debug, Clone)]
pub struct Stack {
    /// ClickHouse; the benchmark makes a fresh database of its own there.
    pub clickhouse: ClickHouseConfig,
    /// Kafka bootstrap servers of ingest (and of the Kafka engine and floors).
    pub brokers: String,
    /// `weft ingest`'s settings, which the benchmark's ingest starts from.
    pub ingest: IngestConfig,
    /// The Publisher's settings (its defaults plus environment and config); the benchmark
    /// sets its own topics, partitions and spool.
    pub publisher: PublisherConfig,
}

/// A Kafka engine variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EngineVariant {
    Raw,
    Typed,
    None,
}

// ---------------------------------------------------------------------------------------
// CPU snapshots

/// CPU and wall clock at one instant.
struct Snapshot {
    at: Instant,
    me: f64,
    clickhouse: f64,
    broker: f64,
}

impl Snapshot {
    fn take(pids: &Pids) -> Self {
        Self {
            at: Instant::now(),
            me: cpu::rusage(Who::Process),
            clickhouse: cpu::pid_cpu(pids.clickhouse),
            broker: cpu::pid_cpu(pids.broker),
        }
    }
}

struct Pids {
    clickhouse: Option<u32>,
    broker: Option<u32>,
}

// ---------------------------------------------------------------------------------------
// Report

/// Poll `sql` (a count) until it reaches `target`; returns (first non-zero, done) instants
/// and the count at the first non-zero poll.
async fn drain(
    store: &Store,
    sql: &str,
    target: u64,
    timeout: Duration,
    what: &str,
) -> anyhow::Result<(Instant, u64, Instant)> {
    let started = Instant::now();
    let mut first: Option<(Instant, u64)> = None;
    let mut last_report = Instant::now();
    loop {
        let n = count(store, sql).await?;
        let now = Instant::now();
        if n > 0 && first.is_none() {
            first = Some((now, n));
        }
        if n >= target {
            let (f, fc) = first.unwrap_or((now, n));
            return Ok((f, fc, now));
        }
        if last_report.elapsed() >= Duration::from_secs(10) {
            eprintln!(
                "  {what}: {n}/{target} after {:.0} s",
                started.elapsed().as_secs_f64()
            );
            last_report = Instant::now();
        }
        if started.elapsed() > timeout {
            bail!("{what}: only {n} of {target} after {timeout:?}");
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Stamp an envelope the way the Publisher does, so offline decoding sees the same records.
fn stamp(mut env: Envelope, seq: u64, now: &str) -> Envelope {
    env.producer_id.get_or_insert_with(|| "weft-bench".into());
    env.seq.get_or_insert(seq);
    env.emitted_at.get_or_insert_with(|| now.to_owned());
    env
}

/// Run `weft bench ingest` on `stack` and print its report.
pub async fn run(args: BenchIngestArgs, stack: Stack) -> anyhow::Result<()> {
    let run = crate::ch::run_id();
    let database = format!("weft_bench_{run}");
    let prefix = format!("bench-ingest-{run}.");
    let topics = Topics::with_prefix(prefix.clone());
    let brokers = stack.brokers.clone();
    let pids = Pids {
        clickhouse: cpu::service_pid(
            args.clickhouse_pid,
            "clickhouse",
            cpu::port_of(&stack.clickhouse.url),
        ),
        broker: cpu::service_pid(args.broker_pid, "kafka", cpu::port_of(&brokers)),
    };
    let broker_storage = pids.broker.and_then(|p| {
        let cmd = std::fs::read(format!("/proc/{p}/cmdline")).ok()?;
        let args: Vec<String> = cmd
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let i = args.iter().position(|a| a == "--storage-engine")?;
        args.get(i + 1).cloned()
    });
    if pids.clickhouse.is_none() || pids.broker.is_none() {
        eprintln!(
            "warning: ClickHouse pid {:?}, broker pid {:?}: their CPU is reported as NaN when unknown",
            pids.clickhouse, pids.broker
        );
    }
    if broker_storage
        .as_deref()
        .is_some_and(|s| s.starts_with("sqlite"))
    {
        eprintln!("warning: the broker uses the sqlite engine, which is the bottleneck when fetching: measure with WEFT_KAFKA_STORAGE=memory");
    }
    eprintln!(
        "run {run}: database {database}, topics {prefix}*, brokers {brokers}, ClickHouse {} (pid {:?}), broker pid {:?} ({})",
        stack.clickhouse.url,
        pids.clickhouse,
        pids.broker,
        broker_storage.as_deref().unwrap_or("?")
    );

    // --- Setup: database and topics --------------------------------------------------
    let store = crate::ch::fresh_database(&stack.clickhouse, &database).await?;

    let sim_cfg = SimConfig {
        seed: args.seed,
        min_events: Some(args.events),
        mix: Mix::clean(),
        record_truth: false,
        ..SimConfig::default()
    };
    let result = measure(&args, &stack, &store, &pids, &brokers, &topics, &sim_cfg).await;
    let report = match result {
        Ok(r) => r,
        Err(e) => {
            if !args.keep {
                let _ = exec(&store, &format!("DROP DATABASE IF EXISTS `{database}`")).await;
            }
            return Err(e);
        }
    };
    let report = IngestReport {
        run,
        database: database.clone(),
        topic_prefix: prefix,
        broker_storage,
        clickhouse_pid: pids.clickhouse,
        broker_pid: pids.broker,
        ..report
    };
    if !args.keep {
        exec(&store, &format!("DROP DATABASE IF EXISTS `{database}`")).await?;
    }
    print_report(&report, args.json)?;
    Ok(())
}

/// What the publish step sent.
struct Published {
    envelopes: u64,
    distinct: u64,
    bytes: u64,
    wall_s: f64,
}

/// Step 1: publish the simulation through the Publisher into the run's fresh topics, and
/// wait until every event is in Kafka (the spool drained too).
async fn publish(
    args: &BenchIngestArgs,
    stack: &Stack,
    topics: &Topics,
    sim_cfg: &SimConfig,
) -> anyhow::Result<Published> {
    let mut pconfig = stack.publisher.clone();
    let spool_dir =
        std::env::temp_dir().join(format!("weft-bench-ingest-spool-{}", std::process::id()));
    pconfig.spool_dir = spool_dir.clone();
    pconfig.topics = Topics {
        prefix: topics.prefix.clone(),
        ..pconfig.topics
    };
    if args.partitions > 0 {
        pconfig.partitions = args.partitions;
    }
    let publisher = crate::connect_publisher(pconfig, true).await?;
    eprintln!("publishing {} simulated events ...", args.events);
    let sim = Simulation::new(sim_cfg.clone()).context("simulation config")?;
    let p = publisher.clone();
    let t0 = Instant::now();
    let (envelopes, distinct, bytes, kafka, spooled) = tokio::task::spawn_blocking(move || {
        let mut sim = sim;
        let mut pending: std::collections::VecDeque<Receipt> = Default::default();
        let (mut kafka, mut spooled, mut bytes) = (0u64, 0u64, 0u64);
        let mut settle = |r: Receipt| -> anyhow::Result<()> {
            match r.wait_blocking()? {
                Delivery::Kafka { .. } => kafka += 1,
                Delivery::Spooled => spooled += 1,
            }
            Ok(())
        };
        for env in sim.by_ref() {
            bytes += env.payload.get().len() as u64;
            pending.push_back(p.publish(env)?);
            if pending.len() >= 50_000 {
                if let Some(r) = pending.pop_front() {
                    settle(r)?;
                }
            }
        }
        for r in pending {
            settle(r)?;
        }
        let t = &sim.truth().totals;
        anyhow::Ok((t.envelopes, t.distinct_events, bytes, kafka, spooled))
    })
    .await??;
    let p = publisher.clone();
    let drained = tokio::task::spawn_blocking(move || {
        let ok = p.wait_drained(Duration::from_secs(300));
        p.close(Duration::from_secs(30));
        ok
    })
    .await?;
    let publish_wall = t0.elapsed().as_secs_f64();
    if !drained {
        bail!(
            "the publisher could not deliver its spool within 300 s (kept in {})",
            spool_dir.display()
        );
    }
    // Drained: nothing in it is needed any more.
    if let Err(e) = std::fs::remove_dir_all(&spool_dir) {
        eprintln!("could not remove the spool {}: {e}", spool_dir.display());
    }
    eprintln!(
        "published {envelopes} envelopes ({distinct} distinct, {kafka} acked by Kafka, {spooled} via the spool) in {publish_wall:.1} s"
    );
    Ok(Published {
        envelopes,
        distinct,
        bytes,
        wall_s: publish_wall,
    })
}

/// weft's own drain of the topics: the phase, its totals, threads and spans.
struct WeftRun {
    role: Role,
    phase: Phase,
    totals: IngestTotals,
    threads: Vec<ThreadCpu>,
    spans: Spans,
}

/// Step 2: the real [`Ingestor`] in this process until every fact is stored (and, role
/// `all`, projected), measured from the outside.
async fn weft_ingest(
    args: &BenchIngestArgs,
    stack: &Stack,
    store: &Store,
    pids: &Pids,
    brokers: &str,
    topics: &Topics,
    published: &Published,
) -> anyhow::Result<WeftRun> {
    let timeout = Duration::from_secs(args.timeout_secs);
    let (envelopes, distinct) = (published.envelopes, published.distinct);
    let role = match args.role {
        RoleArg::All => Role::All,
        RoleArg::Facts => Role::Facts,
        RoleArg::Narratives => bail!("--role narratives stores no facts; use all or facts"),
    };
    let mut cfg = stack.ingest.clone();
    cfg.brokers = brokers.to_owned();
    cfg.group_id = format!("weft-bench-ingest-{}", topics.prefix.trim_end_matches('.'));
    cfg.topics = topics.clone();
    cfg.role = role;
    cfg.partitions = args.partitions;
    cfg.batch_max_rows = args.batch_max_rows.max(1);
    cfg.listen = String::new();
    let metrics = Arc::new(IngestMetrics::new());
    let (stop_tx, stop_rx) = watch::channel(false);
    eprintln!("ingesting with weft (role {role:?}) ...");
    let threads0 = cpu::thread_cpu();
    let s0 = Snapshot::take(pids);
    let ingestor = Ingestor::start(cfg, store.clone(), metrics.clone(), stop_rx).await?;
    let perf = match &args.perf_out {
        Some(path) => Some(
            std::process::Command::new("perf")
                .args(["record", "-F", "999", "-q", "-o"])
                .arg(path)
                .args(["-p", &std::process::id().to_string()])
                .stdout(std::process::Stdio::null())
                .spawn()
                .context("starting perf record")?,
        ),
        None => None,
    };
    let task = tokio::spawn(ingestor.run());
    let facts = drain(
        store,
        "SELECT count() FROM weft_events",
        distinct,
        timeout,
        "weft facts",
    )
    .await;
    let projected = match (&facts, role) {
        (Ok(_), Role::All) => Some(
            drain(
                store,
                "SELECT toUInt64(sum(o)) FROM (SELECT argMax(offset, version) + 1 AS o \
                 FROM weft_projector_progress GROUP BY topic, partition)",
                envelopes,
                timeout,
                "weft narratives",
            )
            .await,
        ),
        _ => None,
    };
    let s1 = Snapshot::take(pids);
    let threads1 = cpu::thread_cpu();
    if let Some(mut child) = perf {
        // SAFETY: signalling the perf process this function started.
        unsafe {
            libc::kill(child.id() as libc::pid_t, libc::SIGINT);
        }
        let _ = child.wait();
    }
    let _ = stop_tx.send(true);
    let totals = task.await??;
    let (first, first_n, facts_done) = facts?;
    let done = match projected {
        Some(r) => r?.2,
        None => facts_done,
    };
    let settle_s = settle_merges(store, Duration::from_secs(120)).await;
    let s2 = Snapshot::take(pids);
    let stored = count(store, "SELECT count() FROM weft_events").await?;
    let weft = phase(
        format!("weft ingest (role {})", Role::as_str(role)),
        stored,
        envelopes,
        (&s0, first, first_n, done, &s1, &s2),
        true,
    );
    eprintln!(
        "  weft: {:.1} s, {:.0} events/s, {:.0} events per consumer CPU-second (merges settled in {settle_s:.1} s more)",
        weft.wall_s,
        weft.events_per_s,
        weft.events_per_consumer_cpu_s.unwrap_or(f64::NAN)
    );
    let spans = Spans {
        flushes_with_facts: metrics.batch_rows.get_sample_count(),
        avg_batch_rows: metrics.batch_rows.get_sample_sum()
            / (metrics.batch_rows.get_sample_count().max(1) as f64),
        insert_wall_s: metrics.insert_seconds.get_sample_sum(),
        projector_passes: metrics.narrative.projector_seconds.get_sample_count(),
        projector_wall_s: metrics.narrative.projector_seconds.get_sample_sum(),
        narrative_direct: metrics.narrative.direct.get(),
        narrative_loaded: metrics.narrative.loaded.get(),
    };
    Ok(WeftRun {
        role,
        phase: weft,
        totals,
        threads: cpu::thread_breakdown(&threads0, &threads1),
        spans,
    })
}

#[allow(clippy::too_many_arguments)]
async fn measure(
    args: &BenchIngestArgs,
    stack: &Stack,
    store: &Store,
    pids: &Pids,
    brokers: &str,
    topics: &Topics,
    sim_cfg: &SimConfig,
) -> anyhow::Result<IngestReport> {
    let timeout = Duration::from_secs(args.timeout_secs);

    // --- 1. Publish -------------------------------------------------------------------
    let published = publish(args, stack, topics, sim_cfg).await?;
    let Published {
        envelopes,
        distinct,
        bytes,
        wall_s: publish_wall,
    } = published;

    // --- 2. weft ingest ---------------------------------------------------------------
    let WeftRun {
        role,
        phase: weft,
        totals,
        threads,
        spans,
    } = weft_ingest(args, stack, store, pids, brokers, topics, &published).await?;

    // --- 3. ClickHouse's Kafka engine ------------------------------------------------
    let mut engines = Vec::new();
    for variant in args.kafka_engine.iter().copied() {
        if variant == EngineVariant::None {
            continue;
        }
        engines.push(
            kafka_engine(
                store,
                pids,
                brokers,
                topics,
                variant,
                args.kafka_engine_block_size,
                envelopes,
                timeout,
            )
            .await?,
        );
    }

    // --- 4. The floor under any consumer of these topics -----------------------------
    let floors = if args.floor {
        floor::run(store, brokers, topics, envelopes, timeout).await?
    } else {
        Vec::new()
    };

    // --- 5. Where the time goes (offline, one thread) ---------------------------------
    let steps = if args.sample > 0 {
        let cfg = SimConfig {
            min_events: Some(args.sample as u64),
            ..sim_cfg.clone()
        };
        let n = args.sample;
        let t = topics.clone();
        tokio::task::spawn_blocking(move || step_costs(cfg, n, &t)).await??
    } else {
        Vec::new()
    };

    let best_engine = engines
        .iter()
        .map(|e| e.events_per_s)
        .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))));
    let per_cpu = weft.events_per_consumer_cpu_s.unwrap_or(0.0);
    Ok(IngestReport {
        run: String::new(),
        database: String::new(),
        topic_prefix: String::new(),
        role: Role::as_str(role).into(),
        partitions: args.partitions,
        batch_max_rows: args.batch_max_rows,
        envelopes,
        distinct_events: distinct,
        payload_bytes_avg: bytes as f64 / envelopes.max(1) as f64,
        publish_wall_s: publish_wall,
        publish_events_per_s: envelopes as f64 / publish_wall,
        clickhouse_pid: None,
        broker_pid: None,
        broker_storage: None,
        throughput_vs_kafka_engine: best_engine.map(|b| weft.events_per_s / b),
        meets_cpu_target: per_cpu >= TARGET_EVENTS_PER_CPU_S,
        weft,
        weft_totals: totals,
        weft_threads: threads,
        weft_spans: spans,
        kafka_engine: engines,
        kafka_engine_block_size: args.kafka_engine_block_size,
        floors,
        steps,
        target_events_per_consumer_cpu_s: TARGET_EVENTS_PER_CPU_S,
    })
}

/// Build a [`Phase`] from its snapshots: start, first row (instant and count), done, the
/// snapshot at done, and the one after merges settled.
fn phase(
    name: String,
    rows: u64,
    events: u64,
    (s0, first, first_n, done, s1, s2): (&Snapshot, Instant, u64, Instant, &Snapshot, &Snapshot),
    consumer: bool,
) -> Phase {
    let wall = done.duration_since(s0.at).as_secs_f64();
    let steady_wall = done.duration_since(first).as_secs_f64();
    let ev = events as f64;
    let me = s1.me - s0.me;
    let ch_settled = s2.clickhouse - s0.clickhouse;
    Phase {
        name,
        rows,
        wall_s: wall,
        first_row_s: first.duration_since(s0.at).as_secs_f64(),
        events_per_s: ev / wall,
        steady_events_per_s: if steady_wall > 0.0 {
            (rows.min(events).saturating_sub(first_n)) as f64 / steady_wall
        } else {
            f64::NAN
        },
        consumer_cpu_s: consumer.then_some(me),
        events_per_consumer_cpu_s: consumer.then_some(ev / me),
        clickhouse_cpu_s: s1.clickhouse - s0.clickhouse,
        clickhouse_cpu_settled_s: ch_settled,
        broker_cpu_s: s1.broker - s0.broker,
        total_us_per_event: ((if consumer { me } else { 0.0 }) + ch_settled) / ev * 1e6,
    }
}

//! `weft bench lookup`: narrative lookup latency with ~10M events stored.
//!
//! Loading 10M events through Kafka would take longer than the measurement is worth, so the
//! data is made in two steps, both ending in the real tables:
//! 1. **Template**: the simulator's flows (default mix, 20% of events without a request id,
//!    shuffled) go through the real decoder, the real `EventRow` and the real narrative
//!    projector into `weft_events`, `weft_narratives`, `weft_narrative_nodes` and `weft_links`.
//! 2. **Copies**: ClickHouse copies those rows `INSERT ... SELECT ... FROM numbers()` times,
//!    rewriting every id so each copy is a distinct set of requests (`req-<seed>-7` becomes
//!    `req-<seed>x12-7`; content-hash ids get a fresh hash) and shifting times by the
//!    template's span, so the copies follow each other in time.
//!
//! The lookups then go through [`query::lookup`], the code behind `weft narrative` and
//! `GET /v1/narratives/{id}`, against those tables; half by request id, half by a member's id.
//! Finally `weft narrative ID --format json` is run as a process, to time it end to end.

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use serde::Serialize;
use weft_consumers::decode::{self, Fact, Record};
use weft_consumers::narrative::projector::{ProjectBatch, Projector};
use weft_schemas::wire::{self, ContentType, SchemaIds};
use weft_schemas::Topics;
use weft_sim::{SimConfig, Simulation};
use weft_store::narrative::query;
use weft_store::{ClickHouseConfig, Compression, EventRow, Store};

use crate::ch::{count, exec, settle_merges};

/// The tables a narrative lookup reads, which the load fills and copies.
const TABLES: [&str; 4] = [
    "weft_events",
    "weft_narratives",
    "weft_narrative_nodes",
    "weft_links",
];

/// Measure narrative lookups (p50/p95/p99) with ~N events stored.
///
/// Builds a template of simulated flows through the real decoder and narrative projector,
/// copies it inside ClickHouse (ids rewritten per copy) up to --events, waits for merges to
/// settle, then times --lookups calls of the narrative query (half by request id, half by a
/// member's id) and --cli-runs runs of `weft narrative ID --format json` as a process
/// (with this run's ClickHouse settings; only the runs that find their narrative are timed,
/// the others are counted: not found, failed).
///
///   weft bench lookup --events 10000000 --lookups 2000
///   weft bench lookup --database weft_bench_lookup_keep --keep   # load once, rerun later
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct BenchLookupArgs {
    /// Events to store (template copies are whole, so slightly more).
    #[arg(long, default_value_t = 10_000_000, value_name = "N")]
    pub events: u64,

    /// Timed lookups through the query code.
    #[arg(long, default_value_t = 2_000, value_name = "N")]
    pub lookups: usize,

    /// Timed runs of `weft narrative ID --format json` as a new process.
    #[arg(long, default_value_t = 100, value_name = "N")]
    pub cli_runs: usize,

    /// Flows in the template (about 21 events each).
    #[arg(long, default_value_t = 1_000, value_name = "N")]
    pub template_flows: u64,

    /// Simulation seed; part of every id, so pick one whose `-<seed>-` appears nowhere else.
    #[arg(long, default_value_t = 987_654)]
    pub seed: u64,

    /// Use this database: load it when empty, reuse it when it already holds the events.
    /// Never dropped. Default: a fresh `weft_bench_lookup_<run>`, dropped unless --keep.
    #[arg(long, value_name = "NAME")]
    pub database: Option<String>,

    /// Keep the fresh database afterwards.
    #[arg(long)]
    pub keep: bool,

    /// Print the report as JSON on stdout (the table goes to stderr).
    #[arg(long)]
    pub json: bool,
}

/// Latency percentiles, in milliseconds.
#[derive(Debug, Serialize)]
pub struct Latency {
    pub n: usize,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl Latency {
    fn of(mut d: Vec<Duration>) -> Self {
        d.sort();
        let ms = |x: Duration| x.as_secs_f64() * 1e3;
        let pct = |p: f64| -> f64 {
            if d.is_empty() {
                return f64::NAN;
            }
            // Nearest rank.
            let rank = ((p / 100.0) * d.len() as f64).ceil() as usize;
            ms(d[rank.clamp(1, d.len()) - 1])
        };
        Self {
            n: d.len(),
            mean_ms: d.iter().map(|x| ms(*x)).sum::<f64>() / d.len().max(1) as f64,
            p50_ms: pct(50.0),
            p95_ms: pct(95.0),
            p99_ms: pct(99.0),
            max_ms: d.last().map_or(f64::NAN, |x| ms(*x)),
        }
    }
}

/// Rows and parts of one table.
#[derive(Debug, Serialize)]
pub struct TableSize {
    pub table: String,
    pub rows: u64,
    pub active_parts: u64,
    pub compressed_bytes: u64,
}

/// Everything one run measured.
#[derive(Debug, Serialize)]
pub struct LookupReport {
    pub database: String,
    pub clickhouse_url: String,
    pub reused: bool,
    pub template_flows: u64,
    pub template_events: u64,
    pub copies: u64,
    pub load_s: Option<f64>,
    pub merges_settle_s: f64,
    pub tables: Vec<TableSize>,
    pub narratives: u64,
    pub entries_avg: f64,
    pub not_found: usize,
    pub all: Latency,
    pub by_request_id: Latency,
    pub by_member_id: Latency,
    /// The `--cli-runs` that found their narrative (exit 0); only they are timed.
    pub cli: Option<Latency>,
    /// Runs that found no narrative (exit 1 with `weft narrative`'s not-found message).
    pub cli_not_found: usize,
    /// Runs that failed otherwise, and the first one's status and stderr.
    pub cli_failures: usize,
    pub cli_first_failure: Option<String>,
    pub target_p99_ms: f64,
}

/// Run `weft bench lookup` against `clickhouse` (in a database of its own) and print its report.
pub async fn run(args: BenchLookupArgs, clickhouse: ClickHouseConfig) -> anyhow::Result<()> {
    let fresh = args.database.is_none();
    let database = args
        .database
        .clone()
        .unwrap_or_else(|| format!("weft_bench_lookup_{}", crate::ch::run_id()));
    let store = crate::ch::fresh_database(&clickhouse, &database).await?;
    let ch = ClickHouseConfig {
        database: database.clone(),
        ..clickhouse
    };
    let result = measure(&args, &store, &ch).await;
    if fresh && !args.keep {
        exec(&store, &format!("DROP DATABASE IF EXISTS `{database}`")).await?;
    }
    let report = result?;
    print_report(&report, args.json)
}

/// `ch`: the run's ClickHouse settings, its database the one measured.
async fn measure(
    args: &BenchLookupArgs,
    store: &Store,
    ch: &ClickHouseConfig,
) -> anyhow::Result<LookupReport> {
    let (database, url) = (ch.database.as_str(), ch.url.as_str());
    let have = count(store, "SELECT count() FROM weft_events").await?;
    let reused = have >= args.events.saturating_mul(99) / 100;
    let (mut template_events, mut copies, mut load_s) = (0, 0, None);
    if reused {
        eprintln!("reusing {database}: {have} events stored");
    } else {
        if have > 0 {
            bail!("{database} holds {have} events, fewer than --events: use an empty database");
        }
        let t0 = Instant::now();
        let (n, span_us) = load_template(store, args).await?;
        template_events = n;
        copies = args.events.div_ceil(n.max(1));
        amplify(store, args.seed, n, span_us, copies).await?;
        load_s = Some(t0.elapsed().as_secs_f64());
        eprintln!(
            "loaded {} events ({copies} copies of {n}) in {:.0} s",
            count(store, "SELECT count() FROM weft_events").await?,
            t0.elapsed().as_secs_f64()
        );
    }
    eprintln!("waiting for merges to settle ...");
    let merges_settle_s = settle_merges(store, Duration::from_secs(900)).await;
    let mut tables = Vec::new();
    for t in TABLES {
        let row: (u64, u64, u64) = store
            .client()
            .query(
                "SELECT sum(rows), count(), sum(data_compressed_bytes) FROM system.parts \
                 WHERE database = currentDatabase() AND table = ? AND active",
            )
            .bind(t)
            .fetch_one()
            .await?;
        tables.push(TableSize {
            table: t.into(),
            rows: row.0,
            active_parts: row.1,
            compressed_bytes: row.2,
        });
    }
    let narratives = count(
        store,
        "SELECT uniqExact(narrative_id) FROM weft_narrative_nodes",
    )
    .await?;

    // Ids to look up: half request ids, half any member's id, drawn across all copies.
    let half = args.lookups.div_ceil(2);
    let warm = 20;
    let by_request: Vec<String> = store
        .client()
        .query(
            "SELECT request_id FROM weft_narrative_nodes WHERE tenant = 'default' \
             AND request_id != '' ORDER BY rand() LIMIT ?",
        )
        .bind((half + warm) as u64)
        .fetch_all()
        .await?;
    let by_member: Vec<String> = store
        .client()
        .query(
            "SELECT id FROM weft_narrative_nodes WHERE tenant = 'default' ORDER BY rand() LIMIT ?",
        )
        .bind(half as u64)
        .fetch_all()
        .await?;
    if by_request.is_empty() || by_member.is_empty() {
        bail!("no narratives to look up in {database}");
    }
    // Warm-up (connections, marks and index caches), not timed.
    for id in by_request.iter().take(warm) {
        query::lookup(store, "default", id).await?;
    }
    let mut order: Vec<(bool, &String)> = by_request
        .iter()
        .skip(warm)
        .map(|i| (true, i))
        .chain(by_member.iter().map(|i| (false, i)))
        .collect();
    // Interleave deterministically (request, member, request, ...).
    order.sort_by_key(|(req, id)| (fxhash(id), *req));
    let (mut all, mut req_d, mut mem_d) = (Vec::new(), Vec::new(), Vec::new());
    let (mut entries, mut not_found) = (0usize, 0usize);
    eprintln!("timing {} lookups ...", order.len());
    for (is_req, id) in &order {
        let t = Instant::now();
        let n = query::lookup(store, "default", id).await?;
        let d = t.elapsed();
        match n {
            Some(n) => entries += n.entries.len(),
            None => not_found += 1,
        }
        all.push(d);
        if *is_req {
            req_d.push(d);
        } else {
            mem_d.push(d);
        }
    }
    let found = order.len() - not_found;

    // End to end: a new `weft narrative` process per lookup.
    let cli = if args.cli_runs > 0 {
        eprintln!(
            "timing {} runs of `weft narrative ID --format json` ...",
            args.cli_runs
        );
        let exe = std::env::current_exe().context("locating the weft binary")?;
        let ids = order
            .iter()
            .cycle()
            .take(args.cli_runs)
            .map(|(_, id)| id.as_str());
        Some(cli_runs(&exe, ch, ids)?)
    } else {
        None
    };
    Ok(LookupReport {
        database: database.into(),
        clickhouse_url: url.into(),
        reused,
        template_flows: args.template_flows,
        template_events,
        copies,
        load_s,
        merges_settle_s,
        tables,
        narratives,
        entries_avg: entries as f64 / found.max(1) as f64,
        not_found,
        all: Latency::of(all),
        by_request_id: Latency::of(req_d),
        by_member_id: Latency::of(mem_d),
        cli_not_found: cli.as_ref().map_or(0, |c| c.not_found),
        cli_failures: cli.as_ref().map_or(0, |c| c.failures),
        cli_first_failure: cli.as_ref().and_then(|c| c.first_failure.clone()),
        cli: cli.map(|c| Latency::of(c.found)),
        target_p99_ms: 50.0,
    })
}

/// What the `weft narrative` processes did.
#[derive(Debug, Default)]
struct CliRuns {
    /// The time of each run that found its narrative (exit 0).
    found: Vec<Duration>,
    /// Runs that found none: exit 1 with [`query::NOT_FOUND`] on stderr.
    not_found: usize,
    /// Any other end (another status, a signal, exit 1 with an error).
    failures: usize,
    /// The first failure's status and stderr.
    first_failure: Option<String>,
}

/// The environment a `weft narrative` child gets: this run's ClickHouse settings, whatever
/// flags, variables or config file gave them to this process (the password by environment,
/// never on a command line). `None`: remove the variable.
fn child_env(ch: &ClickHouseConfig) -> [(&'static str, Option<String>); 6] {
    let compression = match ch.compression {
        Compression::Auto => "auto",
        Compression::Lz4 => "lz4",
        Compression::None => "none",
    };
    [
        // Every setting the child reads is below; a config file would only add doubt.
        ("WEFT_CONFIG", None),
        ("WEFT_CLICKHOUSE_URL", Some(ch.url.clone())),
        ("WEFT_CLICKHOUSE_DATABASE", Some(ch.database.clone())),
        ("WEFT_CLICKHOUSE_USER", Some(ch.user.clone())),
        // An empty variable counts as unset, and the default password is the empty one.
        (
            "WEFT_CLICKHOUSE_PASSWORD",
            (!ch.password.is_empty()).then(|| ch.password.clone()),
        ),
        ("WEFT_CLICKHOUSE_COMPRESSION", Some(compression.into())),
    ]
}

/// Run `exe narrative ID --format json` once per id, against `ch`, and time the runs that
/// find their narrative.
fn cli_runs<'a>(
    exe: &Path,
    ch: &ClickHouseConfig,
    ids: impl Iterator<Item = &'a str>,
) -> anyhow::Result<CliRuns> {
    let mut runs = CliRuns::default();
    for id in ids {
        let mut cmd = Command::new(exe);
        cmd.args(["narrative", id, "--format", "json"])
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in child_env(ch) {
            match v {
                Some(v) => cmd.env(k, v),
                None => cmd.env_remove(k),
            };
        }
        let t = Instant::now();
        let out = cmd
            .output()
            .with_context(|| format!("starting {}", exe.display()))?;
        let elapsed = t.elapsed();
        let stderr = String::from_utf8_lossy(&out.stderr);
        match out.status.code() {
            Some(0) => runs.found.push(elapsed),
            // Its own line, whatever logs come before it.
            Some(1) if stderr.lines().any(|l| l.starts_with(query::NOT_FOUND)) => {
                runs.not_found += 1
            }
            _ => {
                runs.failures += 1;
                runs.first_failure
                    .get_or_insert_with(|| format!("{}: {}", out.status, stderr.trim()));
            }
        }
    }
    Ok(runs)
}

/// A small stable hash, to interleave the two id lists without a random generator.
fn fxhash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Step 1: the template through the real decoder, `EventRow` and projector. Returns the
/// number of events stored and the template's time span (µs).
async fn load_template(store: &Store, args: &BenchLookupArgs) -> anyhow::Result<(u64, i64)> {
    let cfg = SimConfig {
        seed: args.seed,
        flows: args.template_flows,
        no_request_id: 0.2,
        shuffle: true,
        record_truth: false,
        ..SimConfig::default()
    };
    let topics = Topics::default();
    let ids = SchemaIds::default();
    let now = weft_schemas::time::now_rfc3339();
    let mut facts: Vec<(String, i32, i64, Fact)> = Vec::new();
    let mut next_offset: HashMap<(String, i32), i64> = HashMap::new();
    for (i, mut env) in Simulation::new(cfg)?.enumerate() {
        env.producer_id
            .get_or_insert_with(|| "weft-bench-lookup".into());
        env.seq.get_or_insert(i as u64 + 1);
        env.emitted_at.get_or_insert_with(|| now.clone());
        let topic = topics.topic(env.kind);
        let partition = (fxhash(env.request_id.as_deref().unwrap_or(&topic)) % 4) as i32;
        let value = wire::encode_value(&env, ContentType::Json, &ids)?;
        let headers = wire::encode_headers(&env, ContentType::Json);
        let hs: Vec<(&str, &[u8])> = headers.iter().map(|(k, v)| (*k, v.as_bytes())).collect();
        let off = next_offset.entry((topic.clone(), partition)).or_insert(0);
        let offset = *off;
        *off += 1;
        let rec = Record {
            topic: &topic,
            partition,
            offset,
            key: None,
            value: Some(&value),
            headers: &hs,
            timestamp_ms: None,
        };
        let fact = decode::decode(&rec, &topics, &ids)
            .map_err(|r| anyhow::anyhow!("template event rejected: {}: {}", r.code, r.message))?;
        facts.push((topic, partition, offset, fact));
    }
    // Facts: one copy per (tenant, kind, id, content), as the deduplicating writer keeps.
    let ingested_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0);
    let mut seen = std::collections::HashSet::new();
    let mut ins = store.client().insert::<EventRow>("weft_events").await?;
    let mut stored = 0u64;
    let (mut t_min, mut t_max) = (i64::MAX, i64::MIN);
    for (topic, partition, offset, f) in &facts {
        let key = (f.envelope.kind, f.id.clone(), f.content_hash);
        if !seen.insert(key) {
            continue;
        }
        let conflict = false;
        ins.write(&EventRow::new(
            f,
            topic,
            *partition,
            *offset,
            ingested_at,
            conflict,
        ))
        .await?;
        stored += 1;
        t_min = t_min.min(f.ts_micros);
        t_max = t_max.max(f.ts_micros);
    }
    ins.end().await?;
    // Narratives: the real projector, fed in stream order in batches, as ingest does.
    let mut projector = Projector::load(
        store.clone(),
        weft_consumers::narrative::projector::DEFAULT_MAX_NODES,
    )
    .await?;
    for chunk in facts.chunks(2_000) {
        let last = chunk.last().map_or(0, |c| c.2);
        let batch = ProjectBatch {
            topic: "bench-lookup-template",
            partition: 0,
            facts: chunk.iter().map(|(_, _, _, f)| f).collect(),
            last_offset: last,
        };
        projector.apply(&[batch]).await?;
    }
    eprintln!(
        "template: {} flows, {} envelopes, {stored} events stored and projected",
        args.template_flows,
        facts.len()
    );
    Ok((stored, (t_max - t_min).max(0) + 1_000_000))
}

/// The SQL that rewrites a per-flow string for copy `number`: `-<seed>-` -> `-<seed>x<n>-`.
fn remap(expr: &str, seed: u64) -> String {
    format!("replaceAll({expr}, '-{seed}-', concat('-{seed}x', toString(number), '-'))")
}

/// The SQL that rewrites an id for copy `number`: content-hash ids (`jcs-sha256:<hex>`) get
/// a fresh hash of (old id, copy); the others are remapped like any string. The same in every
/// table, so links, nodes and members stay consistent.
fn remap_id(expr: &str, seed: u64) -> String {
    format!(
        "if(position({expr}, 'jcs-sha256:') > 0, \
            concat(substring({expr}, 1, position({expr}, 'jcs-sha256:') + 10), \
                   lower(hex(SHA256(concat({expr}, '#', toString(number)))))), \
            {})",
        remap(expr, seed)
    )
}

/// Step 2: copies 1..copies of the template, inside ClickHouse.
async fn amplify(
    store: &Store,
    seed: u64,
    n: u64,
    span_us: i64,
    copies: u64,
) -> anyhow::Result<()> {
    for t in TABLES {
        exec(store, &format!("DROP TABLE IF EXISTS tpl_{t}")).await?;
        exec(
            store,
            &format!("CREATE TABLE tpl_{t} ENGINE = Memory AS SELECT * FROM {t}"),
        )
        .await?;
    }
    let m = |e: &str| remap(e, seed);
    let id = |e: &str| remap_id(e, seed);
    let shift = |e: &str| format!("addMicroseconds({e}, toInt64(number) * {span_us})");
    let events = format!(
        "INSERT INTO weft_events (tenant, kind, id, content_hash, ts, request_id, producer_id, seq, \
            emitted_at, ingested_at, event_type, principal, capability_id, decision, outcome, \
            token_id, decision_id, frame_id, handle_id, handle_refs, candidate_id, flow_id, links, \
            conflict, topic, partition, offset, content_type, payload) \
         SELECT tenant, kind, {id_}, SHA256({payload}), {ts}, {req}, producer_id, seq + number * {n}, \
            {emitted}, {ingested}, event_type, principal, capability_id, decision, outcome, \
            {tok}, {dec}, {frame}, {handle}, arrayMap(x -> {hx}, handle_refs), candidate_id, {flow}, \
            arrayMap(l -> (tupleElement(l, 1), tupleElement(l, 2), {lx}), links), \
            conflict, topic, partition, offset + number * {n}, content_type, {payload} \
         FROM tpl_weft_events, numbers(__FROM__, __COUNT__) AS n",
        id_ = id("id"),
        payload = m("payload"),
        ts = shift("ts"),
        req = m("request_id"),
        emitted = shift("emitted_at"),
        ingested = shift("ingested_at"),
        tok = m("token_id"),
        dec = m("decision_id"),
        frame = m("frame_id"),
        handle = m("handle_id"),
        hx = m("x"),
        flow = m("flow_id"),
        lx = id("tupleElement(l, 3)"),
    );
    let narratives = format!(
        "INSERT INTO weft_narratives (tenant, narrative_id, kind, id, content_hash, ts, request_id, \
            payload, version, is_deleted) \
         SELECT tenant, {nid}, kind, {id_}, SHA256({payload}), {ts}, {req}, {payload}, version, is_deleted \
         FROM tpl_weft_narratives, numbers(__FROM__, __COUNT__) AS n",
        nid = id("narrative_id"),
        id_ = id("id"),
        payload = m("payload"),
        ts = shift("ts"),
        req = m("request_id"),
    );
    let nodes = format!(
        "INSERT INTO weft_narrative_nodes (tenant, kind, id, narrative_id, request_id, ts, version) \
         SELECT tenant, kind, {id_}, {nid}, {req}, {ts}, version \
         FROM tpl_weft_narrative_nodes, numbers(__FROM__, __COUNT__) AS n",
        id_ = id("id"),
        nid = id("narrative_id"),
        req = m("request_id"),
        ts = shift("ts"),
    );
    let links = format!(
        "INSERT INTO weft_links (tenant, to_kind, to_id, from_kind, from_id, via) \
         SELECT tenant, to_kind, {to}, from_kind, {from}, via \
         FROM tpl_weft_links, numbers(__FROM__, __COUNT__) AS n",
        to = id("to_id"),
        from = id("from_id"),
    );
    // About 400k events per insert.
    let step = (400_000 / n.max(1)).max(1);
    let mut from = 1;
    let t0 = Instant::now();
    while from < copies {
        let cnt = step.min(copies - from);
        for sql in [&events, &narratives, &nodes, &links] {
            let sql = sql
                .replace("__FROM__", &from.to_string())
                .replace("__COUNT__", &cnt.to_string());
            exec(store, &sql).await?;
        }
        from += cnt;
        eprintln!(
            "  copies {from}/{copies} ({:.0} s)",
            t0.elapsed().as_secs_f64()
        );
    }
    for t in TABLES {
        exec(store, &format!("DROP TABLE IF EXISTS tpl_{t}")).await?;
    }
    Ok(())
}

fn print_report(r: &LookupReport, json: bool) -> anyhow::Result<()> {
    use std::fmt::Write;
    let mut out = String::new();
    let w = &mut out;
    writeln!(
        w,
        "\nweft bench lookup: database {} at {}{}",
        r.database,
        r.clickhouse_url,
        if r.reused { " (reused)" } else { "" }
    )?;
    if let Some(s) = r.load_s {
        writeln!(
            w,
            "loaded: template of {} flows ({} events, real decoder + projector) x {} copies in {s:.0} s; merges settled in {:.0} s",
            r.template_flows, r.template_events, r.copies, r.merges_settle_s
        )?;
    }
    for t in &r.tables {
        writeln!(
            w,
            "  {:<22} {:>11} rows {:>4} parts {:>9.1} MB compressed",
            t.table,
            t.rows,
            t.active_parts,
            t.compressed_bytes as f64 / 1e6
        )?;
    }
    writeln!(
        w,
        "  {} narratives, {:.1} entries per narrative looked up, {} not found\n",
        r.narratives, r.entries_avg, r.not_found
    )?;
    writeln!(
        w,
        "{:<44} {:>6} {:>8} {:>8} {:>8} {:>8} {:>8}",
        "latency (ms)", "n", "mean", "p50", "p95", "p99", "max"
    )?;
    let line = |w: &mut String, name: &str, l: &Latency| {
        writeln!(
            w,
            "{:<44} {:>6} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2}",
            name, l.n, l.mean_ms, l.p50_ms, l.p95_ms, l.p99_ms, l.max_ms
        )
    };
    line(w, "query::lookup, all", &r.all)?;
    line(w, "  by request id", &r.by_request_id)?;
    line(w, "  by member id", &r.by_member_id)?;
    if let Some(c) = &r.cli {
        line(w, "`weft narrative ID --format json` (process)", c)?;
    }
    writeln!(
        w,
        "\ntarget: p99 < {:.0} ms: {} ({:.2} ms){}",
        r.target_p99_ms,
        if r.all.p99_ms < r.target_p99_ms {
            "MET"
        } else {
            "MISSED"
        },
        r.all.p99_ms,
        match (r.cli_not_found, r.cli_failures) {
            (0, 0) => String::new(),
            (n, 0) => format!("; {n} CLI runs found no narrative (not timed)"),
            (n, f) => format!(
                "; {n} CLI runs found no narrative, {f} failed (neither timed); first failure: {}",
                r.cli_first_failure.as_deref().unwrap_or("")
            ),
        }
    )?;
    crate::print_report(&out, r, json)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let l = Latency::of((1..=100).map(Duration::from_millis).collect());
        assert_eq!(l.p50_ms, 50.0);
        assert_eq!(l.p99_ms, 99.0);
        assert_eq!(l.max_ms, 100.0);
        assert_eq!(l.n, 100);
    }

    fn settings() -> ClickHouseConfig {
        ClickHouseConfig {
            url: "http://ch.invalid:8123".into(),
            database: "bench_db".into(),
            user: "bench_user".into(),
            password: "bench-secret".into(),
            compression: Compression::Lz4,
        }
    }

    #[test]
    fn cli_runs_that_fail_are_counted_not_timed() {
        let r = cli_runs(
            Path::new("/bin/false"),
            &settings(),
            ["a", "b", "c"].into_iter(),
        )
        .unwrap();
        assert!(r.found.is_empty(), "failed runs were timed: {:?}", r.found);
        assert_eq!((r.not_found, r.failures), (0, 3));
        assert!(r.first_failure.is_some());
        assert_eq!(Latency::of(r.found).n, 0);
    }

    #[test]
    fn cli_runs_get_this_runs_clickhouse_and_tell_not_found_from_found() {
        let dir = std::env::temp_dir().join(format!("weft-bench-cli-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let exe = dir.join("weft");
        // Exit 0 only with every setting of `settings()` and no config file; `missing` is
        // not found, as `weft narrative` says it.
        let script = format!(
            "#!/bin/sh\n\
             [ \"$WEFT_CLICKHOUSE_URL\" = http://ch.invalid:8123 ] && \
             [ \"$WEFT_CLICKHOUSE_DATABASE\" = bench_db ] && \
             [ \"$WEFT_CLICKHOUSE_USER\" = bench_user ] && \
             [ \"$WEFT_CLICKHOUSE_PASSWORD\" = bench-secret ] && \
             [ \"$WEFT_CLICKHOUSE_COMPRESSION\" = lz4 ] && \
             [ -z \"${{WEFT_CONFIG+set}}\" ] && [ \"$1\" = narrative ] || exit 3\n\
             if [ \"$2\" = missing ]; then echo \"{} \\`missing\\` (tenant default)\" >&2; exit 1; fi\n",
            query::NOT_FOUND
        );
        std::fs::write(&exe, script).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        let r = cli_runs(&exe, &settings(), ["a", "missing", "b"].into_iter()).unwrap();
        assert_eq!(
            (r.found.len(), r.not_found, r.failures),
            (2, 1, 0),
            "{:?}",
            r.first_failure
        );
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn remapped_ids_keep_their_shape() {
        let s = remap("id", 7);
        assert!(s.contains("'-7-'") && s.contains("'-7x'"), "{s}");
        assert!(remap_id("id", 7).contains("jcs-sha256:"));
    }
}

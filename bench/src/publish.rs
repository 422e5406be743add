//! `weft bench publish`: the Publisher's throughput and CPU cost on the real broker, and
//! librdkafka's own floor under it.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use weft_producers::{Delivery, PublisherConfig, Receipt};
use weft_schemas::wire::{self, ContentType, SchemaIds};
use weft_schemas::Envelope;

use crate::cpu::{self, Who};
use crate::publish_floor::{self as floor, RawRecord};

/// Where a publish benchmark goes unless told: topics `bench<pid>.*` and a spool of its
/// own in the temporary directory, so it never mixes with real traffic.
pub fn default_destination(topic_prefix: &mut Option<String>, spool_dir: &mut Option<PathBuf>) {
    topic_prefix.get_or_insert_with(|| format!("bench{}.", std::process::id()));
    spool_dir.get_or_insert_with(|| {
        std::env::temp_dir().join(format!("weft-bench-spool-{}", std::process::id()))
    });
}

/// `weft bench publish`'s own flags (the binary adds the Publisher's).
#[derive(Debug, Args)]
pub struct BenchPublishArgs {
    /// Events to publish.
    #[arg(long, default_value_t = 1_000_000, value_name = "N")]
    pub events: usize,

    /// Approximate payload size in bytes (padded TraceEvents).
    #[arg(long, default_value_t = 300, value_name = "BYTES")]
    pub payload_bytes: usize,

    /// Distinct request ids (Kafka keys) the events are spread over.
    #[arg(long, default_value_t = 10_000, value_name = "N")]
    pub requests: usize,

    /// Receipts outstanding at once (the caller's pipelining depth).
    #[arg(long, default_value_t = 100_000, value_name = "N")]
    pub window: usize,

    /// First send the same records through a bare librdkafka producer with the Publisher's
    /// settings (no validation, receipts or spool): the floor that librdkafka itself sets.
    #[arg(long)]
    pub raw: bool,

    /// With `--raw`: send only the first N of each record's headers (kind, tenant,
    /// content-type, request id, producer id, seq, emitted-at, in that order), to show what
    /// each header costs librdkafka. The Publisher run always sends them all.
    #[arg(long, value_name = "N", requires = "raw")]
    pub raw_headers: Option<usize>,
}

fn make_events(n: usize, payload_bytes: usize, requests: usize, run: &str) -> Vec<Envelope> {
    (0..n)
        .map(|i| {
            let head = format!(
                r#"{{"event_id":"bench-{run}-{i}","event_type":"capability_executed","timestamp":"2026-03-08T06:00:05.123456Z","capability_id":"org.weft.bench","decision_id":"pd-{run}-{i}","outcome":"success","metadata":{{"flow_id":"f-{}","pad":""#,
                i % requests.max(1)
            );
            let pad = payload_bytes.saturating_sub(head.len() + 3);
            let payload = format!("{head}{}\"}}}}", "x".repeat(pad));
            let text = format!(
                r#"{{"kind":"trace_event","request_id":"req-{run}-{}","tenant":"bench","payload":{payload}}}"#,
                i % requests.max(1)
            );
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("bench event: {e}"))
        })
        .collect()
}

/// `weft bench publish` and its report. `config` is the Publisher's (see
/// [`default_destination`]); `create_topics` as `--no-create-topics` says.
pub async fn run(
    args: BenchPublishArgs,
    config: PublisherConfig,
    create_topics: bool,
) -> anyhow::Result<()> {
    let run = format!(
        "{}-{}",
        std::process::id(),
        weft_schemas::time::now_rfc3339()
    );
    let n = args.events;
    eprintln!("generating {n} events of ~{} B ...", args.payload_bytes);
    let events = make_events(n, args.payload_bytes, args.requests, &run);
    let bytes: usize = events.iter().map(|e| e.payload.get().len()).sum();

    // Where time goes, part 1: validation (JSON parse + JSON Schema + identity) alone.
    let sample = events.len().min(100_000);
    let t = cpu::rusage(Who::Thread);
    for e in &events[..sample] {
        e.validate().context("bench event invalid")?;
    }
    let validate_us = (cpu::rusage(Who::Thread) - t) / sample as f64 * 1e6;
    // Part 2: encoding the record (value + headers) alone.
    let t = cpu::rusage(Who::Thread);
    for e in &events[..sample] {
        let v = wire::encode_value(e, ContentType::Json, &SchemaIds::default())?;
        let h = wire::encode_headers(e, ContentType::Json);
        std::hint::black_box((v, h));
    }
    let encode_us = (cpu::rusage(Who::Thread) - t) / sample as f64 * 1e6;

    let publisher = crate::connect_publisher(config.clone(), create_topics).await?;
    if args.raw {
        raw_floor(&events, &config, &run, args.raw_headers).await?;
    }
    // Warm-up: metadata, connections, producer id.
    publisher
        .publish(make_events(1, 200, 1, &format!("{run}-warm")).remove(0))?
        .await?;
    let p = publisher.clone();
    let window = args.window.max(1);
    let cpu0 = cpu::rusage(Who::Process);
    let wall0 = Instant::now();
    let (caller_cpu, kafka, spooled) = tokio::task::spawn_blocking(move || {
        let t0 = cpu::rusage(Who::Thread);
        let mut pending: std::collections::VecDeque<Receipt> = std::collections::VecDeque::new();
        let (mut kafka, mut spooled) = (0u64, 0u64);
        let mut settle = |r: Receipt| -> anyhow::Result<()> {
            match r.wait_blocking()? {
                Delivery::Kafka { .. } => kafka += 1,
                Delivery::Spooled => spooled += 1,
            }
            Ok(())
        };
        for e in events {
            pending.push_back(p.publish(e)?);
            if pending.len() >= window {
                if let Some(r) = pending.pop_front() {
                    settle(r)?;
                }
            }
        }
        for r in pending {
            settle(r)?;
        }
        let caller = cpu::rusage(Who::Thread) - t0;
        anyhow::Ok((caller, kafka, spooled))
    })
    .await??;
    let wall = wall0.elapsed().as_secs_f64();
    let cpu = cpu::rusage(Who::Process) - cpu0;
    let p = publisher.clone();
    tokio::task::spawn_blocking(move || p.close(Duration::from_secs(30))).await?;

    let nf = n as f64;
    println!(
        "events            {n} ({:.0} B payload avg, {kafka} acked by Kafka, {spooled} spooled)",
        bytes as f64 / nf
    );
    println!("wall              {wall:.2} s");
    println!(
        "throughput        {:.0} events/s ({:.1} MB/s of payload)",
        nf / wall,
        bytes as f64 / wall / 1e6
    );
    println!(
        "process CPU       {cpu:.2} s = {:.2} us/event (all threads)",
        cpu / nf * 1e6
    );
    println!("per core          {:.0} events per CPU-second", nf / cpu);
    println!(
        "caller thread     {:.2} us/event (validate + stamp + encode + enqueue)",
        caller_cpu / nf * 1e6
    );
    println!("  validate alone  {validate_us:.2} us/event (parse + JSON Schema + identity)");
    println!("  encode alone    {encode_us:.2} us/event (value + headers)");
    println!(
        "other threads     {:.2} us/event (librdkafka: batching, lz4, network; delivery callbacks)",
        (cpu - caller_cpu) / nf * 1e6
    );
    Ok(())
}

/// `--raw`: the events encoded as the Publisher would (stamped, value, headers, key), then
/// sent through [`crate::publish_floor`], measured the same way as the Publisher run. With
/// `max_headers`, only that many of each record's headers are sent.
async fn raw_floor(
    events: &[Envelope],
    config: &PublisherConfig,
    run: &str,
    max_headers: Option<usize>,
) -> anyhow::Result<()> {
    let ct = config.content_type.content_type();
    let ids = SchemaIds::default();
    let producer_id = format!("raw-{run}");
    let now = weft_schemas::time::now_rfc3339();
    let mut records = Vec::with_capacity(events.len());
    for (i, e) in events.iter().enumerate() {
        let mut e = e.clone();
        e.producer_id = Some(producer_id.clone());
        e.seq = Some(i as u64 + 1);
        e.emitted_at = Some(now.clone());
        records.push(RawRecord {
            topic: config.topics.topic(e.kind),
            key: e.request_id.clone().unwrap_or_default().into_bytes(),
            value: wire::encode_value(&e, ct, &ids)?,
            headers: wire::encode_headers(&e, ct)
                .into_iter()
                .take(max_headers.unwrap_or(usize::MAX))
                .map(|(k, v)| (k, v.into_bytes()))
                .collect(),
        });
    }
    let config = config.clone();
    let cpu0 = cpu::rusage(Who::Process);
    let wall0 = Instant::now();
    let (counts, records) = tokio::task::spawn_blocking(move || {
        let c = floor::send_all(&config, &records, Duration::from_secs(120));
        (c, records)
    })
    .await?;
    let wall = wall0.elapsed().as_secs_f64();
    let cpu = cpu::rusage(Who::Process) - cpu0;
    drop(records);
    let counts = counts?;
    let nf = events.len() as f64;
    println!(
        "raw librdkafka    {} acked, {} failed{}: {wall:.2} s wall = {:.0} events/s; CPU {cpu:.2} s = {:.2} us/event = {:.0} events per CPU-second",
        counts.acked,
        counts.failed,
        max_headers
            .map(|n| format!(" (first {n} headers only)"))
            .unwrap_or_default(),
        nf / wall,
        cpu / nf * 1e6,
        nf / cpu
    );
    Ok(())
}

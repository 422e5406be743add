//! `weft bench ingest --floor`: the cheapest consumers that still do one more thing the ingest
//! issue requires of every record, measured on the same topics as weft's own ingest.
//!
//! Each floor is a bare librdkafka consumer (`BaseConsumer`, polled on one thread, the same
//! fetch settings as `weft ingest`, a fresh group) that adds one duty to the previous floor:
//! 1. `consume`: receive each record and read its kind header, nothing else;
//! 2. `+ validate`: parse the payload with serde_json and check it against its kind's JSON
//!    Schema with the `jsonschema` crate (weft's own compiled validators);
//! 3. `+ store`: keep the payload and send it to ClickHouse with the `clickhouse` crate as
//!    RowBinary, `(topic, partition, offset, payload)` in inserts of 50k rows.
//!
//! None of them deduplicates, hashes, links, dead-letters, tracks exactly-once progress or
//! builds narratives, so each is a lower bound on the CPU any consumer meeting the issue can
//! spend with these crates: it tells which part of the target is out of reach before weft's
//! own code runs.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clickhouse::Row;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::ClientConfig;
use serde::Serialize;
use serde_json::Value;
use weft_schemas::validate::Validator;
use weft_schemas::wire::header;
use weft_schemas::{Kind, Topics};
use weft_store::Store;

use crate::cpu::{self, Who};

/// What a floor consumer does with each record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Duty {
    Consume,
    Validate,
    Store,
}

impl Duty {
    fn name(self) -> &'static str {
        match self {
            Duty::Consume => "floor: consume (librdkafka, kind header)",
            Duty::Validate => "floor: + serde_json parse + JSON Schema",
            Duty::Store => "floor: + RowBinary insert (clickhouse crate)",
        }
    }
}

/// One floor's measurement.
#[derive(Debug, Serialize)]
pub struct FloorPhase {
    /// Which floor.
    pub name: &'static str,
    /// Records it received (every record of the topics).
    pub events: u64,
    /// Payloads that failed their schema (a clean run has none).
    pub invalid: u64,
    /// Rows it inserted (`+ store` only).
    pub stored: u64,
    /// From subscribing until the last record was handled (and stored).
    pub wall_s: f64,
    /// This process's CPU over the phase, all threads (librdkafka's and the ClickHouse
    /// client's included).
    pub consumer_cpu_s: f64,
    /// Events per consumer CPU-second.
    pub events_per_consumer_cpu_s: f64,
}

#[derive(Row, Serialize)]
struct FloorRow<'a> {
    topic: &'a str,
    partition: i32,
    offset: i64,
    payload: String,
}

const TABLE: &str = "floor_rows";
const BATCH: usize = 50_000;

/// Run the three floors in turn over `topics`, each until it has seen `envelopes` records.
pub async fn run(
    store: &Store,
    brokers: &str,
    topics: &Topics,
    envelopes: u64,
    timeout: Duration,
) -> anyhow::Result<Vec<FloorPhase>> {
    store
        .client()
        .query(&format!(
            "CREATE TABLE IF NOT EXISTS {TABLE} (topic LowCardinality(String), partition Int32, \
             offset Int64, payload String CODEC(ZSTD(3))) \
             ENGINE = MergeTree ORDER BY (topic, partition, offset)"
        ))
        .execute()
        .await
        .context("creating the floor table")?;
    let mut out = Vec::new();
    for duty in [Duty::Consume, Duty::Validate, Duty::Store] {
        eprintln!("draining with the {} ...", duty.name());
        let (store, brokers, topics) = (store.clone(), brokers.to_owned(), topics.clone());
        let handle = tokio::runtime::Handle::current();
        let phase = tokio::task::spawn_blocking(move || {
            drain(&handle, &store, &brokers, &topics, envelopes, timeout, duty)
        })
        .await??;
        eprintln!(
            "  {}: {:.1} s, {:.0} events per consumer CPU-second",
            phase.name, phase.wall_s, phase.events_per_consumer_cpu_s
        );
        out.push(phase);
    }
    Ok(out)
}

fn drain(
    rt: &tokio::runtime::Handle,
    store: &Store,
    brokers: &str,
    topics: &Topics,
    envelopes: u64,
    timeout: Duration,
    duty: Duty,
) -> anyhow::Result<FloorPhase> {
    let group = format!(
        "weft-bench-floor-{:?}-{}",
        duty,
        topics.prefix.trim_end_matches('.')
    );
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", &group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("fetch.wait.max.ms", "100")
        .create()
        .context("creating the floor consumer")?;
    let names = topics.event_topics();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    consumer.subscribe(&refs)?;
    let validator = Validator::global();
    let (mut events, mut invalid, mut stored) = (0u64, 0u64, 0u64);
    let mut rows: Vec<FloorRow<'_>> = Vec::with_capacity(BATCH);
    let cpu0 = cpu::rusage(Who::Process);
    let t0 = Instant::now();
    while events < envelopes {
        if t0.elapsed() > timeout {
            bail!(
                "{}: only {events} of {envelopes} after {timeout:?}",
                duty.name()
            );
        }
        let Some(msg) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        let msg = msg?;
        events += 1;
        let kind = msg
            .headers()
            .and_then(|h| h.iter().find(|h| h.key == header::KIND))
            .and_then(|h| std::str::from_utf8(h.value?).ok())
            .and_then(|k| k.parse::<Kind>().ok());
        let payload = msg.payload().unwrap_or_default();
        if duty == Duty::Consume {
            std::hint::black_box((kind, payload.len()));
            continue;
        }
        let ok = kind.is_some_and(|k| {
            serde_json::from_slice::<Value>(payload)
                .is_ok_and(|v| validator.is_valid(k.schema_name(), &v).unwrap_or(false))
        });
        if !ok {
            invalid += 1;
        }
        if duty == Duty::Validate {
            continue;
        }
        let topic = names
            .iter()
            .find(|n| n.as_str() == msg.topic())
            .map_or("", String::as_str);
        rows.push(FloorRow {
            topic,
            partition: msg.partition(),
            offset: msg.offset(),
            payload: String::from_utf8_lossy(payload).into_owned(),
        });
        if rows.len() >= BATCH || events == envelopes {
            stored += rows.len() as u64;
            rt.block_on(insert(store, &rows))?;
            rows.clear();
        }
    }
    let wall_s = t0.elapsed().as_secs_f64();
    let cpu = cpu::rusage(Who::Process) - cpu0;
    Ok(FloorPhase {
        name: duty.name(),
        events,
        invalid,
        stored,
        wall_s,
        consumer_cpu_s: cpu,
        events_per_consumer_cpu_s: events as f64 / cpu,
    })
}

async fn insert(store: &Store, rows: &[FloorRow<'_>]) -> anyhow::Result<()> {
    let mut ins = store.client().insert::<FloorRow<'static>>(TABLE).await?;
    for r in rows {
        ins.write(r).await?;
    }
    ins.end().await?;
    Ok(())
}

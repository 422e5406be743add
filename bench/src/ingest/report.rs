//! The report, as text or JSON.

use super::*;

/// One drain (weft's ingest, or a Kafka engine variant) of the same messages.
#[derive(Debug, Serialize)]
pub struct Phase {
    pub name: String,
    /// Rows stored at the end (weft: facts; Kafka engine: rows in its target table).
    pub rows: u64,
    /// From the start of the phase until every row is stored (and, role `all`, projected).
    pub wall_s: f64,
    /// Until the first row was visible (start-up, group join, first batch).
    pub first_row_s: f64,
    pub events_per_s: f64,
    /// From the first visible row to the last.
    pub steady_events_per_s: f64,
    /// This process's CPU over the phase (weft only; the Kafka engine runs inside ClickHouse).
    pub consumer_cpu_s: Option<f64>,
    pub events_per_consumer_cpu_s: Option<f64>,
    pub clickhouse_cpu_s: f64,
    /// ClickHouse CPU until its background merges of this phase's parts had settled too.
    pub clickhouse_cpu_settled_s: f64,
    pub broker_cpu_s: f64,
    /// Consumer + ClickHouse (settled) CPU per event, microseconds.
    pub total_us_per_event: f64,
}

/// Timing spans of weft's ingest, from its own metrics.
#[derive(Debug, Serialize)]
pub struct Spans {
    pub flushes_with_facts: u64,
    pub avg_batch_rows: f64,
    /// Wall seconds inside facts inserts (per-partition inserts run concurrently, so this can
    /// exceed the phase's wall time).
    pub insert_wall_s: f64,
    pub projector_passes: u64,
    pub projector_wall_s: f64,
    /// Events placed without entering the narrative graph, and nodes loaded back into it.
    pub narrative_direct: u64,
    pub narrative_loaded: u64,
}

/// Per-event CPU of each ingest step, measured offline on one thread.
#[derive(Debug, Serialize)]
pub struct Step {
    pub step: &'static str,
    pub us_per_event: f64,
}

/// Everything one run measured.
#[derive(Debug, Serialize)]
pub struct IngestReport {
    pub run: String,
    pub database: String,
    pub topic_prefix: String,
    pub role: String,
    pub partitions: i32,
    pub batch_max_rows: usize,
    pub envelopes: u64,
    pub distinct_events: u64,
    pub payload_bytes_avg: f64,
    pub publish_wall_s: f64,
    pub publish_events_per_s: f64,
    pub clickhouse_pid: Option<u32>,
    pub broker_pid: Option<u32>,
    pub broker_storage: Option<String>,
    pub weft: Phase,
    pub weft_totals: IngestTotals,
    pub weft_threads: Vec<ThreadCpu>,
    pub weft_spans: Spans,
    pub kafka_engine: Vec<Phase>,
    pub kafka_engine_block_size: Option<u64>,
    /// The bare consumers of `--floor`, cheapest first.
    pub floors: Vec<FloorPhase>,
    pub steps: Vec<Step>,
    pub target_events_per_consumer_cpu_s: f64,
    pub meets_cpu_target: bool,
    /// weft's events/s over the best Kafka engine variant's (>= 1 meets the target).
    pub throughput_vs_kafka_engine: Option<f64>,
}

// ---------------------------------------------------------------------------------------
// The run

fn fmt_opt(v: Option<f64>, prec: usize) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.prec$}"))
}

pub(super) fn print_report(r: &IngestReport, json: bool) -> anyhow::Result<()> {
    let mut out = String::new();
    use std::fmt::Write;
    let w = &mut out;
    writeln!(
        w,
        "\nweft bench ingest: {} envelopes ({} distinct, {:.0} B payload avg), {} partitions x 8 topics, role {}, batch {} rows",
        r.envelopes, r.distinct_events, r.payload_bytes_avg, r.partitions, r.role, r.batch_max_rows
    )?;
    writeln!(
        w,
        "broker storage {}, publish {:.1} s ({:.0} events/s, not part of the figures below)\n",
        r.broker_storage.as_deref().unwrap_or("?"),
        r.publish_wall_s,
        r.publish_events_per_s
    )?;
    writeln!(
        w,
        "{:<40} {:>8} {:>8} {:>10} {:>10} {:>9} {:>12} {:>8} {:>9} {:>7} {:>9}",
        "pipeline",
        "wall s",
        "1st row",
        "events/s",
        "steady/s",
        "cons CPU",
        "ev/cons CPU",
        "CH CPU",
        "CH+merge",
        "broker",
        "us/event"
    )?;
    for p in std::iter::once(&r.weft).chain(&r.kafka_engine) {
        writeln!(
            w,
            "{:<40} {:>8.2} {:>8.2} {:>10.0} {:>10.0} {:>9} {:>12} {:>8.2} {:>9.2} {:>7.2} {:>9.2}",
            p.name,
            p.wall_s,
            p.first_row_s,
            p.events_per_s,
            p.steady_events_per_s,
            fmt_opt(p.consumer_cpu_s, 2),
            fmt_opt(p.events_per_consumer_cpu_s, 0),
            p.clickhouse_cpu_s,
            p.clickhouse_cpu_settled_s,
            p.broker_cpu_s,
            p.total_us_per_event
        )?;
    }
    writeln!(
        w,
        "\ntargets: >= {:.0} events per consumer CPU-second: {} ({:.0}); throughput vs the Kafka engine: {}",
        r.target_events_per_consumer_cpu_s,
        if r.meets_cpu_target { "MET" } else { "MISSED" },
        r.weft.events_per_consumer_cpu_s.unwrap_or(f64::NAN),
        r.throughput_vs_kafka_engine
            .map_or("not measured".into(), |x| format!(
                "{x:.2}x ({})",
                if x >= 1.0 { "MET" } else { "MISSED" }
            ))
    )?;
    for f in &r.floors {
        writeln!(
            w,
            "{:<48} {:>8.2} s {:>9.2} CPU-s {:>10.0} events/CPU-s {:>6.2} us/event ({} invalid, {} stored)",
            f.name,
            f.wall_s,
            f.consumer_cpu_s,
            f.events_per_consumer_cpu_s,
            f.consumer_cpu_s / f.events.max(1) as f64 * 1e6,
            f.invalid,
            f.stored
        )?;
    }
    let t = &r.weft_totals;
    writeln!(
        w,
        "weft totals: {} consumed, {} stored, {} duplicates dropped, {} dead-lettered",
        t.consumed, t.inserted, t.deduplicated, t.dead_lettered
    )?;
    let s = &r.weft_spans;
    writeln!(
        w,
        "weft spans: {} facts inserts of {:.0} rows avg, {:.2} s inside inserts (partitions concurrent); {} projector passes, {:.2} s ({} events placed directly, {} nodes loaded)",
        s.flushes_with_facts,
        s.avg_batch_rows,
        s.insert_wall_s,
        s.projector_passes,
        s.projector_wall_s,
        s.narrative_direct,
        s.narrative_loaded
    )?;
    writeln!(w, "\nconsumer CPU by thread (ingest phase):")?;
    let total: f64 = r.weft.consumer_cpu_s.unwrap_or(0.0);
    for th in &r.weft_threads {
        writeln!(
            w,
            "  {:<24} x{:<3} {:>7.2} s  {:>5.1}%  {:>6.2} us/event",
            th.group,
            th.threads,
            th.cpu_s,
            th.cpu_s / total * 100.0,
            th.cpu_s / r.envelopes as f64 * 1e6
        )?;
    }
    if !r.steps.is_empty() {
        writeln!(
            w,
            "\nper-step CPU, offline on one thread (where the time goes):"
        )?;
        for st in &r.steps {
            writeln!(w, "  {:<58} {:>7.2} us/event", st.step, st.us_per_event)?;
        }
    }
    crate::print_report(&out, r, json)
}

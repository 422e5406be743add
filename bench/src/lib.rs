//! weft's benchmarks, behind `weft bench ...`: tools, not product code. Nothing in the
//! product crates depends on this crate; the `weft` binary parses the flags, resolves the
//! configuration and calls in.
//!
//! - [`publish`]: the Publisher, and librdkafka's floor under it ([`publish_floor`]);
//! - [`ingest`]: `weft ingest` against ClickHouse's Kafka engine, and bare consumers' floors;
//! - [`lookup`]: narrative lookups with ~10M events stored;
//! - [`route`]: a running router over loopback HTTP;
//! - [`cpu`] and [`ch`]: the CPU accounting and the ClickHouse helpers they all share.
//!
//! Errors are `anyhow`: every one ends as a message to whoever runs the benchmark, as at the
//! binary's own edge.

pub mod ch;
pub mod cpu;
pub mod ingest;
pub mod lookup;
pub mod publish;
pub mod publish_floor;
pub mod route;

use std::time::Duration;

use anyhow::Context;
use serde::Serialize;
use weft_producers::{Publisher, PublisherConfig};

/// Print a benchmark's report: the table on stdout, or with `json` the table on stderr and
/// the report as JSON on stdout (for tools, and for the tests that check its counts).
pub(crate) fn print_report(table: &str, report: &impl Serialize, json: bool) -> anyhow::Result<()> {
    if json {
        eprint!("{table}");
        println!("{}", serde_json::to_string_pretty(report)?);
    } else {
        print!("{table}");
    }
    Ok(())
}

/// Start a Publisher for a benchmark and, with `create_topics`, create its missing topics
/// (a failure there is logged, not fatal: the first sends report it).
pub(crate) async fn connect_publisher(
    config: PublisherConfig,
    create_topics: bool,
) -> anyhow::Result<Publisher> {
    let spool = config.spool_dir.clone();
    let publisher = Publisher::connect(config)
        .await
        .with_context(|| format!("starting the publisher (spool {})", spool.display()))?;
    if create_topics {
        let created = tokio::time::timeout(Duration::from_secs(15), publisher.ensure_topics())
            .await
            .map_err(|_| "topic creation timed out (is the broker up?)".to_owned())
            .and_then(|r| r.map_err(|e| format!("could not create topics: {e}")));
        match created {
            Ok(created) if !created.is_empty() => tracing::info!(?created, "created topics"),
            Ok(_) => {}
            Err(why) => tracing::warn!("{why}"),
        }
    }
    Ok(publisher)
}

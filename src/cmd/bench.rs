//! `weft bench`: throughput and CPU cost measurements on the real stack. The benchmarks
//! live in `weft-bench`; this file parses their flags and hands them the configuration.

use clap::{Args, Parser, Subcommand};
use weft_bench::ingest::BenchIngestArgs;
use weft_bench::lookup::BenchLookupArgs;
use weft_bench::publish::BenchPublishArgs;
use weft_bench::route::BenchRouteArgs;

use crate::cmd::publish::PublisherArgs;
use crate::config::Settings;

/// Measure weft's hot paths on the local stack.
#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub what: BenchWhat,
}

/// What to measure.
#[derive(Debug, Subcommand)]
pub enum BenchWhat {
    Publish(BenchPublishCli),
    Ingest(BenchIngestArgs),
    Lookup(BenchLookupArgs),
    Route(BenchRouteArgs),
}

/// Publish N TraceEvents through the Publisher into the broker and report events/s and
/// CPU-seconds per event of this process (all threads, librdkafka's included, via
/// getrusage), plus the caller-thread share and validation alone, to show where time goes.
///
/// Measure throughput on the memory storage engine, so the broker is not the bottleneck:
///   WEFT_KAFKA_PORT=19192 WEFT_RUN_DIR=/tmp/weft-bench-run WEFT_KAFKA_STORAGE=memory \
///     bash deploy/local/stack.sh start kafka
///   weft --brokers 127.0.0.1:19192 bench publish --events 1000000
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct BenchPublishCli {
    #[command(flatten)]
    pub bench: BenchPublishArgs,

    #[command(flatten)]
    pub publisher: PublisherArgs,
}

/// The Publisher's flags alone, to build them with their defaults (and the environment).
#[derive(Debug, Parser)]
struct PublisherOnly {
    #[command(flatten)]
    publisher: PublisherArgs,
}

pub async fn run(args: BenchArgs, settings: Settings) -> anyhow::Result<()> {
    match args.what {
        BenchWhat::Publish(a) => {
            let mut p = a.publisher;
            weft_bench::publish::default_destination(&mut p.topic_prefix, &mut p.spool_dir);
            weft_bench::publish::run(a.bench, p.resolve(&settings), !p.no_create_topics).await
        }
        BenchWhat::Ingest(a) => {
            // Parsed from nothing, so fields added to PublisherArgs later get their defaults.
            let publisher = PublisherOnly::try_parse_from(["weft-bench-ingest"])?.publisher;
            let brokers = if settings.ingest.brokers.is_empty() {
                settings.kafka.brokers.clone()
            } else {
                settings.ingest.brokers.clone()
            };
            let stack = weft_bench::ingest::Stack {
                publisher: publisher.resolve(&settings),
                clickhouse: settings.clickhouse,
                brokers,
                ingest: settings.ingest,
            };
            weft_bench::ingest::run(a, stack).await
        }
        BenchWhat::Lookup(a) => weft_bench::lookup::run(a, settings.clickhouse).await,
        BenchWhat::Route(a) => weft_bench::route::run(a).await,
    }
}

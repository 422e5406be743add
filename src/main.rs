//! `weft`: the single entry point to the pipeline. Each subcommand lives in `cmd/`; all
//! configuration is resolved once, in `config`.

mod cmd;
mod config;
mod config_flags;
#[cfg(unix)]
mod heap;

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};
use tracing_subscriber::EnvFilter;

use crate::config::{GlobalArgs, LogFormat, Settings};

/// jemalloc instead of the system allocator: decoding and projecting build many small JSON
/// trees on several threads, where glibc's malloc cost about a third of ingest CPU.
#[cfg(unix)]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's settings, read when it starts (the `MALLOC_CONF` environment variable still
/// overrides them). By default jemalloc keeps freed pages for 10 s before it gives them back,
/// so while ingest drains a backlog the resident set also held the batches of the last ten
/// seconds, freed but not returned. A background thread returning them after a quarter of a
/// second is what lets 50k-record batches fit the 1 GiB budget (docs/BENCHMARKS.md, "Batch
/// size and the allocator").
#[cfg(target_os = "linux")]
#[export_name = "malloc_conf"]
static MALLOC_CONF: &[u8; 59] = b"background_thread:true,dirty_decay_ms:250,muzzy_decay_ms:0\0";

/// weft: the event-sourced audit and feedback pipeline for Weaver agent stacks.
///
/// Events (TraceEvent, PolicyDecision, Frame, Handle, CapabilityToken, RoutingDecision,
/// ExecutionRoutingDecision, ExecutionFeedback; weaver-spec 0.9.0) are published to Kafka,
/// ingested exactly once into ClickHouse, chained into per-request narratives, and used to
/// route and to audit.
///
/// Configuration: flags > WEFT_* environment > --config TOML file > defaults.
/// Logs go to stderr; set RUST_LOG (e.g. RUST_LOG=weft=debug) to change the level.
#[derive(Debug, Parser)]
#[command(name = "weft", version, propagate_version = true)]
pub(crate) struct Cli {
    #[command(flatten)]
    global: GlobalArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    Validate(cmd::validate::ValidateArgs),
    Migrate(cmd::migrate::MigrateArgs),
    // Boxed: its many flags would make every variant as large as it.
    Simulate(Box<cmd::simulate::SimulateArgs>),
    Publish(Box<cmd::publish::PublishArgs>),
    Gateway(Box<cmd::gateway::GatewayArgs>),
    Bench(Box<cmd::bench::BenchArgs>),
    Ingest(Box<cmd::ingest::IngestArgs>),
    Narrative(cmd::narrative::NarrativeArgs),
    Rebuild(cmd::rebuild::RebuildArgs),
    Reshard(cmd::reshard::ReshardArgs),
    Router(Box<cmd::router::RouterArgs>),
    Eval(Box<cmd::eval::EvalArgs>),
    Audit(Box<cmd::audit::AuditArgs>),
}

fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn main() -> ExitCode {
    let cli = parse_cli();
    init_logging(cli.global.log_format);
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Parse the command line, with the config file's values for the flags of the commands
/// configured by flag name (`[router]`, `[eval]`, `[audit]`; see `config_flags`).
fn parse_cli() -> Cli {
    let cmd = Cli::command();
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let matches = config_flags::first_parse(&cmd, &argv).unwrap_or_else(|e| e.exit());
    match config_flags::with_file_values(&cmd, argv, &matches) {
        Ok(argv) => Cli::parse_from(argv),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(2);
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let settings = || Settings::load(&cli.global);
    match cli.command {
        // Offline, with its own 0/1/2 exit contract; needs neither config nor a runtime.
        Command::Validate(a) => Ok(cmd::validate::run(a)),
        Command::Migrate(a) => block_on(cmd::migrate::run(a, settings()?)),
        // Synchronous; reads the config only to --publish.
        Command::Simulate(a) => cmd::simulate::run(*a, settings).map(|()| ExitCode::SUCCESS),
        // Exit 1 when any line was rejected or could not be made durable.
        Command::Publish(a) => {
            let ok =
                tokio::runtime::Runtime::new()?.block_on(cmd::publish::run(*a, settings()?))?;
            Ok(if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Gateway(a) => block_on(cmd::gateway::run(*a, settings()?)),
        Command::Bench(a) => block_on(cmd::bench::run(*a, settings()?)),
        Command::Ingest(a) => block_on(cmd::ingest::run(*a, settings()?)),
        Command::Narrative(a) => {
            let found =
                tokio::runtime::Runtime::new()?.block_on(cmd::narrative::run(a, settings()?))?;
            Ok(if found {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Rebuild(a) => block_on(cmd::rebuild::run(a, settings()?)),
        Command::Reshard(a) => block_on(cmd::reshard::run(a, settings()?)),
        Command::Router(a) => block_on(cmd::router::run(*a, settings()?)),
        // Exit 1 on failed checks (see `weft audit --help`).
        Command::Audit(a) => {
            tokio::runtime::Runtime::new()?.block_on(cmd::audit::run(*a, settings()?))
        }
        // Exit 1 when --gate is given and not met.
        Command::Eval(a) => {
            let pass = tokio::runtime::Runtime::new()?.block_on(cmd::eval::run(*a, settings()?))?;
            Ok(if pass {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
    }
}

/// Run one async command to completion and map success to exit status 0.
fn block_on(f: impl std::future::Future<Output = anyhow::Result<()>>) -> anyhow::Result<ExitCode> {
    tokio::runtime::Runtime::new()?.block_on(f)?;
    Ok(ExitCode::SUCCESS)
}

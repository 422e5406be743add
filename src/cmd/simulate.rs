//! `weft simulate`: realistic agent-kernel + ChainWeaver traffic as JSONL envelopes (or
//! published directly), with the ground truth that ingest, narrative and audit tests check.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use weft_sim::stream::{self, ConnectError, Output, Publishing};
use weft_sim::{Mix, SimConfig, Simulation, DEFAULT_START};

use crate::cmd::publish::PublisherArgs;
use crate::config::Settings;

const GENERATE: &str = "What to generate";
const OUTPUT: &str = "Output";
const STRESS: &str = "Narrative-builder stressors";
const VARIATIONS: &str = "Variations (share of flows, at most one per flow)";

/// Generate realistic Weaver traffic (envelopes, one per line) and its ground truth.
///
/// Each flow is one request, like the seed scenario (research, then code generation):
/// RoutingDecision; ExecutionRoutingDecision for the compiled flow; flow_started; per step
/// flow_step_started, CapabilityToken, PolicyDecision, capability_authorized,
/// capability_executed, Frame, Handle, flow_step_completed; flow_completed or flow_failed;
/// ExecutionFeedback. Every payload is a valid weaver-spec 0.9.0 contract.
///
/// Each flow gets at most one variation, drawn with the probabilities below (the rest are
/// clean). Some are legitimate (deny, partial, failure); the others inject exactly one
/// violation for `weft audit check` to find: I-06 (expired token, reused single-use token,
/// out-of-scope capability, a token never emitted), I-02 (execution without an allow decision, after a deny, or
/// without capability_authorized), I-01 (raw_output on a Frame), an orphan reference, or
/// an id conflict.
///
/// The same flags and seed always give byte-identical output: times count from --start,
/// never from the clock, and ids embed the seed (req-<seed>-<n>), so runs with different
/// seeds never collide.
///
/// Examples:
///   weft simulate --flows 300 --truth truth.json --out events.jsonl
///   weft simulate --events 1000000 --clean --out /dev/null
///   weft simulate --shuffle --no-request-id 0.2 --duplicates 0.05 --delay 0.1 \
///       --held-back-out late.jsonl --truth truth.json --out events.jsonl
///   weft simulate --publish --rate 5000 --events 1000000 --truth truth.json
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct SimulateArgs {
    /// How many flows (requests) to generate; a flow is 9 to 30 envelopes (about 21).
    #[arg(help_heading = GENERATE, long, default_value_t = 100, value_name = "N")]
    pub flows: u64,

    /// Generate whole flows until at least N envelopes are out (overrides --flows). Use it
    /// to size benchmarks in events rather than flows.
    #[arg(help_heading = GENERATE, long, value_name = "N")]
    pub events: Option<u64>,

    /// Seeds every random choice and is part of every id. Change it to get different, non
    /// colliding traffic; keep it to reproduce a run byte for byte.
    #[arg(help_heading = GENERATE, long, default_value_t = 1)]
    pub seed: u64,

    /// RFC 3339 time of the first flow; all timestamps derive from it.
    #[arg(help_heading = GENERATE, long, default_value = DEFAULT_START, value_name = "TIME")]
    pub start: String,

    /// Mean gap between flow starts in event time (ms). Flows last seconds, so with the
    /// default many overlap, as in real traffic.
    #[arg(help_heading = GENERATE, long, default_value_t = 100, value_name = "MS")]
    pub flow_interval_ms: u64,

    /// Tenant written on every envelope.
    #[arg(help_heading = GENERATE, long, default_value = weft_schemas::DEFAULT_TENANT)]
    pub tenant: String,

    /// Where the envelopes go, one JSON object per line (`-` = standard output). Feed it to
    /// `weft publish` or POST it to the gateway. Default: standard output; with --publish,
    /// nowhere.
    #[arg(help_heading = OUTPUT, long, short, value_name = "FILE")]
    pub out: Option<PathBuf>,

    /// Publish every envelope through the Publisher (Kafka, with the durable spool) as it
    /// is generated, and return once all are durable. Held-back envelopes are published
    /// last, or written to --held-back-out instead when it is given. Combine with --rate
    /// for steady traffic. Reads the [kafka] and [publisher] config like `weft publish`.
    /// When the reader of --out closes it early (`| head`), the run stops there: what was
    /// published is still made durable and counted, and no ground truth is written.
    #[arg(help_heading = OUTPUT, long)]
    pub publish: bool,

    /// Write the held-back envelopes (--delay) here instead of at the end of the stream,
    /// so a test can send them only after the rest has been ingested.
    #[arg(help_heading = OUTPUT, long, value_name = "FILE")]
    pub held_back_out: Option<PathBuf>,

    /// Write the ground truth here (JSON): per request its members [{kind,id}], links
    /// [{from,to,via}] (a metadata.flow_id link points at {kind: "flow", id: <flow id>}),
    /// dangling references, events without request id and injected violations; plus
    /// stream totals. Kept in memory until the end (about 0.5 KB per event; the file
    /// takes about 0.2 KB per event).
    #[arg(help_heading = OUTPUT, long, value_name = "FILE")]
    pub truth: Option<PathBuf>,

    /// Pace the output at N envelopes per second (0 = as fast as possible). Event
    /// timestamps do not change with the pace.
    #[arg(help_heading = OUTPUT, long, default_value_t = 0.0, value_name = "N")]
    pub rate: f64,

    /// Shuffle the stream, as partitions and retries do. Only the order changes.
    #[arg(help_heading = STRESS, long)]
    pub shuffle: bool,

    /// Shuffle within windows of N envelopes (0 = the whole stream, held in memory).
    #[arg(help_heading = STRESS, long, default_value_t = 10_000, value_name = "N")]
    pub shuffle_window: usize,

    /// Fraction of envelopes held back and sent after all others (late arrivals, to
    /// exercise late binding).
    #[arg(help_heading = STRESS, long, default_value_t = 0.0, value_name = "P")]
    pub delay: f64,

    /// Fraction of envelopes sent twice, byte for byte (retries; ingest must store once).
    #[arg(help_heading = STRESS, long, default_value_t = 0.0, value_name = "P")]
    pub duplicates: f64,

    /// Fraction of events sent without a request id. Only events linked by id to an event
    /// of their request that keeps its id lose it, so the narrative builder can recover
    /// them through the decision → frame → handle chain.
    #[arg(help_heading = STRESS, long, default_value_t = 0.0, value_name = "P")]
    pub no_request_id: f64,

    /// Fraction of flows whose RoutingDecision is sent twice: first pending
    /// (selected_item_id and selected_card_id null, as weaver-spec allows), then selected.
    /// Legitimate: the audit reports no id conflict for it.
    #[arg(help_heading = STRESS, long, default_value_t = 0.0, value_name = "P")]
    pub pending_routing: f64,

    /// Only clean flows: no denials, failures or violations (sets every variation to 0).
    #[arg(help_heading = VARIATIONS, long, conflicts_with_all = ["deny", "partial",
        "failure", "expired_token", "reused_token", "out_of_scope", "unauthorized",
        "raw_output", "orphan", "id_conflict", "unknown_token"])]
    pub clean: bool,

    /// Share of flows with a denied step (capability_denied, flow_failed). Legitimate.
    #[arg(help_heading = VARIATIONS, long, default_value_t = Mix::default().deny, value_name = "P")]
    pub deny: f64,

    /// Share of flows with a partial execution (outcome partial). Legitimate.
    #[arg(help_heading = VARIATIONS, long, default_value_t = Mix::default().partial, value_name = "P")]
    pub partial: f64,

    /// Share of flows whose tool fails (flow_failed). Legitimate.
    #[arg(help_heading = VARIATIONS, long, default_value_t = Mix::default().failure, value_name = "P")]
    pub failure: f64,

    /// Share of flows using a token after its expires_at (I-06).
    #[arg(help_heading = VARIATIONS, long, default_value_t = Mix::default().expired_token, value_name = "P")]
    pub expired_token: f64,

    /// Share of flows reusing a single-use token in a second step (I-06).
    #[arg(help_heading = VARIATIONS, long, default_value_t = Mix::default().reused_token, value_name = "P")]
    pub reused_token: f64,

    /// Share of flows executing a capability outside the token's scope (I-06).
    #[arg(help_heading = VARIATIONS, long, default_value_t = Mix::default().out_of_scope, value_name = "P")]
    pub out_of_scope: f64,

    /// Share of flows executing without an allow decision, after a deny, or without
    /// capability_authorized first, or with a deny PolicyDecision no TraceEvent names (I-02).
    #[arg(help_heading = VARIATIONS, long, default_value_t = Mix::default().unauthorized, value_name = "P")]
    pub unauthorized: f64,

    /// Share of flows with a Frame carrying raw_output (I-01).
    #[arg(help_heading = VARIATIONS, long, default_value_t = Mix::default().raw_output, value_name = "P")]
    pub raw_output: f64,

    /// Share of flows whose capability_executed references a Handle never sent (orphan).
    #[arg(help_heading = VARIATIONS, long, default_value_t = Mix::default().orphan, value_name = "P")]
    pub orphan: f64,

    /// Share of flows sending one id twice with different content (id conflict).
    #[arg(help_heading = VARIATIONS, long, default_value_t = Mix::default().id_conflict, value_name = "P")]
    pub id_conflict: f64,

    /// Share of flows whose allow PolicyDecision names a CapabilityToken that is never sent
    /// (I-06 token_unknown). 0 by default, so the default streams of every seed stay as they
    /// were.
    #[arg(help_heading = VARIATIONS, long, default_value_t = Mix::default().unknown_token, value_name = "P")]
    pub unknown_token: f64,

    /// Publisher options (with --publish).
    #[command(flatten, next_help_heading = "Publishing (with --publish)")]
    pub publisher: PublisherArgs,
}

impl SimulateArgs {
    fn config(&self) -> SimConfig {
        let mix = if self.clean {
            Mix::clean()
        } else {
            Mix {
                deny: self.deny,
                partial: self.partial,
                failure: self.failure,
                expired_token: self.expired_token,
                reused_token: self.reused_token,
                out_of_scope: self.out_of_scope,
                unauthorized: self.unauthorized,
                raw_output: self.raw_output,
                orphan: self.orphan,
                id_conflict: self.id_conflict,
                unknown_token: self.unknown_token,
            }
        };
        SimConfig {
            seed: self.seed,
            flows: self.flows,
            min_events: self.events,
            start: self.start.clone(),
            flow_interval_ms: self.flow_interval_ms,
            tenant: self.tenant.clone(),
            mix,
            no_request_id: self.no_request_id,
            pending_routing: self.pending_routing,
            duplicates: self.duplicates,
            delay: self.delay,
            shuffle: self.shuffle,
            shuffle_window: self.shuffle_window,
            record_truth: self.truth.is_some(),
        }
    }
}

/// Run the simulation. `settings` is only loaded with --publish: plain generation needs no
/// configuration and never fails on a bad config file.
pub fn run(
    args: SimulateArgs,
    settings: impl FnOnce() -> anyhow::Result<Settings>,
) -> anyhow::Result<()> {
    let cfg = args.config();
    let span = tracing::info_span!("simulate", seed = cfg.seed);
    let _guard = span.enter();
    let sim = Simulation::new(cfg).context("invalid simulation options")?;
    let output = Output {
        out: args.out.clone(),
        held_back_out: args.held_back_out.clone(),
        truth: args.truth.clone(),
        rate: args.rate,
    };
    let connect = || -> Result<Publishing, ConnectError> {
        let settings = settings()?;
        let runtime = tokio::runtime::Runtime::new()?;
        let publisher = runtime.block_on(args.publisher.connect(&settings))?;
        Ok(Publishing::new(runtime, publisher))
    };
    let published = stream::run(sim, &output, args.publish.then_some(connect))?;
    if let Some(p) = published {
        eprintln!(
            "{} envelopes: {} published to Kafka, {} spooled, {} rejected",
            p.kafka + p.spooled + p.rejected,
            p.kafka,
            p.spooled,
            p.rejected
        );
        if let Some(first) = &p.first_rejection {
            anyhow::bail!(
                "{} envelopes were not published; first: {first}",
                p.rejected
            );
        }
    }
    Ok(())
}

//! `weft router`: the feedback-aware router service, and `weft router snapshot`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use weft_http::{ApiKeys, KeySources};
use weft_router::learner::LearnerConfig;
use weft_router::model::Snapshot;
use weft_router::policy::{PolicyConfig, PolicyName, Weights};
use weft_router::service::{self, Service, ServiceConfig};
use weft_schemas::ports::{self, loopback};
use weft_store::Store;

use crate::cmd::publish::PublisherArgs;
use crate::config::Settings;

/// Run the feedback-aware router: POST /v1/route, POST /v1/feedback, GET /healthz, /metrics.
///
/// POST /v1/route takes {context: {tenant?, intent?, x_weft_context?, request_id?, ...},
/// candidates: [ExecutionCandidate], constraints?: {max_latency_ms, max_cost, min_quality},
/// policy?: squarecb (the default)|greedy|epsilon_greedy|thompson|ucb|static} and answers an ExecutionRoutingDecision
/// (advisory; it grants nothing) with the propensity of the choice, the policy and its
/// version and every candidate's score under metadata.x_weft_*. Candidates whose expected
/// latency (p90), cost or quality violate the constraints are never chosen; when none fits
/// the answer is 422 {error.code: no_candidate_fits, fallback_candidates}. Expected figures
/// come from the feedback aggregates once a candidate has --min-obs outcomes, before that
/// from the candidate's metadata.x_weft_latency_ms / x_weft_cost / x_weft_quality.
/// Every decision is published (kind execution_routing_decision, key = context.request_id).
///
/// POST /v1/feedback takes an ExecutionFeedback, stamps metadata.x_weft_context from the
/// decision it answers (when this router made it), and publishes it (202 once durable).
///
/// Scores come from an in-memory snapshot of the ClickHouse aggregates (weft_router_stats,
/// migration 0003), re-read every --refresh-ms; a decision never waits on ClickHouse. While
/// ClickHouse is unreachable, decisions use the last snapshot (reason code snapshot_stale) or
/// the priors (priors_only).
///
/// Keys: WEFT_ROUTER_KEYS="key=tenant,..." (or --keys); a tenant's decisions use only its own
/// aggregates.
///
/// Examples:
///   WEFT_ROUTER_KEYS="k-0123456789abcdef=acme" weft router --policy thompson
///   weft router snapshot --out router.json && weft router --snapshot router.json
#[derive(Debug, Args)]
#[command(verbatim_doc_comment, args_conflicts_with_subcommands = true)]
pub struct RouterArgs {
    #[command(subcommand)]
    pub action: Option<RouterAction>,

    /// Address to listen on.
    #[arg(long, value_name = "ADDR", default_value_t = loopback(ports::ROUTER))]
    pub listen: SocketAddr,

    /// Allow a --listen address that is not loopback.
    #[arg(long)]
    pub allow_remote: bool,

    /// API keys as key=tenant,key=tenant (prefer the environment variable).
    #[arg(
        long,
        env = "WEFT_ROUTER_KEYS",
        hide_env_values = true,
        value_name = "KEY=TENANT,..."
    )]
    pub keys: Option<String>,

    /// Start from this snapshot file (see `weft router snapshot`).
    #[arg(long, value_name = "FILE")]
    pub snapshot: Option<PathBuf>,

    /// Snapshot refresh period in milliseconds (0 = never re-read ClickHouse).
    #[arg(long, value_name = "MS", default_value_t = 5000)]
    pub refresh_ms: u64,

    /// How long the router's Kafka producer waits to fill a batch (`linger.ms`), overriding
    /// `[publisher] linger_ms`. Decisions are published without waiting for the broker, so a
    /// longer linger costs them nothing, while a short one makes librdkafka's broker thread
    /// wake up thousands of times a second (it was a third of the router's CPU at 5 ms).
    /// Feedback (`POST /v1/feedback`, answered once durable) waits up to this long more.
    #[arg(long, value_name = "MS", default_value_t = 50)]
    pub publish_linger_ms: u64,

    /// The most /v1 requests handled at once; one more is answered at once, 503 `busy` with
    /// `Retry-After: 1`, before its body is read. With the 256 KiB body limit this bounds the
    /// memory requests in hand can hold.
    #[arg(long, value_name = "N", env = "WEFT_ROUTER_MAX_CONCURRENT_REQUESTS",
          default_value_t = service::DEFAULT_MAX_CONCURRENT_REQUESTS)]
    pub max_concurrent_requests: usize,

    /// Seconds a /v1 request's whole body may take to arrive; slower: 408 `body_timeout`,
    /// and its slot freed, so clients trickling bodies cannot hold every slot.
    #[arg(long, value_name = "SECS", env = "WEFT_ROUTER_BODY_TIMEOUT_SECS",
          default_value_t = service::DEFAULT_BODY_TIMEOUT_SECS)]
    pub body_timeout_secs: u64,

    #[command(flatten)]
    pub fit: FitArgs,

    #[command(flatten)]
    pub policy: PolicyArgs,

    #[command(flatten)]
    pub publisher: PublisherArgs,
}

/// Router subcommands.
#[derive(Debug, Subcommand)]
pub enum RouterAction {
    /// Export the fitted state (decayed statistics per tenant x context x candidate) as a
    /// versioned JSON file, which `weft router --snapshot` starts from and `weft eval
    /// --snapshot` evaluates.
    Snapshot(SnapshotArgs),
}

/// `weft router snapshot`.
#[derive(Debug, Args)]
pub struct SnapshotArgs {
    /// Output file ("-" = stdout).
    #[arg(long, value_name = "FILE", default_value = "-")]
    pub out: String,

    #[command(flatten)]
    pub fit: FitArgs,

    /// The reward weights and settings the contextual model is rebuilt with.
    #[command(flatten)]
    pub policy: PolicyArgs,
}

/// How the aggregates are read.
#[derive(Debug, Clone, Args)]
pub struct FitArgs {
    /// Ignore aggregates older than this many seconds.
    #[arg(long, value_name = "S", default_value_t = 7 * 86_400)]
    pub window_s: u64,

    /// Exponential decay half-life in seconds (0 = no decay).
    #[arg(long, value_name = "S", default_value_t = 86_400.0)]
    pub half_life_s: f64,

    /// (context, candidate) cells of the aggregates read per tenant at most, the most
    /// evidenced; a tenant's cells past it are not served (its candidates there fall back to
    /// the priors; `weft_router_snapshot_tenants_at_cell_limit` counts such tenants).
    #[arg(long, value_name = "N", default_value_t = weft_router::store::DEFAULT_MAX_CELLS)]
    pub max_cells: u64,
}

/// Policy settings, shared by `weft router` and `weft eval`.
#[derive(Debug, Clone, Args)]
pub struct PolicyArgs {
    /// Default policy (a request may name another): squarecb (contextual, exploring; the
    /// default), greedy, epsilon_greedy, thompson, ucb or static.
    #[arg(long, value_parser = parse_policy, default_value = "squarecb")]
    pub policy: PolicyName,

    /// squarecb: gamma scale of the inverse-gap weighting (gamma = scale * updates^exponent).
    #[arg(long, default_value_t = 40.0)]
    pub squarecb_gamma: f64,

    /// squarecb: gamma exponent.
    #[arg(long, default_value_t = 0.5)]
    pub squarecb_exponent: f64,

    /// squarecb: width of the confidence bound (standard errors) a candidate's gap is
    /// measured from (0 = plain inverse-gap weighting on the scores).
    #[arg(long, default_value_t = 1.0)]
    pub squarecb_confidence: f64,

    /// squarecb: ridge penalty of the contextual regression.
    #[arg(long, default_value_t = 1.0)]
    pub ridge: f64,

    /// Decisions at most in flight for a candidate whose latency, cost or quality under a
    /// constraint is still unknown (bounded-risk exploration).
    #[arg(long, default_value_t = 1)]
    pub risk_budget: u32,

    /// squarecb: candidates whose live figures a tenant's model holds at most; a new one
    /// past it evicts the least evidenced, which then counts as never seen
    /// (`weft_router_model_arms_evicted_total`).
    #[arg(long, value_name = "N", default_value_t = weft_router::learner::DEFAULT_MAX_ARMS)]
    pub max_arms: usize,

    /// Policy version, logged with every decision.
    #[arg(long, default_value = "1")]
    pub policy_version: String,

    /// Exploration rate of epsilon_greedy.
    #[arg(long, default_value_t = 0.1)]
    pub epsilon: f64,

    /// Exploration bonus of ucb.
    #[arg(long, default_value_t = 1.0)]
    pub ucb_c: f64,

    /// Monte-Carlo draws for Thompson propensities and confidence.
    #[arg(long, default_value_t = 256)]
    pub mc_samples: usize,

    /// Outcomes needed before observed latency/cost/quality replace declared ones.
    #[arg(long, default_value_t = 5.0)]
    pub min_obs: f64,

    /// Utility weight of the success rate.
    #[arg(long, default_value_t = 1.0)]
    pub w_success: f64,

    /// Utility weight of quality (0..1).
    #[arg(long, default_value_t = 0.0)]
    pub w_quality: f64,

    /// Utility penalty per unit of cost (cost.usd, else cost.amount).
    #[arg(long, default_value_t = 0.0)]
    pub w_cost: f64,

    /// Utility penalty per second of latency.
    #[arg(long, default_value_t = 0.0)]
    pub w_latency_per_s: f64,
}

fn parse_policy(s: &str) -> Result<PolicyName, String> {
    PolicyName::parse(s).ok_or_else(|| {
        format!("`{s}`: expected squarecb, greedy, epsilon_greedy, thompson, ucb or static")
    })
}

impl PolicyArgs {
    pub fn config(&self) -> PolicyConfig {
        PolicyConfig {
            policy: self.policy,
            version: self.policy_version.clone(),
            epsilon: self.epsilon,
            ucb_c: self.ucb_c,
            mc_samples: self.mc_samples,
            min_obs: self.min_obs,
            weights: Weights {
                success: self.w_success,
                quality: self.w_quality,
                cost: self.w_cost,
                latency_per_s: self.w_latency_per_s,
            },
            learner: LearnerConfig {
                ridge: self.ridge,
                gamma_scale: self.squarecb_gamma,
                gamma_exponent: self.squarecb_exponent,
                risk_budget: self.risk_budget,
                confidence: self.squarecb_confidence,
                max_arms: self.max_arms,
            },
            ..PolicyConfig::default()
        }
    }
}

fn client(settings: &Settings) -> anyhow::Result<Store> {
    Ok(Store::new(settings.clickhouse.clone())?)
}

pub async fn run(args: RouterArgs, settings: Settings) -> anyhow::Result<()> {
    if let Some(RouterAction::Snapshot(a)) = args.action {
        return snapshot(a, settings).await;
    }
    let keys = ApiKeys::load(&KeySources {
        list: args.keys.as_deref(),
        list_origin: "WEFT_ROUTER_KEYS / --keys",
        ..KeySources::default()
    })?;
    if keys.is_empty() {
        tracing::warn!("no API keys configured: every request will get 401 (see --help)");
    }
    let initial = match &args.snapshot {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("reading snapshot {}", p.display()))?;
            Some(
                Snapshot::from_json(&text)
                    .map_err(|e| anyhow::anyhow!("snapshot {}: {e}", p.display()))?,
            )
        }
        None => None,
    };
    let ch = client(&settings)?;
    let cfg = ServiceConfig {
        policy: args.policy.config(),
        refresh_period: Duration::from_millis(args.refresh_ms),
        window_s: args.fit.window_s,
        half_life_s: args.fit.half_life_s,
        max_cells: args.fit.max_cells,
        source: format!("clickhouse:{}", settings.clickhouse.database),
        max_concurrent_requests: args.max_concurrent_requests,
        body_timeout: Duration::from_secs(args.body_timeout_secs.max(1)),
    };
    let mut pub_settings = settings.for_router();
    pub_settings.publisher.linger_ms = args.publish_linger_ms;
    let publisher = args.publisher.connect(&pub_settings).await?;
    let svc = Service::new(cfg, keys, publisher.clone(), initial);
    tokio::spawn(svc.clone().refresh_loop(ch));
    let listener = weft_http::bind(args.listen, args.allow_remote).await?;
    let local = listener.local_addr()?;
    tracing::info!(listen = %local, policy = args.policy.policy.as_str(), "router listening");
    println!("listening on http://{local}");
    axum::serve(listener, service::app(svc))
        .with_graceful_shutdown(weft_http::shutdown_signal())
        .await?;
    tokio::task::spawn_blocking(move || publisher.close(Duration::from_secs(30))).await?;
    Ok(())
}

async fn snapshot(a: SnapshotArgs, settings: Settings) -> anyhow::Result<()> {
    let ch = client(&settings)?;
    let source = format!("clickhouse:{}", settings.clickhouse.database);
    let mut snap = weft_router::store::read_stats(
        &ch,
        &source,
        a.fit.window_s,
        a.fit.half_life_s,
        a.fit.max_cells,
    )
    .await
    .context("reading weft_router_stats (run `weft migrate`?)")?;
    snap.contextual = weft_router::live::rebuild(&ch, &a.policy.config(), a.fit.window_s)
        .await
        .context("rebuilding the contextual model from weft_events")?
        .models();
    let text = serde_json::to_string_pretty(&snap)? + "\n";
    if a.out == "-" {
        print!("{text}");
    } else {
        std::fs::write(&a.out, text).with_context(|| format!("writing {}", a.out))?;
        eprintln!("snapshot: {} cells written to {}", snap.cells(), a.out);
    }
    Ok(())
}

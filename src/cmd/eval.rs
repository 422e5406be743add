//! `weft eval`: off-policy evaluation of a router policy on logged decisions and feedback.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use serde_json::Value;
use weft_router::eval::{self, logged};
use weft_router::model::Snapshot;
use weft_store::Store;

use crate::cmd::router::PolicyArgs;
use crate::config::Settings;

/// Estimate a target policy's value from the logged routing decisions (with their
/// propensities) and their feedback, read from ClickHouse over a time range.
///
/// Estimators: IPS, self-normalised IPS and doubly robust (direct-method model: mean logged
/// reward per context x candidate), with studentized-bootstrap 95% intervals, the effective
/// sample size, support warnings, and regret against the best candidate in hindsight. The
/// reward is the router's utility (--w-* weights; by default the success indicator). The
/// target policy (--policy and its settings) scores candidates from --snapshot FILE, or, by
/// default, from statistics fitted on the same logged data (in-sample: optimistic).
///
/// Output: a weaver-spec EvaluationArtifact (validated) on stdout or --out.
/// --gate V: exit 1 unless the DR interval's lower bound is >= V and support is not
/// high_risk (exit 0 otherwise), for CI.
///
/// Example:
///   weft eval --tenant acme --since-s 86400 --policy greedy --gate 0.8
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct EvalArgs {
    /// Tenant whose decisions are evaluated.
    #[arg(long)]
    pub tenant: String,

    /// Start of the range (RFC 3339); default: now - --since-s.
    #[arg(long, value_name = "TIME")]
    pub from: Option<String>,

    /// End of the range (RFC 3339, exclusive); default: now.
    #[arg(long, value_name = "TIME")]
    pub to: Option<String>,

    /// Length of the default range in seconds.
    #[arg(long, value_name = "S", default_value_t = 86_400)]
    pub since_s: u64,

    /// Target policy's fitted state (a `weft router snapshot` file).
    #[arg(long, value_name = "FILE")]
    pub snapshot: Option<PathBuf>,

    /// Bootstrap resamples for the studentized (bootstrap-t) 95% intervals; 0 gives normal
    /// intervals.
    #[arg(long, default_value_t = 500)]
    pub bootstrap: usize,

    /// Seed of the bootstrap and of Monte-Carlo target probabilities.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,

    /// Exit 1 unless the DR lower 95% bound reaches this value.
    #[arg(long, value_name = "VALUE")]
    pub gate: Option<f64>,

    /// Write the artifact here instead of stdout.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,

    /// Also store the artifact in ClickHouse (`weft_eval_results`, migration 0005), where
    /// the router dashboard shows the latest estimates per policy.
    #[arg(long)]
    pub store: bool,

    #[command(flatten)]
    pub policy: PolicyArgs,
}

/// Insert one artifact into `weft_eval_results`; every value is a query parameter.
async fn store_artifact(
    store: &Store,
    tenant: &str,
    art: &Value,
    (from, to): (i64, i64),
) -> anyhow::Result<()> {
    let s = |k: &str| art[k].as_str().unwrap_or_default().to_owned();
    store
        .client()
        .query(
            "INSERT INTO weft_eval_results \
               (tenant, candidate_policy, created_at, artifact_id, range_from, range_to, artifact) \
             SELECT {tenant:String}, {policy:String}, \
                    parseDateTime64BestEffort({created:String}, 6, 'UTC'), {id:String}, \
                    fromUnixTimestamp64Micro({from:Int64}, 'UTC'), \
                    fromUnixTimestamp64Micro({to:Int64}, 'UTC'), {artifact:String}",
        )
        .param("tenant", tenant)
        .param("policy", s("candidate_policy"))
        .param("created", s("created_at"))
        .param("id", s("artifact_id"))
        .param("from", from)
        .param("to", to)
        .param("artifact", serde_json::to_string(art)?)
        .execute()
        .await?;
    Ok(())
}

/// Returns whether the gate passed (always true without --gate).
pub async fn run(args: EvalArgs, settings: Settings) -> anyhow::Result<bool> {
    let now = weft_schemas::time::parse_micros(&weft_schemas::time::now_rfc3339()).unwrap_or(0);
    let parse = |s: &Option<String>, default: i64| -> anyhow::Result<i64> {
        match s {
            None => Ok(default),
            Some(t) => weft_schemas::time::parse_micros(t)
                .with_context(|| format!("`{t}` is not an RFC 3339 time")),
        }
    };
    let to = parse(&args.to, now)?;
    let since = i64::try_from(args.since_s)
        .ok()
        .and_then(|s| s.checked_mul(1_000_000))
        .and_then(|us| to.checked_sub(us))
        .with_context(|| format!("--since-s {} reaches before any time", args.since_s))?;
    let from = parse(&args.from, since)?;
    let cfg = args.policy.config();
    let target = match &args.snapshot {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("reading snapshot {}", p.display()))?;
            Some(Snapshot::from_json(&text).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?)
        }
        None => None,
    };
    let store = Store::new(settings.clickhouse.clone())?;
    let (pairs, missing) = weft_router::store::read_logged(&store, &args.tenant, from, to)
        .await
        .context("reading logged decisions")?;
    let (data, skipped, rates) =
        logged::records(&pairs, &args.tenant, &cfg, target.as_ref(), args.seed);
    let report = eval::evaluate(&data, args.bootstrap, args.seed);
    let range = (
        weft_schemas::time::micros_to_rfc3339(from),
        weft_schemas::time::micros_to_rfc3339(to),
    );
    let art = logged::artifact(
        &report,
        &cfg,
        &args.tenant,
        (&range.0, &range.1),
        skipped,
        missing,
        rates,
        args.bootstrap,
    );
    let violations = weft_schemas::Validator::global()
        .check("evaluation_artifact", &art)
        .context("validating the evaluation artifact")?;
    anyhow::ensure!(
        violations.is_empty(),
        "the evaluation artifact does not validate: {violations:?}"
    );
    let text = serde_json::to_string_pretty(&art)? + "\n";
    if args.store {
        store_artifact(&store, &args.tenant, &art, (from, to))
            .await
            .context("storing the artifact in weft_eval_results (run `weft migrate`)")?;
    }
    match &args.out {
        Some(p) => std::fs::write(p, text).with_context(|| format!("writing {}", p.display()))?,
        None => print!("{text}"),
    }
    let pass = match args.gate {
        None => true,
        Some(g) => report.dr.ci_low >= g && art["support_state"] != "high_risk",
    };
    eprintln!(
        "eval: n={} IPS={:.4} SNIPS={:.4} DR={:.4} [{:.4}, {:.4}] logged={:.4} ESS={:.1}{}",
        report.n,
        report.ips.value,
        report.snips.value,
        report.dr.value,
        report.dr.ci_low,
        report.dr.ci_high,
        report.logged_value,
        report.effective_sample_size,
        match args.gate {
            Some(g) => format!(" gate {g}: {}", if pass { "pass" } else { "FAIL" }),
            None => String::new(),
        }
    );
    Ok(pass)
}

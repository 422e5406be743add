//! `weft eval`: off-policy evaluation of a router policy on logged decisions and feedback.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use serde_json::{json, Map, Value};
use weft_router::eval::{self, Logged};
use weft_router::model::Snapshot;
use weft_router::policy::{self, PolicyConfig};
use weft_router::rng::Rng;
use weft_router::store::LoggedPair;
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

fn f(v: &Value, path: &[&str]) -> Option<f64> {
    path.iter().try_fold(v, |v, k| v.get(k))?.as_f64()
}

/// Cost convention of the aggregates: cost.usd, else cost.amount, else 0.
fn cost_of(fb: &Value) -> f64 {
    f(fb, &["cost", "usd"])
        .or_else(|| f(fb, &["cost", "amount"]))
        .unwrap_or(0.0)
}

/// Turn logged pairs into evaluation records for the target policy. Returns the records and
/// the number of decisions skipped for lack of a propensity.
pub fn records(
    pairs: &[LoggedPair],
    tenant: &str,
    cfg: &PolicyConfig,
    target: Option<&Snapshot>,
    seed: u64,
) -> (Vec<Logged>, usize, [f64; 3]) {
    let reward = |fb: &Value| {
        let success = f64::from(u8::from(
            fb.get("success").and_then(Value::as_bool).unwrap_or(false),
        ));
        cfg.weights.utility(
            success,
            f(fb, &["quality_score"]).unwrap_or(cfg.prior_quality),
            cost_of(fb),
            f(fb, &["latency_ms"]).unwrap_or(0.0),
        )
    };
    // The in-sample fit, when no snapshot is given.
    let mut fitted = Snapshot::empty("logged-data");
    for p in pairs {
        let ctx = p.decision["metadata"]["x_weft_context"]
            .as_str()
            .unwrap_or_default();
        let id = p.decision["candidate"]["candidate_id"]
            .as_str()
            .unwrap_or_default();
        let fb = &p.feedback;
        fitted
            .arms_mut(tenant, ctx)
            .entry(id.to_owned())
            .or_default()
            .observe(
                fb.get("success").and_then(Value::as_bool).unwrap_or(false),
                f(fb, &["latency_ms"]),
                cost_of(fb),
                f(fb, &["quality_score"]),
            );
    }
    let snap = target.unwrap_or(&fitted);
    let mut rng = Rng::new(seed ^ 0x5eed);
    let mut out = Vec::new();
    let mut skipped = 0;
    let (mut succ, mut cost, mut lat, mut lat_n) = (0.0, 0.0, 0.0, 0.0);
    for p in pairs {
        let d = &p.decision;
        let Some(prop) = f(d, &["metadata", "x_weft_propensity"]).filter(|x| *x > 0.0) else {
            skipped += 1;
            continue;
        };
        let ctx = d["metadata"]["x_weft_context"].as_str().unwrap_or_default();
        // The admissible set: the choice and its fallbacks, ordered by id.
        let mut cands: BTreeMap<String, Option<Map<String, Value>>> = BTreeMap::new();
        let chosen_id = d["candidate"]["candidate_id"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        for c in std::iter::once(&d["candidate"]).chain(
            d.get("fallback_candidates")
                .and_then(Value::as_array)
                .into_iter()
                .flatten(),
        ) {
            if let Some(id) = c["candidate_id"].as_str() {
                cands.insert(
                    id.to_owned(),
                    c.get("metadata").and_then(Value::as_object).cloned(),
                );
            }
        }
        let ests = policy::estimates(
            cfg,
            cands.iter().map(|(id, m)| (id.as_str(), m.as_ref())),
            snap.arms(tenant, ctx),
        );
        let target_p = policy::probabilities(cfg.policy, cfg, &ests, &mut rng);
        let actions: Vec<String> = cands.keys().cloned().collect();
        let chosen = actions.iter().position(|a| *a == chosen_id).unwrap_or(0);
        let fb = &p.feedback;
        if fb.get("success").and_then(Value::as_bool) == Some(true) {
            succ += 1.0;
        }
        cost += cost_of(fb);
        if let Some(l) = f(fb, &["latency_ms"]) {
            lat += l;
            lat_n += 1.0;
        }
        out.push(Logged {
            context: ctx.to_owned(),
            actions,
            chosen,
            propensity: prop,
            reward: reward(fb),
            target: target_p,
        });
    }
    let n = out.len().max(1) as f64;
    let rates = [
        succ / n,
        cost / n,
        if lat_n > 0.0 { lat / lat_n } else { 0.0 },
    ];
    (out, skipped, rates)
}

/// Build the EvaluationArtifact.
#[allow(clippy::too_many_arguments)]
pub fn artifact(
    report: &eval::Report,
    cfg: &PolicyConfig,
    tenant: &str,
    range: (&str, &str),
    skipped: usize,
    missing_feedback: usize,
    rates: [f64; 3],
    bootstrap: usize,
) -> Value {
    let n = report.n as f64;
    let support = if report.n < 30
        || report.unsupported_share > 0.2
        || report.effective_sample_size < 0.05 * n
    {
        "high_risk"
    } else if report.warnings.is_empty() && skipped == 0 {
        "ok"
    } else {
        "caution"
    };
    let mut warnings = report.warnings.clone();
    if skipped > 0 {
        warnings.push(format!(
            "{skipped} decisions carry no propensity and were left out"
        ));
    }
    let uplift = report.dr.value - report.logged_value;
    let kind = match support {
        "high_risk" => "needs_more_data",
        _ if report.dr.ci_low > report.logged_value => "deploy",
        _ if report.dr.ci_high < report.logged_value => "do_not_deploy",
        _ => "experiment_ready",
    };
    let iv = |i: &eval::Interval| json!([i.ci_low, i.ci_high]);
    let now = weft_schemas::time::now_rfc3339();
    json!({
        "artifact_id": format!("weft-eval-{tenant}-{}", now.replace([':', '.'], "")),
        "producer": "weft",
        "producer_version": env!("CARGO_PKG_VERSION"),
        "created_at": now,
        "artifact_type": "offline_policy_evaluation",
        "target_estimand": "expected_utility_per_decision",
        "candidate_policy": format!("{}@{}", cfg.policy.as_str(), cfg.version),
        "baseline_policy": "logged",
        "metrics": {
            "estimated_value": report.dr.value,
            "ips": report.ips.value,
            "snips": report.snips.value,
            "dr": report.dr.value,
            "logged_value": report.logged_value,
            "value_uplift_vs_baseline": uplift,
            "best_in_hindsight_value": report.best_in_hindsight_value,
            "regret_vs_best_in_hindsight": report.target_regret,
            "logged_regret_vs_best_in_hindsight": report.logged_regret,
            "logged_success_rate": rates[0],
            "logged_mean_cost": rates[1],
            "logged_mean_latency_ms": rates[2],
            "n": report.n,
        },
        "uncertainty": {
            "ci_method": report.ci_method,
            "ci_level": 0.95,
            "bootstrap_samples": bootstrap,
            "value_ci": iv(&report.dr),
            "ips_ci": iv(&report.ips),
            "snips_ci": iv(&report.snips),
            "dr_ci": iv(&report.dr),
        },
        "support_state": support,
        "support_diagnostics": {
            "effective_sample_size": report.effective_sample_size,
            "unsupported_share": report.unsupported_share,
            "decisions_evaluated": report.n,
            "decisions_without_feedback": missing_feedback,
            "decisions_without_propensity": skipped,
        },
        "propensity_diagnostics": {
            "max_importance_weight": report.max_importance_weight,
            "min_propensity": report.min_propensity,
            "clipping_applied": false,
        },
        "warnings": warnings,
        "recommendation_kind": kind,
        "limitations": [
            "Offline estimate only; no online validation performed.",
            "Without --snapshot the target policy is fitted on the evaluated data (in-sample)."
        ],
        "provenance": {"tenant": tenant, "from": range.0, "to": range.1, "source": "weft_events"},
        "metadata": {"x_weft_weights": cfg.weights},
    })
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
    let from = parse(&args.from, to - args.since_s as i64 * 1_000_000)?;
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
    let (pairs, missing) = weft_router::store::read_logged(store.client(), &args.tenant, from, to)
        .await
        .context("reading logged decisions")?;
    let (data, skipped, rates) = records(&pairs, &args.tenant, &cfg, target.as_ref(), args.seed);
    let report = eval::evaluate(&data, args.bootstrap, args.seed);
    let range = (
        weft_schemas::time::micros_to_rfc3339(from),
        weft_schemas::time::micros_to_rfc3339(to),
    );
    let art = artifact(
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
        .unwrap_or_default();
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

//! Reading ClickHouse: the `weft_router_stats` aggregates (migration 0003) as a decayed
//! [`Snapshot`], and the logged decisions with their feedback for `weft eval`.

use std::collections::HashMap;

use clickhouse::{Client, Row};
use serde::Deserialize;

use crate::model::{ArmStats, Snapshot};

#[derive(Debug, Row, Deserialize)]
struct StatRow {
    tenant: String,
    context_key: String,
    candidate_id: String,
    n: f64,
    successes: f64,
    latency_n: f64,
    latency_sum: f64,
    latency_q: Vec<f64>,
    cost_sum: f64,
    quality_n: f64,
    quality_sum: f64,
}

/// Read every tenant's statistics over the last `window_s` seconds, each minute bucket
/// weighted by `2^(-age / half_life_s)` (no decay when `half_life_s` is 0). Latency
/// quantiles are over the window, undecayed.
pub async fn read_stats(
    client: &Client,
    source: &str,
    window_s: u64,
    half_life_s: f64,
) -> Result<Snapshot, clickhouse::error::Error> {
    let rows: Vec<StatRow> = client
        .query(
            "SELECT tenant, context_key, candidate_id,
                    sum(n * w) AS n, sum(successes * w) AS successes,
                    sum(latency_n * w) AS latency_n, sum(latency_sum * w) AS latency_sum,
                    quantilesMerge(0.5, 0.9, 0.99)(latency_q) AS latency_q,
                    sum(cost_sum * w) AS cost_sum,
                    sum(quality_n * w) AS quality_n, sum(quality_sum * w) AS quality_sum
             FROM (
                SELECT *, if(? > 0, exp2(-dateDiff('second', bucket, now()) / ?), 1.0) AS w
                FROM weft_router_stats
                WHERE bucket >= now() - toIntervalSecond(?)
             )
             GROUP BY tenant, context_key, candidate_id",
        )
        .bind(half_life_s)
        .bind(half_life_s.max(1e-9))
        .bind(window_s)
        .fetch_all()
        .await?;
    let mut snap = Snapshot::empty(source);
    snap.half_life_s = half_life_s;
    for r in rows {
        let q = (r.latency_n > 0.0
            && r.latency_q.len() == 3
            && r.latency_q.iter().all(|x| x.is_finite()))
        .then(|| [r.latency_q[0], r.latency_q[1], r.latency_q[2]]);
        snap.arms_mut(&r.tenant, &r.context_key).insert(
            r.candidate_id,
            ArmStats {
                n: r.n,
                successes: r.successes,
                latency_n: r.latency_n,
                latency_sum: r.latency_sum,
                latency_q: q,
                cost_sum: r.cost_sum,
                quality_n: r.quality_n,
                quality_sum: r.quality_sum,
            },
        );
    }
    Ok(snap)
}

/// One logged decision joined to its first feedback.
#[derive(Debug, Clone)]
pub struct LoggedPair {
    /// The `execution_routing_decision` payload.
    pub decision: serde_json::Value,
    /// The first stored `execution_feedback` payload answering it.
    pub feedback: serde_json::Value,
}

/// A tenant's logged decisions with `ts` in `[from_us, to_us)` (microseconds), each joined
/// to its feedback (the first one stored, if several), and the number of decisions that
/// have no feedback yet.
pub async fn read_logged(
    client: &Client,
    tenant: &str,
    from_us: i64,
    to_us: i64,
) -> Result<(Vec<LoggedPair>, usize), clickhouse::error::Error> {
    let decisions: Vec<(String, String)> = client
        .query(
            "SELECT id, payload FROM weft_events
             WHERE tenant = ? AND kind = 'execution_routing_decision' AND conflict = 0
               AND ts >= fromUnixTimestamp64Micro(?) AND ts < fromUnixTimestamp64Micro(?)
             ORDER BY ts, id",
        )
        .bind(tenant)
        .bind(from_us)
        .bind(to_us)
        .fetch_all()
        .await?;
    let feedback: Vec<(String, String)> = client
        .query(
            "SELECT JSONExtractString(payload, 'decision_id') AS d, payload FROM weft_events
             WHERE tenant = ? AND kind = 'execution_feedback' AND conflict = 0
               AND ts >= fromUnixTimestamp64Micro(?)
             ORDER BY ts, id",
        )
        .bind(tenant)
        .bind(from_us)
        .fetch_all()
        .await?;
    let mut fb: HashMap<String, String> = HashMap::new();
    for (d, p) in feedback {
        fb.entry(d).or_insert(p);
    }
    let mut out = Vec::new();
    let mut missing = 0;
    for (id, payload) in decisions {
        match fb.remove(&id) {
            Some(f) => {
                let (Ok(decision), Ok(feedback)) =
                    (serde_json::from_str(&payload), serde_json::from_str(&f))
                else {
                    continue;
                };
                out.push(LoggedPair { decision, feedback });
            }
            None => missing += 1,
        }
    }
    Ok((out, missing))
}

/// One stored feedback joined to its stored decision (same tenant).
#[derive(Debug, Row, Deserialize)]
pub struct OutcomeRow {
    /// Tenant of both rows.
    pub tenant: String,
    /// The feedback's identity (`weft_events.id`).
    pub feedback_id: String,
    /// When the pair became visible: the later of the two rows' `ingested_at` (µs).
    pub visible_us: i64,
    /// The decision's payload.
    pub decision: String,
    /// The feedback's payload.
    pub feedback: String,
}

/// Rows read per refresh at most; the next refresh continues from the last one read.
pub const OUTCOMES_PAGE: u64 = 200_000;

/// Feedback joined with its decision by (tenant, decision_id), for pairs after `after`
/// ((visibility µs, feedback id), exclusive) whose feedback was ingested in the last
/// `window_s` seconds, one row per feedback identity, in (visibility, id) order, at most
/// [`OUTCOMES_PAGE`].
pub async fn read_outcomes(
    client: &Client,
    after: (i64, &str),
    window_s: u64,
) -> Result<Vec<OutcomeRow>, clickhouse::error::Error> {
    client
        .query(
            "SELECT f.tenant AS tenant, f.id AS feedback_id,
                    toUnixTimestamp64Micro(greatest(f.ingested_at, d.ingested_at)) AS visible_us,
                    d.payload AS decision, f.payload AS feedback
             FROM (SELECT tenant, id, ingested_at, payload,
                          JSONExtractString(payload, 'decision_id') AS did
                   FROM weft_events
                   WHERE kind = 'execution_feedback' AND conflict = 0
                     AND ingested_at >= now64(6) - toIntervalSecond(?)) AS f
             INNER JOIN (SELECT tenant, id, ingested_at, payload FROM weft_events
                   WHERE kind = 'execution_routing_decision' AND conflict = 0
                     AND ingested_at >= now64(6) - toIntervalSecond(?)) AS d
               ON f.tenant = d.tenant AND f.did = d.id
             WHERE (visible_us, feedback_id) > (?, ?)
             ORDER BY visible_us, feedback_id
             LIMIT 1 BY feedback_id
             LIMIT ?",
        )
        .bind(window_s)
        .bind(window_s.saturating_mul(2))
        .bind(after.0)
        .bind(after.1)
        .bind(OUTCOMES_PAGE)
        .fetch_all()
        .await
}

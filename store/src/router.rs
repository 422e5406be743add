//! The router's reads: the `weft_router_stats` aggregates (migration 0003), and the logged
//! decisions with their feedback (`weft_events`), for the contextual model's refresh and
//! for `weft eval`. Every parameter is bound; nothing is spliced into the SQL.

use std::collections::HashMap;

use clickhouse::Row;
use serde::Deserialize;

use crate::{Store, StoreError};

/// One (tenant, context, candidate) cell of the aggregates, decayed over the window.
#[derive(Debug, Clone, PartialEq, Row, Deserialize)]
pub struct StatRow {
    /// Tenant.
    pub tenant: String,
    /// Context key (`x_weft_context`, else `intent`).
    pub context_key: String,
    /// Candidate id.
    pub candidate_id: String,
    /// Decisions with an outcome (decayed).
    pub n: f64,
    /// Successes (decayed).
    pub successes: f64,
    /// Outcomes with a latency (decayed).
    pub latency_n: f64,
    /// Sum of latencies, ms (decayed).
    pub latency_sum: f64,
    /// Latency p50, p90, p99 over the window (undecayed).
    pub latency_q: Vec<f64>,
    /// Sum of costs (decayed).
    pub cost_sum: f64,
    /// Outcomes with a quality score (decayed).
    pub quality_n: f64,
    /// Sum of quality scores (decayed).
    pub quality_sum: f64,
}

/// The aggregates over the last `{window_s}` seconds, each minute bucket weighted by
/// `2^(-age / half_life_s)` (no decay when `half_life_s` is 0; a bucket ahead of the clock
/// weighs 1, not more), at most `{max_cells}` per tenant, the most evidenced (largest
/// decayed `n`) first; `evidence` is the column `n` under another name, since `n` after the
/// `GROUP BY` is the alias of the sum. Binds half-life, half-life (as the divisor), window
/// and the cells per tenant.
pub const STATS_SQL: &str = "SELECT tenant, context_key, candidate_id,
        sum(n * w) AS n, sum(successes * w) AS successes,
        sum(latency_n * w) AS latency_n, sum(latency_sum * w) AS latency_sum,
        quantilesMerge(0.5, 0.9, 0.99)(latency_q) AS latency_q,
        sum(cost_sum * w) AS cost_sum,
        sum(quality_n * w) AS quality_n, sum(quality_sum * w) AS quality_sum
 FROM (
    SELECT *, n AS evidence, if(? > 0, least(1.0, exp2(-dateDiff('second', bucket, now()) / ?)), 1.0) AS w
    FROM weft_router_stats
    WHERE bucket >= now() - toIntervalSecond(?)
 )
 GROUP BY tenant, context_key, candidate_id
 ORDER BY tenant, sum(evidence * w) DESC, context_key, candidate_id
 LIMIT ? BY tenant";

/// Every tenant's aggregates over the last `window_s` seconds, at most `max_cells` per
/// tenant ([`STATS_SQL`]).
pub async fn read_stats(
    store: &Store,
    window_s: u64,
    half_life_s: f64,
    max_cells: u64,
) -> Result<Vec<StatRow>, StoreError> {
    store
        .client()
        .query(STATS_SQL)
        .bind(half_life_s)
        .bind(half_life_s.max(1e-9))
        .bind(window_s)
        .bind(max_cells.max(1))
        .fetch_all()
        .await
        .map_err(store.err())
}

/// One logged decision joined to its feedback.
#[derive(Debug, Clone)]
pub struct LoggedPair {
    /// The `execution_routing_decision` payload.
    pub decision: serde_json::Value,
    /// The stored `execution_feedback` payload answering it: the first that names the
    /// decision's choice, else the first (a fallback's, which evaluation sets aside).
    pub feedback: serde_json::Value,
}

const LOGGED_DECISIONS_SQL: &str =
    "SELECT id, JSONExtractString(payload, 'candidate', 'candidate_id') AS c, payload
 FROM weft_events
 WHERE tenant = ? AND kind = 'execution_routing_decision' AND conflict = 0
   AND ts >= fromUnixTimestamp64Micro(?) AND ts < fromUnixTimestamp64Micro(?)
 ORDER BY ts, id";

const LOGGED_FEEDBACK_SQL: &str = "SELECT JSONExtractString(payload, 'decision_id') AS d,
        JSONExtractString(payload, 'candidate_id') AS c, payload
 FROM weft_events
 WHERE tenant = ? AND kind = 'execution_feedback' AND conflict = 0
   AND ts >= fromUnixTimestamp64Micro(?)
 ORDER BY ts, id";

/// A tenant's logged decisions with `ts` in `[from_us, to_us)` (microseconds), each joined
/// to its feedback ([`LoggedPair::feedback`]), and the number of decisions that have no
/// feedback yet.
///
/// The choice's feedback wins over an earlier fallback's: when the choice fails and a
/// fallback runs, both answer the decision, in any order of their timestamps; keeping the
/// first would drop the choice's failures from evaluation, and so overrate the targets
/// that pick it.
pub async fn read_logged(
    store: &Store,
    tenant: &str,
    from_us: i64,
    to_us: i64,
) -> Result<(Vec<LoggedPair>, usize), StoreError> {
    let q = |sql| store.client().query(sql).bind(tenant).bind(from_us);
    let decisions: Vec<(String, String, String)> = q(LOGGED_DECISIONS_SQL)
        .bind(to_us)
        .fetch_all()
        .await
        .map_err(store.err())?;
    let feedback: Vec<(String, String, String)> = q(LOGGED_FEEDBACK_SQL)
        .fetch_all()
        .await
        .map_err(store.err())?;
    let chosen: HashMap<&str, &str> = decisions
        .iter()
        .map(|(id, c, _)| (id.as_str(), c.as_str()))
        .collect();
    // Per decision: its feedback so far, and whether that one names the choice.
    let mut fb: HashMap<String, (String, bool)> = HashMap::new();
    for (d, c, p) in feedback {
        let names_choice = chosen.get(d.as_str()) == Some(&c.as_str());
        match fb.get_mut(&d) {
            None => {
                fb.insert(d, (p, names_choice));
            }
            Some(kept) if !kept.1 && names_choice => *kept = (p, true),
            Some(_) => {}
        }
    }
    let mut out = Vec::new();
    let mut missing = 0;
    for (id, _, payload) in decisions {
        match fb.remove(&id) {
            Some((f, _)) => {
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

/// Rows of a page at most (the refresh's and the rebuild's); the next page continues from
/// the last row read.
pub const OUTCOMES_PAGE: u64 = 200_000;

/// The latest time a `DateTime64(6)` holds (2299-12-31 23:59:59.999999 UTC, µs): the upper
/// bound of a slice that has none.
const OPEN_US: i64 = 10_413_791_999_999_999;

/// The pieces of the pair query below (macros, so that `concat!` can join them into one
/// literal).
/// The pair's columns, from the feedback side `f` and the decision side `d`.
macro_rules! pair_columns {
    () => {
        "SELECT f.tenant AS tenant, f.id AS feedback_id,
        toUnixTimestamp64Micro(greatest(f.ingested_at, d.ingested_at)) AS visible_us,
        d.payload AS decision, f.payload AS feedback"
    };
}
/// Feedback ingested in the last `?` seconds, with the decision id it names, `and` more.
macro_rules! feedback_side {
    ($and:literal) => {
        concat!(
            " FROM (SELECT tenant, id, ingested_at, payload,
              JSONExtractString(payload, 'decision_id') AS did
       FROM weft_events
       WHERE kind = 'execution_feedback' AND conflict = 0
         AND ingested_at >= now64(6) - toIntervalSecond(?)",
            $and,
            ") AS f"
        )
    };
}
/// Decisions ingested in the last `?` seconds, `and` more, joined to the feedback naming them.
macro_rules! decision_side {
    ($and:literal) => {
        concat!(
            " INNER JOIN (SELECT tenant, id, ingested_at, payload FROM weft_events
       WHERE kind = 'execution_routing_decision' AND conflict = 0
         AND ingested_at >= now64(6) - toIntervalSecond(?)",
            $and,
            ") AS d
   ON f.tenant = d.tenant AND f.did = d.id"
        )
    };
}
/// After the cursor `(?, ?)`, in its order, one row per feedback identity, a page of `?`.
macro_rules! after_cursor {
    () => {
        "
 WHERE (visible_us, feedback_id) > (?, ?)
 ORDER BY visible_us, feedback_id
 LIMIT 1 BY feedback_id
 LIMIT ?"
    };
}

/// The pairs (feedback joined with its decision by tenant and decision id) made visible in
/// the slice of time `[c, u)`, after a cursor, in its order: the refresh's incremental read
/// (`u` open) and a rebuild's pages (`u` ahead of the cursor, [`read_outcomes`]).
///
/// A pair is visible at the later of its two rows' `ingested_at`, so it falls in the slice
/// when (A) its feedback was ingested in it and its decision before `u` (found by id among
/// the slice's feedback's decision ids), or (B) its decision was ingested in it and its
/// feedback before `c`. Each half reads the payloads of its slice only. (B)'s feedback is
/// found from the slice's decisions through the `links` column (ingest writes the
/// feedback's decision id there, `weft_schemas::links`), scanned without the payloads; a
/// row without that link (not written by ingest) is read whole and joined by its payload.
/// Before, a rebuild's page joined the whole window, payloads included, then applied the
/// cursor and the limit: 3.2-7.3 s a page with 1M pairs stored, so a rebuild cost
/// O(pages x window) and past ~13M pairs one page outlasted the refresh's budget
/// (docs/ROUTER.md). Binds `c` and `u` (µs), then the window (s) and twice the window for
/// each half, the cursor (visibility µs, feedback id) and the page size.
pub const OUTCOMES_SQL: &str = concat!(
    "WITH fromUnixTimestamp64Micro(?, 'UTC') AS c, fromUnixTimestamp64Micro(?, 'UTC') AS u
SELECT tenant, feedback_id, visible_us, decision, feedback FROM (",
    pair_columns!(),
    feedback_side!(" AND ingested_at >= c AND ingested_at < u"),
    decision_side!(
        " AND ingested_at < u
         AND id IN (SELECT JSONExtractString(payload, 'decision_id') FROM weft_events
                    WHERE kind = 'execution_feedback' AND conflict = 0
                      AND ingested_at >= c AND ingested_at < u)"
    ),
    "
 UNION ALL ",
    pair_columns!(),
    feedback_side!(
        " AND ingested_at < c
         AND ((links.3[indexOf(links.1, 'feedback_decision_id')] AS linked) = ''
              OR linked IN (SELECT id FROM weft_events
                            WHERE kind = 'execution_routing_decision' AND conflict = 0
                              AND ingested_at >= c AND ingested_at < u))"
    ),
    decision_side!(" AND ingested_at >= c AND ingested_at < u"),
    ")",
    after_cursor!()
);

/// Feedback joined with its decision by (tenant, decision_id), one row per feedback
/// identity, in (visibility, id) order, at most `page` rows: the pairs after `after`
/// ((visibility µs, feedback id), exclusive) and visible before `until` (µs, exclusive;
/// `None`: no bound), whose feedback was ingested in the last `window_s` seconds
/// ([`OUTCOMES_SQL`]). Fewer than `page` rows: every such pair was read.
pub async fn read_outcomes(
    store: &Store,
    after: (i64, &str),
    until: Option<i64>,
    window_s: u64,
    page: u64,
) -> Result<Vec<OutcomeRow>, StoreError> {
    store
        .client()
        .query(OUTCOMES_SQL)
        .bind(after.0)
        .bind(until.map_or(OPEN_US, |u| u.min(OPEN_US)))
        .bind(window_s)
        .bind(window_s.saturating_mul(2))
        .bind(window_s)
        .bind(window_s.saturating_mul(2))
        .bind(after.0)
        .bind(after.1)
        .bind(page)
        .fetch_all()
        .await
        .map_err(store.err())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::search::tests::selected;

    #[test]
    fn the_queries_select_their_rows_columns() {
        assert_eq!(selected(STATS_SQL), StatRow::COLUMN_NAMES);
        assert_eq!(selected(OUTCOMES_SQL), OutcomeRow::COLUMN_NAMES);
        assert_eq!(selected(LOGGED_FEEDBACK_SQL), ["d", "c", "payload"]);
        assert_eq!(selected(LOGGED_DECISIONS_SQL), ["id", "c", "payload"]);
    }
}

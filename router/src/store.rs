//! Reading ClickHouse through `weft-store` (whose `router` module holds the rows and the
//! SQL): the `weft_router_stats` aggregates as a decayed [`Snapshot`], and the logged
//! decisions with their feedback for the refresh and `weft eval`.

pub use weft_store::router::{
    read_logged, read_outcomes, LoggedPair, OutcomeRow, StatRow, OUTCOMES_PAGE,
};
use weft_store::{Store, StoreError};

use crate::model::{ArmStats, Snapshot};

/// Read every tenant's statistics over the last `window_s` seconds, each minute bucket
/// weighted by `2^(-age / half_life_s)` (no decay when `half_life_s` is 0). Latency
/// quantiles are over the window, undecayed. At most `max_cells` (context, candidate) cells
/// per tenant, the most evidenced: past them a tenant's other cells are not read, and their
/// candidates are estimated from the priors (a tenant naming new contexts or candidates
/// without end cannot grow the snapshot).
pub async fn read_stats(
    store: &Store,
    source: &str,
    window_s: u64,
    half_life_s: f64,
    max_cells: u64,
) -> Result<Snapshot, StoreError> {
    let rows = weft_store::router::read_stats(store, window_s, half_life_s, max_cells).await?;
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

/// (context, candidate) cells of the aggregates read per tenant at most, by default.
pub const DEFAULT_MAX_CELLS: u64 = 50_000;

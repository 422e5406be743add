//! Members that leave a narrative: a tombstone in the one they leave, and a copy of their
//! row (payload included) in the one they join.

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::borrow::Cow;
use std::sync::Arc;

use tracing::instrument;
use weft_store::ids::{chunks_by_bytes, MAX_PARAM_BYTES};
use weft_store::narrative::NarrativeRow;
use weft_store::{Store, StoreError};

use super::graph::{Change, Graph};

/// Per tenant: the (narrative left, id) pairs, and where each (kind, id) goes.
type Moves = (
    HashSet<(String, String)>,
    HashMap<(String, String), Arc<str>>,
);

/// For every node that left a narrative: a tombstone there, and its rows copied to the
/// new one, pushed to `out` with `version`. Returns how many nodes moved.
///
/// Only the movers' rows are read (with their payloads, which the copies carry): the query
/// names the narratives they leave and their ids, so ClickHouse reads the few granules that
/// hold them, not every member of a large narrative they leave.
pub(super) async fn move_rows(
    store: &Store,
    graph: &Graph,
    changes: &[Change],
    version: u64,
    out: &mut Vec<NarrativeRow<Cow<'_, str>>>,
) -> Result<usize, StoreError> {
    let mut by_tenant: HashMap<Arc<str>, Moves> = HashMap::default();
    for c in changes {
        let Some(old) = &c.old else { continue };
        let key = graph.key(c.node);
        let e = by_tenant.entry(key.tenant.clone()).or_default();
        e.0.insert((old.to_string(), key.id.to_string()));
        e.1.insert(
            (key.kind.as_str().to_owned(), key.id.to_string()),
            c.new.clone(),
        );
    }
    let mut moved = 0;
    for (tenant, (pairs, targets)) in by_tenant {
        for r in moving_rows(store, &tenant, pairs).await? {
            if r.is_deleted == 1 {
                continue;
            }
            // The ids are matched without their kind: a row of another kind stays.
            let Some(new) = targets.get(&(r.kind.clone(), r.id.clone())) else {
                continue;
            };
            if r.narrative_id == **new {
                continue;
            }
            moved += 1;
            let r = r.into_cow();
            out.push(NarrativeRow {
                version,
                is_deleted: 1,
                ..r.clone()
            });
            out.push(NarrativeRow {
                narrative_id: Cow::Owned(new.to_string()),
                version,
                ..r
            });
        }
    }
    Ok(moved)
}

/// The newest version of every member row of `tenant` in a narrative it leaves, for each
/// (narrative, id) of `pairs`. `weft_narratives` is ordered by (tenant, narrative_id, kind,
/// id, ...): each query names its pairs' narratives and ids as lists too, so ClickHouse
/// reads the granules that hold them. One query per chunk of pairs: asking every chunk of
/// narratives with every chunk of ids, as before, grew with the square of a large move.
#[instrument(skip_all, fields(%tenant, pairs = pairs.len()))]
async fn moving_rows(
    store: &Store,
    tenant: &str,
    pairs: HashSet<(String, String)>,
) -> Result<Vec<NarrativeRow>, StoreError> {
    let mut rows: Vec<NarrativeRow> = Vec::new();
    // A large pass can move thousands of members; ClickHouse caps one query parameter
    // (http_max_field_value_size, 128 KiB by default), so ask in chunks.
    for chunk in chunks_by_bytes(pairs, MAX_PARAM_BYTES) {
        let olds: HashSet<&str> = chunk.iter().map(|(n, _)| n.as_str()).collect();
        let ids: HashSet<&str> = chunk.iter().map(|(_, id)| id.as_str()).collect();
        let mut part: Vec<NarrativeRow> = store
            .client()
            .query(
                "SELECT tenant, narrative_id, kind, id, content_hash, \
                        argMax(ts, version) AS ts, argMax(request_id, version) AS request_id, \
                        argMax(payload, version) AS payload, max(version) AS version, \
                        argMax(is_deleted, version) AS is_deleted \
                 FROM weft_narratives \
                 WHERE tenant = {t:String} AND narrative_id IN {olds:Array(String)} \
                   AND id IN {ids:Array(String)} \
                   AND (narrative_id, id) IN {pairs:Array(Tuple(String, String))} \
                 GROUP BY tenant, narrative_id, kind, id, content_hash",
            )
            .param("t", tenant)
            .param("olds", olds.into_iter().collect::<Vec<_>>())
            .param("ids", ids.into_iter().collect::<Vec<_>>())
            .param("pairs", &chunk)
            .fetch_all()
            .await
            .map_err(store.err())?;
        rows.append(&mut part);
    }
    Ok(rows)
}

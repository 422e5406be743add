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

/// Per tenant: the narratives nodes leave, and where each (kind, id) goes.
type Moves = (HashSet<String>, HashMap<(String, String), Arc<str>>);

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
        e.0.insert(old.to_string());
        e.1.insert(
            (key.kind.as_str().to_owned(), key.id.to_string()),
            c.new.clone(),
        );
    }
    let mut moved = 0;
    for (tenant, (olds, targets)) in by_tenant {
        let ids: HashSet<&String> = targets.keys().map(|(_, id)| id).collect();
        let ids = ids.into_iter().cloned().collect();
        for r in moving_rows(store, &tenant, olds, ids).await? {
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

/// The newest version of every member row of `tenant` in one of the narratives `olds` whose
/// id is one of `ids`. `weft_narratives` is ordered by (tenant, narrative_id, kind, id, ...),
/// so the two lists together narrow the granules read to the movers'.
#[instrument(skip_all, fields(%tenant, narratives = olds.len(), ids = ids.len()))]
async fn moving_rows(
    store: &Store,
    tenant: &str,
    olds: HashSet<String>,
    ids: Vec<String>,
) -> Result<Vec<NarrativeRow>, StoreError> {
    let mut rows: Vec<NarrativeRow> = Vec::new();
    // A large pass can move thousands of members; ClickHouse caps one query parameter
    // (http_max_field_value_size, 128 KiB by default), so ask in chunks of each list.
    let id_chunks = chunks_by_bytes(ids, MAX_PARAM_BYTES);
    for olds in chunks_by_bytes(olds.into_iter().collect(), MAX_PARAM_BYTES) {
        for ids in &id_chunks {
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
                     GROUP BY tenant, narrative_id, kind, id, content_hash",
                )
                .param("t", tenant)
                .param("olds", &olds)
                .param("ids", ids)
                .fetch_all()
                .await
                .map_err(store.err())?;
            rows.append(&mut part);
        }
    }
    Ok(rows)
}

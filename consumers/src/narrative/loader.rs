//! Loading evicted components back into the [`Graph`] from ClickHouse.
//!
//! Before a pass settles, every id it names must be in memory or new (the graph's
//! invariant). The ids that are not in memory are looked up together: their node rows
//! (`weft_narrative_nodes`) and their links from both ends (`weft_links` by target,
//! `weft_links_from` by source). A found id that is uncolored (a phantom, a flow, or an event
//! without a request id) brings its neighbors, round after round, until the uncolored
//! component and the colored nodes around it are all here; an id found nowhere is new. One
//! round is three queries per tenant, whatever the number of ids.

use std::collections::{HashMap, HashSet};

use tracing::{debug, instrument};
use weft_schemas::links::{self, NodeKind, Via};

use super::graph::{Graph, NodeKey, Stored};
use weft_store::ids::{chunks_by_bytes, MAX_PARAM_BYTES};
use weft_store::narrative::{LinkRow, NodeRow};
use weft_store::{Store, StoreError};

/// What one [`load`] did.
#[derive(Debug, Default, Clone, Copy)]
pub struct LoadStats {
    /// Ids looked up (every round's).
    pub looked_up: usize,
    /// Nodes that came back into memory.
    pub loaded: usize,
    /// Lookup rounds (0 when every id was in memory).
    pub rounds: usize,
}

/// Load the components of `keys` (those [`Graph::needs_load`] names) into `graph`.
#[instrument(skip_all, fields(keys = keys.len()))]
pub async fn load(
    store: &Store,
    graph: &mut Graph,
    keys: Vec<NodeKey>,
) -> Result<LoadStats, StoreError> {
    let mut stats = LoadStats::default();
    let mut pending: Vec<NodeKey> = dedup(keys);
    while !pending.is_empty() {
        stats.rounds += 1;
        stats.looked_up += pending.len();
        let found = fetch(store, graph, &pending, true).await?;
        // Every pending node first, so links among them are not taken for new peers.
        let idx: Vec<_> = pending
            .iter()
            .map(|k| {
                let row = found.nodes.get(k);
                if row.is_some() || found.links.contains_key(k) {
                    stats.loaded += 1;
                }
                let stored = row.map(|r| Stored {
                    request_id: &r.request_id,
                    narrative: &r.narrative_id,
                    ts: r.ts,
                });
                graph.load_node(k.clone(), stored)
            })
            .collect();
        let mut next = Vec::new();
        for (k, n) in pending.iter().zip(idx) {
            // A colored node's narrative is its own: its other links need not come.
            if graph.is_colored(n) {
                continue;
            }
            for (peer, via) in found.links.get(k).into_iter().flatten() {
                if let Some(p) = graph.load_link(n, peer.clone(), *via) {
                    next.push(graph.key(p).clone());
                }
            }
            graph.set_complete(n);
        }
        pending = dedup(next);
    }
    if stats.rounds > 0 {
        debug!(?stats, "narrative components loaded");
    }
    Ok(stats)
}

/// Of `keys`, those with a stored node row (one query per tenant and chunk of ids; no
/// links, nothing brought into memory).
#[instrument(skip_all, fields(keys = keys.len()))]
pub async fn stored(
    store: &Store,
    graph: &mut Graph,
    keys: Vec<NodeKey>,
) -> Result<Vec<NodeKey>, StoreError> {
    let found = fetch(store, graph, &dedup(keys), false).await?;
    Ok(found.nodes.into_keys().collect())
}

fn dedup(keys: Vec<NodeKey>) -> Vec<NodeKey> {
    let mut seen = HashSet::new();
    keys.into_iter()
        .filter(|k| seen.insert(k.clone()))
        .collect()
}

/// What storage knows of one round's ids.
#[derive(Default)]
struct Found {
    nodes: HashMap<NodeKey, NodeRow>,
    links: HashMap<NodeKey, Vec<(NodeKey, Via)>>,
}

/// The node rows of `keys`, and their links from both ends when `links`.
async fn fetch(
    store: &Store,
    graph: &mut Graph,
    keys: &[NodeKey],
    links: bool,
) -> Result<Found, StoreError> {
    let wanted: HashSet<&NodeKey> = keys.iter().collect();
    let mut by_tenant: HashMap<&str, Vec<String>> = HashMap::new();
    for k in keys {
        by_tenant
            .entry(&k.tenant)
            .or_default()
            .push(k.id.to_string());
    }
    let mut found = Found::default();
    for (tenant, ids) in by_tenant {
        let ids: Vec<String> = ids
            .into_iter()
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        for chunk in chunks_by_bytes(ids, MAX_PARAM_BYTES) {
            for r in query_nodes(store, tenant, &chunk).await? {
                let Some(kind) = NodeKind::parse(&r.kind) else {
                    continue;
                };
                let key = graph.node_key(&r.tenant, kind, &r.id);
                if wanted.contains(&key) {
                    found.nodes.insert(key, r);
                }
            }
            if !links {
                continue;
            }
            for r in query_links(store, tenant, &chunk).await? {
                let (Some(fk), Some(tk), Some(via)) = (
                    NodeKind::parse(&r.from_kind),
                    NodeKind::parse(&r.to_kind),
                    Via::parse(&r.via),
                ) else {
                    continue;
                };
                let from = graph.node_key(&r.tenant, fk, &r.from_id);
                let to = graph.node_key(&r.tenant, tk, &r.to_id);
                for (end, peer) in [(&from, &to), (&to, &from)] {
                    if wanted.contains(end) {
                        found
                            .links
                            .entry(end.clone())
                            .or_default()
                            .push((peer.clone(), via));
                    }
                }
            }
        }
    }
    Ok(found)
}

/// The stored node rows of `ids` of `tenant` (any kind), one per node, with the smallest
/// request id of its rows: node rows carry the node's color, which only ever gets smaller
/// (`Graph::add_event`), so that is the color whether or not older rows are merged away.
pub(super) async fn query_nodes(
    store: &Store,
    tenant: &str,
    ids: &[String],
) -> Result<Vec<NodeRow>, StoreError> {
    store
        .client()
        .query(
            "SELECT tenant, kind, id, argMax(narrative_id, version) AS narrative_id, \
                    minIf(request_id, request_id != '') AS request_id, \
                    argMax(ts, version) AS ts, \
                    max(version) AS version \
             FROM weft_narrative_nodes WHERE tenant = {t:String} AND id IN {ids:Array(String)} \
             GROUP BY tenant, kind, id",
        )
        .param("t", tenant)
        .param("ids", ids)
        .fetch_all()
        .await
        .map_err(store.err())
}

/// The links of `ids` from both ends (a link between two of them comes twice; the graph
/// keeps one).
async fn query_links(
    store: &Store,
    tenant: &str,
    ids: &[String],
) -> Result<Vec<LinkRow>, StoreError> {
    store
        .client()
        .query(
            "SELECT DISTINCT tenant, to_kind, to_id, from_kind, from_id, via FROM weft_links \
             WHERE tenant = {t:String} AND to_id IN {ids:Array(String)} \
             UNION ALL \
             SELECT DISTINCT tenant, to_kind, to_id, from_kind, from_id, via FROM weft_links_from \
             WHERE tenant = {t:String} AND from_id IN {ids:Array(String)}",
        )
        .param("t", tenant)
        .param("ids", ids)
        .fetch_all()
        .await
        .map_err(store.err())
}

/// Every node next to the stored event `key`, which is in memory: the events linking to it
/// (`weft_links`) and what its stored versions link to, read from their member rows in its
/// current narrative (a colored event's own links are not indexed by source). Asked before
/// `key` takes a smaller request id ([`Graph::would_recolor`]): loading these brings every
/// uncolored component around it, so that the recolored node's settle reaches all of them.
#[instrument(skip_all)]
pub(super) async fn around(
    store: &Store,
    graph: &mut Graph,
    key: &NodeKey,
) -> Result<Vec<NodeKey>, StoreError> {
    let NodeKind::Event(kind) = key.kind else {
        return Ok(Vec::new());
    };
    let narrative = graph
        .lookup(key)
        .and_then(|n| graph.assigned(n))
        .map(|a| a.to_string())
        .unwrap_or_default();
    let c = store.client();
    let incoming = c
        .query(
            "SELECT DISTINCT from_kind, from_id FROM weft_links \
             WHERE tenant = {t:String} AND to_id = {id:String} AND to_kind = {k:String}",
        )
        .param("t", &*key.tenant)
        .param("id", &*key.id)
        .param("k", kind.as_str())
        .fetch_all::<(String, String)>();
    let versions = c
        .query(
            "SELECT DISTINCT payload FROM weft_narratives \
             WHERE tenant = {t:String} AND narrative_id = {n:String} \
               AND kind = {k:String} AND id = {id:String}",
        )
        .param("t", &*key.tenant)
        .param("n", &narrative)
        .param("k", kind.as_str())
        .param("id", &*key.id)
        .fetch_all::<String>();
    let (incoming, versions) = tokio::try_join!(incoming, versions).map_err(store.err())?;
    let mut out: Vec<NodeKey> = incoming
        .into_iter()
        .filter_map(|(k, id)| Some(graph.node_key(&key.tenant, NodeKind::parse(&k)?, &id)))
        .collect();
    for payload in versions {
        // Stored by the projector from a validated fact; one that does not parse names nothing.
        let Ok(value) = serde_json::from_str(&payload) else {
            continue;
        };
        for l in links::extract(kind, &value) {
            out.push(graph.node_key(&key.tenant, l.to_kind, &l.to_id));
        }
    }
    Ok(out)
}

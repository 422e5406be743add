//! `weft rebuild`: recompute every narrative from the stored facts.
//!
//! Narratives are a projection; this proves it. The facts are read twice (links first,
//! payloads second, so payloads never all sit in memory), the same [`Graph`] rule assigns
//! every event, and the narrative tables are rewritten. Run it with ingest stopped: the
//! tables are emptied first.

use std::collections::{HashMap, HashSet};

use clickhouse::Row;
use serde::{Deserialize, Serialize};
use tracing::info;
use weft_schemas::links::{Link, NodeKind, Via};
use weft_schemas::Kind;

use super::graph::{Graph, NodeIdx, NodeKey};
use super::projector::VersionClock;
use super::shard::NarrativeShard;
use weft_store::narrative::{LinkRow, NarrativeRow, NodeRow, ProgressRow};
use weft_store::{insert, insert_native, Store, StoreError};

const CHUNK: usize = 50_000;

#[derive(Debug, Row, Deserialize)]
struct FactLinks {
    tenant: String,
    kind: String,
    id: String,
    request_id: String,
    ts: i64,
    links: Vec<(String, String, String)>,
    topic: String,
    partition: u32,
    offset: u64,
}

#[derive(Debug, Row, Deserialize)]
struct FactPayload {
    tenant: String,
    kind: String,
    id: String,
    content_hash: [u8; 32],
    ts: i64,
    request_id: String,
    payload: String,
}

/// What a rebuild did.
#[derive(Debug, Default, Clone, Serialize)]
pub struct RebuildStats {
    /// Facts read from `weft_events`.
    pub facts: usize,
    /// Distinct (tenant, narrative) pairs written.
    pub narratives: usize,
    /// Rows written to `weft_links`.
    pub links: usize,
}

fn parse_link(via: &str, kind: &str, id: &str) -> Option<Link> {
    Some(Link {
        via: Via::parse(via)?,
        to_kind: NodeKind::parse(kind)?,
        to_id: id.to_owned(),
    })
}

/// Rebuild all narratives from `weft_events`, with progress rows for `shards` narrative
/// shards (`0/N` .. `N-1/N`; one, unsharded, when `shards` is 1), so that the processes of
/// that many shards resume after the facts rebuilt.
pub async fn rebuild(store: &Store, shards: u32) -> Result<RebuildStats, StoreError> {
    for table in TABLES {
        store
            .client()
            .query(&format!("TRUNCATE TABLE IF EXISTS {table}"))
            .execute()
            .await
            .map_err(store.err())?;
    }
    let version = VersionClock::default().tick();
    let mut graph = Graph::new();
    let mut stats = RebuildStats::default();
    let progress = read_links(store, &mut graph, &mut stats).await?;
    graph.settle_all();
    stats.narratives = write_narratives(store, &graph, version).await?;
    write_nodes(store, &graph, version).await?;
    let labels = NarrativeShard::labels(shards);
    let progress: Vec<ProgressRow> = progress
        .into_iter()
        .flat_map(|((topic, partition), offset)| {
            labels.iter().map(move |shard| ProgressRow {
                topic: topic.clone(),
                partition,
                offset,
                version,
                shard: shard.clone(),
            })
        })
        .collect();
    insert::<ProgressRow>(store, "weft_projector_progress", &progress).await?;
    info!(?stats, "narratives rebuilt");
    Ok(stats)
}

/// The tables a rebuild rewrites.
const TABLES: [&str; 5] = [
    "weft_narratives",
    "weft_narrative_nodes",
    "weft_links",
    "weft_links_from",
    "weft_projector_progress",
];

/// First read: every fact's links into the graph and `weft_links` (and, for facts without a
/// request id, `weft_links_from`: a node with one is its own anchor, so the loader never
/// follows its own links); returns the highest offset of each source partition.
async fn read_links(
    store: &Store,
    graph: &mut Graph,
    stats: &mut RebuildStats,
) -> Result<HashMap<(String, u32), i64>, StoreError> {
    let mut progress: HashMap<(String, u32), i64> = HashMap::new();
    let mut link_rows = Vec::with_capacity(CHUNK);
    let mut from_rows = Vec::new();
    let mut cursor = store
        .client()
        .query("SELECT tenant, kind, id, request_id, ts, links, topic, partition, offset FROM weft_events")
        .fetch::<FactLinks>()
        .map_err(store.err())?;
    while let Some(f) = cursor.next().await.map_err(store.err())? {
        let Ok(kind) = f.kind.parse::<Kind>() else {
            continue;
        };
        let links: Vec<Link> = f
            .links
            .iter()
            .filter_map(|(v, k, i)| parse_link(v, k, i))
            .collect();
        let key = graph.node_key(&f.tenant, NodeKind::Event(kind), &f.id);
        graph.add_event(key, &f.request_id, f.ts, &links);
        for l in &links {
            let row = LinkRow {
                tenant: f.tenant.clone(),
                to_kind: l.to_kind.as_str().to_owned(),
                to_id: l.to_id.clone(),
                from_kind: f.kind.clone(),
                from_id: f.id.clone(),
                via: l.via.as_str().to_owned(),
            };
            if f.request_id.is_empty() {
                from_rows.push(row.clone());
            }
            link_rows.push(row);
        }
        if link_rows.len() >= CHUNK {
            stats.links += link_rows.len();
            insert_native(store, "weft_links", &link_rows).await?;
            insert_native(store, "weft_links_from", &from_rows).await?;
            link_rows.clear();
            from_rows.clear();
        }
        let p = progress.entry((f.topic, f.partition)).or_insert(-1);
        *p = (*p).max(f.offset as i64);
        stats.facts += 1;
    }
    stats.links += link_rows.len();
    insert_native(store, "weft_links", &link_rows).await?;
    insert_native(store, "weft_links_from", &from_rows).await?;
    Ok(progress)
}

/// Second read: every fact's payload into its narrative; returns the number of distinct
/// (tenant, narrative) pairs.
async fn write_narratives(store: &Store, graph: &Graph, version: u64) -> Result<usize, StoreError> {
    let mut rows = Vec::with_capacity(CHUNK);
    let mut narratives = HashSet::new();
    let mut cursor = store
        .client()
        .query("SELECT tenant, kind, id, content_hash, ts, request_id, payload FROM weft_events")
        .fetch::<FactPayload>()
        .map_err(store.err())?;
    while let Some(f) = cursor.next().await.map_err(store.err())? {
        let Ok(kind) = f.kind.parse::<Kind>() else {
            continue;
        };
        let key = NodeKey::event(&f.tenant, kind, &f.id);
        let Some(nid) = graph.lookup(&key).and_then(|n| graph.assigned(n)) else {
            continue;
        };
        narratives.insert((f.tenant.clone(), nid.clone()));
        rows.push(NarrativeRow {
            tenant: f.tenant,
            narrative_id: nid.to_string(),
            kind: f.kind,
            id: f.id,
            content_hash: f.content_hash,
            ts: f.ts,
            request_id: f.request_id,
            payload: f.payload,
            version,
            is_deleted: 0,
        });
        if rows.len() >= CHUNK {
            insert_native(store, "weft_narratives", &rows).await?;
            rows.clear();
        }
    }
    insert_native(store, "weft_narratives", &rows).await?;
    Ok(narratives.len())
}

/// Every arrived event's place, from the graph.
async fn write_nodes(store: &Store, graph: &Graph, version: u64) -> Result<(), StoreError> {
    let mut nodes = Vec::with_capacity(CHUNK);
    for n in 0..graph.len() as NodeIdx {
        let Some(nid) = graph.assigned(n).filter(|_| graph.is_present(n)) else {
            continue;
        };
        let key = graph.key(n);
        nodes.push(NodeRow {
            tenant: key.tenant.to_string(),
            kind: key.kind.as_str().to_owned(),
            id: key.id.to_string(),
            narrative_id: nid.to_string(),
            request_id: graph
                .request_id(n)
                .map(|r| r.to_string())
                .unwrap_or_default(),
            ts: graph.ts(n),
            version,
        });
        if nodes.len() >= CHUNK {
            insert_native(store, "weft_narrative_nodes", &nodes).await?;
            nodes.clear();
        }
    }
    insert_native(store, "weft_narrative_nodes", &nodes).await
}

//! Reading a narrative: `weft narrative ID` and `GET /v1/narratives/{id}`.
//!
//! Every input reaches ClickHouse as a server-side query parameter, and every query is scoped
//! to one tenant, so an id guessed across tenants finds nothing.

use std::collections::{BTreeSet, HashMap, HashSet};

use clickhouse::Row;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use weft_schemas::links::{self, NodeKind};
use weft_schemas::{time, Kind};

use crate::{Store, StoreError};

/// One event of a narrative.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// Event kind.
    pub kind: String,
    /// The event's identity.
    pub id: String,
    /// The event's own time, RFC 3339.
    pub timestamp: String,
    /// The producer's payload.
    pub payload: Value,
}

/// A node reference in a link.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NodeRef {
    /// Event kind, or `flow`.
    pub kind: String,
    /// The event's identity, or the flow id.
    pub id: String,
}

/// A link between two members of the narrative.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct LinkView {
    /// The member holding the link.
    pub from: NodeRef,
    /// The member it points at.
    pub to: NodeRef,
    /// The payload field the link comes from (decision, frame, token...).
    pub via: String,
}

/// A narrative as the CLI and the API return it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Narrative {
    /// The narrative's id: a request id, or `adhoc:<kind>:<id>`.
    pub narrative_id: String,
    /// The narrative id when a member carries it as its request id; `None` for ad hoc ones.
    pub request_id: Option<String>,
    /// Members in timestamp order (ties by kind, then id): all of them, or the first of a
    /// lookup bounded by [`lookup_at_most`].
    pub entries: Vec<Entry>,
    /// How many members the narrative has; more than `entries` holds when a bounded lookup
    /// cut it. Links and related narratives are those of the entries given.
    #[serde(default)]
    pub members_total: u64,
    /// Links whose both ends are members.
    pub links: Vec<LinkView>,
    /// Other narratives that a member links to, or that link to a member: those of the first
    /// [`RELATED_IDS_AT_MOST`] such ids (sorted), when `related_cut` says there are more.
    pub related: Vec<String>,
    /// More ids outside link to or from the members than a read follows (a token cited by a
    /// million other requests, say): `related` is then a part of them.
    #[serde(default)]
    pub related_cut: bool,
}

/// The payload fields a text rendering shows for each entry, in this order.
const TEXT_DETAIL: [&str; 6] = [
    "event_type",
    "decision",
    "outcome",
    "capability_id",
    "principal",
    "token_id",
];

impl Narrative {
    /// The narrative as terminal text: a header, one line per event (time, kind, id and the
    /// [`TEXT_DETAIL`] fields it has), the links, then related narratives. Used by
    /// `weft narrative` and `weft audit timeline` alike.
    pub fn to_text(&self) -> String {
        use std::fmt::Write;
        let shown = self.entries.len() as u64;
        let mut out = format!(
            "narrative {}{}: {} events{}, {} links\n",
            self.narrative_id,
            self.request_id
                .as_deref()
                .map(|r| format!(" (request {r})"))
                .unwrap_or_default(),
            shown,
            if self.members_total > shown {
                format!(" (the first of {})", self.members_total)
            } else {
                String::new()
            },
            self.links.len()
        );
        for e in &self.entries {
            let detail: Vec<String> = TEXT_DETAIL
                .iter()
                .filter_map(|k| Some(format!("{k}={}", e.payload.get(*k)?.as_str()?)))
                .collect();
            let _ = writeln!(
                out,
                "  {}  {:<26} {:<36} {}",
                e.timestamp,
                e.kind,
                e.id,
                detail.join(" ")
            );
        }
        for l in &self.links {
            let _ = writeln!(
                out,
                "  link {}:{} --{}--> {}:{}",
                l.from.kind, l.from.id, l.via, l.to.kind, l.to.id
            );
        }
        if !self.related.is_empty() {
            let more = if self.related_cut { " (and more)" } else { "" };
            let _ = writeln!(out, "  related{more}: {}", self.related.join(", "));
        }
        out
    }
}

#[derive(Debug, Row, Deserialize)]
struct MemberRow {
    kind: String,
    id: String,
    ts: i64,
    request_id: String,
    payload: String,
    total: u64,
}

/// The most ids outside a narrative, linked to or from its members, whose narratives a read
/// names in [`Narrative::related`]: the read's work stays bounded however many events cite
/// one of its members.
pub const RELATED_IDS_AT_MOST: usize = 1_000;

/// The most links into a narrative's members from outside that one query returns.
pub const INCOMING_AT_MOST: u64 = 10_000;

/// The most ids one `IN` list names: each may select a granule of its own (8,192 rows), so
/// that 512 of them stay under the HTTP APIs' 5M-row read limit whatever the table's size.
const IDS_PER_QUERY: usize = 512;

/// The most members a narrative read by the HTTP APIs holds (`GET /v1/narratives/{id}`, the
/// audit timeline); a bundle of a larger narrative is refused.
pub const API_MAX_MEMBERS: u64 = 10_000;

#[derive(Debug, Row, Deserialize)]
struct NodeNarrative {
    kind: String,
    id: String,
    narrative_id: String,
}

#[derive(Debug, Row, Deserialize)]
struct InLink {
    from_kind: String,
    from_id: String,
    to_kind: String,
    to_id: String,
}

/// A narrative's stored rows: every version of every member.
const ROW_COUNT: &str =
    "SELECT count() FROM weft_narratives WHERE tenant = {t:String} AND narrative_id = {n:String}";

/// The narrative that contains `id` (a request id, a narrative id, or any member's id).
///
/// Both readings are asked at once: a narrative id wins, and a member's id costs no second
/// round trip (measured at 10M events: a member lookup's p99 fell by about the 7 ms of one).
/// The price: a lookup by narrative id also runs the (light, primary-key) member query, and
/// fails if that query fails.
pub async fn resolve(store: &Store, tenant: &str, id: &str) -> Result<Option<String>, StoreError> {
    Ok(resolve_counted(store, tenant, id)
        .await?
        .map(|(nid, _)| nid))
}

/// [`resolve`], with the narrative's stored row count (every version of every member) when
/// `id` is the narrative's own id: the first reading counts it anyway.
async fn resolve_counted(
    store: &Store,
    tenant: &str,
    id: &str,
) -> Result<Option<(String, Option<u64>)>, StoreError> {
    let c = store.client();
    let direct = c
        .query(ROW_COUNT)
        .param("t", tenant)
        .param("n", id)
        .fetch_all::<u64>();
    let nodes = c
        .query(
            "SELECT kind, id, argMax(narrative_id, version) AS narrative_id FROM weft_narrative_nodes \
             WHERE tenant = {t:String} AND id = {id:String} GROUP BY kind, id",
        )
        .param("t", tenant)
        .param("id", id)
        .fetch_all::<NodeNarrative>();
    let (direct, mut nodes) = tokio::try_join!(direct, nodes).map_err(store.err())?;
    let rows = direct.first().copied().unwrap_or(0);
    if rows > 0 {
        return Ok(Some((id.to_owned(), Some(rows))));
    }
    nodes.sort_by(|a, b| a.kind.cmp(&b.kind));
    Ok(nodes.into_iter().next().map(|n| (n.narrative_id, None)))
}

/// How `weft narrative ID` starts the line it prints on stderr when no narrative contains ID
/// (exit status 1, which other failures share): `weft bench lookup --cli-runs` tells the two
/// apart by it.
pub const NOT_FOUND: &str = "no narrative contains";

/// Read one narrative of `tenant` by any id in it, whole. `None` when the id is unknown there.
pub async fn lookup(
    store: &Store,
    tenant: &str,
    id: &str,
) -> Result<Option<Narrative>, StoreError> {
    lookup_at_most(store, tenant, id, u64::MAX).await
}

/// [`lookup`], with at most `max_members` members, the first in timeline order
/// ([`Narrative::members_total`] counts them all): the HTTP APIs' read, whose answer and
/// payload reads are bounded whatever the narrative's size.
pub async fn lookup_at_most(
    store: &Store,
    tenant: &str,
    id: &str,
    max_members: u64,
) -> Result<Option<Narrative>, StoreError> {
    let Some((nid, rows)) = resolve_counted(store, tenant, id).await? else {
        return Ok(None);
    };
    let (members, incoming) = members(store, tenant, &nid, max_members, rows).await?;
    let Some(members_total) = members.first().map(|m| m.total) else {
        return Ok(None);
    };
    let member_set: HashSet<(String, String)> = members
        .iter()
        .map(|m| (m.kind.clone(), m.id.clone()))
        .collect();
    // A bounded read may have cut the anchor off (members earlier in time lack a request id).
    let anchored = members.iter().any(|m| m.request_id == nid)
        || (members_total > members.len() as u64 && anchored_beyond(store, tenant, &nid).await?);
    let request_id = anchored.then(|| nid.clone());
    let (entries, link_set, mut outside) = entries_and_links(&members, &member_set);
    let (incoming, mut related_cut) = match incoming {
        Some(rows) if (rows.len() as u64) < INCOMING_AT_MOST => (rows, false),
        // As many as one query returns: links between members may have taken them all,
        // so the links from outside are asked again, those left out in ClickHouse.
        Some(_) => incoming_from_outside(store, tenant, &nid).await?,
        None => incoming_by_ids(store, tenant, &member_set).await?,
    };
    outside.extend(linked_from_outside(incoming, &member_set));
    let mut outside: Vec<(String, String)> = outside.into_iter().collect();
    if outside.len() > RELATED_IDS_AT_MOST {
        outside.sort_unstable();
        outside.truncate(RELATED_IDS_AT_MOST);
        related_cut = true;
    }
    let related = related(store, tenant, &nid, &outside).await?;
    Ok(Some(Narrative {
        narrative_id: nid,
        request_id,
        entries,
        members_total,
        links: link_set.into_iter().collect(),
        related,
        related_cut,
    }))
}

/// Whether a live member of the narrative carries its id as its own request id: the test of
/// a request narrative, for a read that kept only its first members. It reads the
/// narrative's keys, as the bounded read's ranking does.
async fn anchored_beyond(store: &Store, tenant: &str, nid: &str) -> Result<bool, StoreError> {
    const ANCHORED: &str = "SELECT count() FROM ( \
          SELECT 1 FROM weft_narratives WHERE tenant = {t:String} AND narrative_id = {n:String} \
          GROUP BY kind, id, content_hash \
          HAVING argMax(is_deleted, version) = 0 AND argMax(request_id, version) = {n:String} \
          LIMIT 1)";
    let c = store.client();
    let q = c.query(ANCHORED).param("t", tenant).param("n", nid);
    Ok(q.fetch_one::<u64>().await.map_err(store.err())? > 0)
}

/// The first `max` live members of a narrative in timeline order, each with the count of
/// them all (`rows`: the narrative's stored row count, when the caller has it); and, when
/// every member is read, the links into them.
///
/// A narrative whose rows number at most `max` (every narrative but a giant one) is read in
/// one scan, payloads included, and the links into it are asked at the same time, by
/// narrative id. A larger one is ranked without its payloads first, and only the kept
/// members' are read: it costs ClickHouse its keys, not its payloads, whatever its size; its
/// links are then asked by the kept members' ids. The ranking reads the keys three times, so
/// it is kept for that case: at 10M events it took 25 ms against 9 for the one scan
/// (docs/BENCHMARKS.md, section 2). (The store's client prefers column names to aliases, so
/// the orders name the aggregate.)
async fn members(
    store: &Store,
    tenant: &str,
    nid: &str,
    max: u64,
    rows: Option<u64>,
) -> Result<(Vec<MemberRow>, Option<Vec<InLink>>), StoreError> {
    const SMALL: &str =
        "SELECT kind, id, argMax(ts, version) AS ts, argMax(request_id, version) AS request_id, \
               argMax(payload, version) AS payload, count() OVER () AS total \
        FROM weft_narratives WHERE tenant = {t:String} AND narrative_id = {n:String} \
        GROUP BY kind, id, content_hash HAVING argMax(is_deleted, version) = 0 \
        ORDER BY argMax(ts, version), kind, id, content_hash LIMIT {max:UInt64}";
    const LARGE: &str = "WITH live AS ( \
          SELECT kind, id, content_hash, argMax(ts, version) AS ts FROM weft_narratives \
          WHERE tenant = {t:String} AND narrative_id = {n:String} \
          GROUP BY kind, id, content_hash HAVING argMax(is_deleted, version) = 0) \
        SELECT kind, id, argMax(ts, version) AS ts, argMax(request_id, version) AS request_id, \
               argMax(payload, version) AS payload, assumeNotNull((SELECT count() FROM live)) AS total \
        FROM weft_narratives \
        WHERE tenant = {t:String} AND narrative_id = {n:String} AND (kind, id, content_hash) IN ( \
          SELECT kind, id, content_hash FROM live ORDER BY ts, kind, id, content_hash LIMIT {max:UInt64}) \
        GROUP BY kind, id, content_hash \
        ORDER BY argMax(ts, version), kind, id, content_hash";
    let c = store.client();
    let read = |sql| c.query(sql).param("t", tenant).param("n", nid);
    let whole = match rows {
        _ if max == u64::MAX => true,
        Some(n) => n <= max,
        None => {
            read(ROW_COUNT)
                .fetch_one::<u64>()
                .await
                .map_err(store.err())?
                <= max
        }
    };
    // Members stored between the count and the scan stay beyond the LIMIT (`total`, a window
    // over every live member, counts them), and the links into them may be missed until the
    // next read: the two queries run side by side.
    if whole {
        let (m, l) = tokio::try_join!(
            read(SMALL).param("max", max).fetch_all::<MemberRow>(),
            read(INCOMING_BY_NARRATIVE)
                .param("max", INCOMING_AT_MOST)
                .fetch_all::<InLink>()
        )
        .map_err(store.err())?;
        Ok((m, Some(l)))
    } else {
        let m = read(LARGE).param("max", max).fetch_all().await;
        Ok((m.map_err(store.err())?, None))
    }
}

/// The timeline entries, the links between members, and the ids members link to outside.
fn entries_and_links(
    members: &[MemberRow],
    member_set: &HashSet<(String, String)>,
) -> (Vec<Entry>, BTreeSet<LinkView>, HashSet<(String, String)>) {
    let mut link_set = BTreeSet::new();
    let mut outside: HashSet<(String, String)> = HashSet::new();
    let mut entries = Vec::with_capacity(members.len());
    for m in members {
        let payload: Value = serde_json::from_str(&m.payload).unwrap_or(Value::Null);
        if let Ok(kind) = m.kind.parse::<Kind>() {
            for l in links::extract(kind, &payload) {
                let to = (l.to_kind.as_str().to_owned(), l.to_id.clone());
                if l.to_kind == NodeKind::Flow {
                    continue;
                }
                if member_set.contains(&to) {
                    link_set.insert(LinkView {
                        from: NodeRef {
                            kind: m.kind.clone(),
                            id: m.id.clone(),
                        },
                        to: NodeRef {
                            kind: to.0,
                            id: to.1,
                        },
                        via: l.via.as_str().to_owned(),
                    });
                } else {
                    outside.insert(to);
                }
            }
        }
        entries.push(Entry {
            kind: m.kind.clone(),
            id: m.id.clone(),
            timestamp: time::micros_to_rfc3339(m.ts),
            payload,
        });
    }
    (entries, link_set, outside)
}

/// The distinct ids of `nodes` in lists that each fit one query parameter (a narrative of
/// thousands of members would otherwise pass ClickHouse's limit on one) and name at most
/// [`IDS_PER_QUERY`] ids.
fn id_lists<'a>(nodes: impl Iterator<Item = &'a (String, String)>) -> Vec<Vec<String>> {
    let ids: BTreeSet<&str> = nodes.map(|(_, id)| id.as_str()).collect();
    let ids = ids.into_iter().map(str::to_owned);
    crate::ids::chunks_by_bytes(ids, crate::ids::MAX_PARAM_BYTES)
        .into_iter()
        .flat_map(|c| {
            c.chunks(IDS_PER_QUERY)
                .map(<[String]>::to_vec)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The links into a narrative from outside it, at most [`INCOMING_AT_MOST`]
/// ([`INCOMING_FROM_OUTSIDE`]), and whether that many came back (more may be left).
async fn incoming_from_outside(
    store: &Store,
    tenant: &str,
    nid: &str,
) -> Result<(Vec<InLink>, bool), StoreError> {
    let q = (store.client().query(INCOMING_FROM_OUTSIDE))
        .param("t", tenant)
        .param("n", nid)
        .param("max", INCOMING_AT_MOST);
    let rows = q.fetch_all::<InLink>().await.map_err(store.err())?;
    let cut = rows.len() as u64 >= INCOMING_AT_MOST;
    Ok((rows, cut))
}

/// The links into the kept members of a bounded read from outside them, by their ids, until
/// [`INCOMING_AT_MOST`] are found; and whether some may have been left (a query or the whole
/// reaching that many).
async fn incoming_by_ids(
    store: &Store,
    tenant: &str,
    members: &HashSet<(String, String)>,
) -> Result<(Vec<InLink>, bool), StoreError> {
    let mut rows: Vec<InLink> = Vec::new();
    let mut cut = false;
    for ids in id_lists(members.iter()) {
        let q = (store.client().query(INCOMING_BY_IDS))
            .param("t", tenant)
            .param("ids", &ids)
            .param("max", INCOMING_AT_MOST);
        let got = q.fetch_all::<InLink>().await.map_err(store.err())?;
        cut |= got.len() as u64 >= INCOMING_AT_MOST;
        let from_outside =
            |l: &InLink| !members.contains(&(l.from_kind.clone(), l.from_id.clone()));
        rows.extend(got.into_iter().filter(from_outside));
        if rows.len() as u64 >= INCOMING_AT_MOST {
            cut = true;
            break;
        }
    }
    Ok((rows, cut))
}

/// The links into a narrative's ids, at most `{max}`, asked by narrative id alongside a whole
/// read; the links between members among them are dropped in Rust ([`linked_from_outside`]).
/// (`GLOBAL IN`: on the cluster layout the two tables are sharded by different keys; on one
/// server it is a plain `IN`.)
const INCOMING_BY_NARRATIVE: &str =
    "SELECT DISTINCT from_kind, from_id, to_kind, to_id FROM weft_links \
     WHERE tenant = {t:String} AND to_id GLOBAL IN ( \
       SELECT id FROM weft_narratives WHERE tenant = {t:String} AND narrative_id = {n:String}) \
     LIMIT {max:UInt64}";
/// [`INCOMING_BY_NARRATIVE`] without the links from live members, for a narrative whose
/// links into it reached `{max}`: its own links must not take the places of outside ones.
/// Only then, because leaving them out in ClickHouse reads the narrative's members a second
/// time: at 10M events it took the links query from 18.5 to 28.1 ms on average, and with it
/// every lookup (the members are read alongside, in about 15).
const INCOMING_FROM_OUTSIDE: &str =
    "SELECT DISTINCT from_kind, from_id, to_kind, to_id FROM weft_links \
     WHERE tenant = {t:String} AND to_id GLOBAL IN ( \
       SELECT id FROM weft_narratives WHERE tenant = {t:String} AND narrative_id = {n:String}) \
       AND (from_kind, from_id) GLOBAL NOT IN ( \
       SELECT kind, id FROM weft_narratives WHERE tenant = {t:String} AND narrative_id = {n:String} \
       GROUP BY kind, id, content_hash HAVING argMax(is_deleted, version) = 0) \
     LIMIT {max:UInt64}";
const INCOMING_BY_IDS: &str = "SELECT DISTINCT from_kind, from_id, to_kind, to_id FROM weft_links \
     WHERE tenant = {t:String} AND to_id IN {ids:Array(String)} LIMIT {max:UInt64}";

/// The events outside the narrative that link into it, from `incoming` (links into its ids).
fn linked_from_outside(
    incoming: Vec<InLink>,
    member_set: &HashSet<(String, String)>,
) -> impl Iterator<Item = (String, String)> + '_ {
    incoming
        .into_iter()
        .filter(|l| {
            member_set.contains(&(l.to_kind.clone(), l.to_id.clone()))
                && !member_set.contains(&(l.from_kind.clone(), l.from_id.clone()))
        })
        .map(|l| (l.from_kind, l.from_id))
}

/// The other narratives of the ids in `outside`, sorted.
async fn related(
    store: &Store,
    tenant: &str,
    nid: &str,
    outside: &[(String, String)],
) -> Result<Vec<String>, StoreError> {
    const NODES_BY_IDS: &str = "SELECT kind, id, argMax(narrative_id, version) AS narrative_id \
        FROM weft_narrative_nodes WHERE tenant = {t:String} AND id IN {ids:Array(String)} \
        GROUP BY kind, id";
    let mut found: Vec<NodeNarrative> = Vec::new();
    for ids in id_lists(outside.iter()) {
        let q = (store.client().query(NODES_BY_IDS))
            .param("t", tenant)
            .param("ids", &ids);
        found.extend(q.fetch_all::<NodeNarrative>().await.map_err(store.err())?);
    }
    let by_key: HashMap<(String, String), String> = found
        .into_iter()
        .map(|n| ((n.kind, n.id), n.narrative_id))
        .collect();
    let set: BTreeSet<String> = outside
        .iter()
        .filter_map(|k| by_key.get(k))
        .filter(|n| *n != nid)
        .cloned()
        .collect();
    Ok(set.into_iter().collect())
}

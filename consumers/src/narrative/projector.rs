//! The narrative projector: applies stored facts to the in-memory [`Graph`] and writes the
//! resulting narrative rows to ClickHouse.
//!
//! State lives in two places: ClickHouse (`weft_narratives`, `weft_narrative_nodes`,
//! `weft_links`, `weft_links_from`, `weft_projector_progress`) is the truth; the in-memory
//! graph is a bounded cache of it: it starts empty, each pass loads what it names and is not
//! in memory ([`super::loader`]), and after the pass the least recently touched components
//! are evicted down to the budget (`max_nodes` of [`Projector::load`]). Every write is idempotent
//! (ReplacingMergeTree rows keyed by what they describe, versions from a monotonic clock), so
//! replaying facts after a crash is harmless, and progress is written last.

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::borrow::Cow;
use std::collections::hash_map::Entry;

use tokio::sync::watch;
use tracing::{info, instrument};
use weft_schemas::links::{Link, NodeKind};

use super::direct::direct_facts;
use super::filter::{IdFilter, IdSet, RebuildGate, DEFAULT_EXPECTED_ITEMS, DEFAULT_OPEN_ITEMS};
use super::graph::{takes_color, Graph, NodeIdx, NodeKey};
use super::loader;
use super::moves::move_rows;
use super::shard::NarrativeShard;
use weft_store::ids::{chunks_by_bytes, MAX_PARAM_BYTES};
use weft_store::narrative::{LinkRow, NarrativeRow, NodeRow, ProgressRow};
use weft_store::{check_columns, insert, insert_native, Fact, Stopped, Store, StoreError};

/// The tables the projector writes, and only it.
pub(super) const NARRATIVE_TABLES: &[&str] = &[
    "weft_narratives",
    "weft_narrative_nodes",
    "weft_links",
    "weft_links_from",
    "weft_projector_progress",
];

/// Why [`Projector::load_shard`] returned without a projector.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// ClickHouse failed; [`StoreError::is_transient`] says whether to load again.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The process was asked to stop while the load waited for the narrative inserts of an
    /// earlier process (before it read any narrative state or wrote anything).
    #[error("stopped while waiting for the narrative inserts running before this process")]
    Stopped,
}

impl From<Stopped> for LoadError {
    fn from(_: Stopped) -> Self {
        LoadError::Stopped
    }
}

/// Nodes the graph keeps in memory by default (measured: about 600 bytes of resident memory
/// each with their keys, links and index, so ~180 MB).
pub const DEFAULT_MAX_NODES: usize = 300_000;

/// A monotonic version: wall-clock micros, never repeating or going back.
#[derive(Debug, Default)]
pub struct VersionClock(u64);

impl VersionClock {
    /// A clock whose versions come after `v`: the newest this shard has written, so that a
    /// wall clock stepped back across a restart cannot give newer rows older versions.
    pub fn after(v: u64) -> Self {
        Self(v)
    }

    /// The next version: now in micros, or one past the last if the clock did not advance.
    pub fn tick(&mut self) -> u64 {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0);
        self.0 = now.max(self.0 + 1);
        self.0
    }
}

/// A link target by (tenant, kind, id), borrowed from the fact that names it.
pub(super) type SparedLink<'f> = (&'f str, NodeKind, &'f str);

/// What [`Projector::load_named`] did.
struct Named<'f> {
    /// Nodes loaded back from ClickHouse.
    loaded: usize,
    /// Link targets neither looked up nor kept in memory (one per naming link).
    spared: usize,
    /// The link targets the pass keeps out of memory.
    spared_links: HashSet<SparedLink<'f>>,
    /// Per fact of the pass: placed without entering the graph (see `load_named`).
    direct: Vec<bool>,
}

/// The facts read from one source partition, up to `last_offset`.
pub struct ProjectBatch<'a> {
    /// Source topic of the facts.
    pub topic: &'a str,
    /// Source partition of the facts.
    pub partition: i32,
    /// Facts to project, already decoded.
    pub facts: Vec<&'a Fact>,
    /// Highest offset covered; written to `weft_projector_progress` after the rows.
    pub last_offset: i64,
}

/// What one [`Projector::apply`] did, for metrics and logs.
#[derive(Debug, Default, Clone, Copy)]
pub struct ApplyStats {
    /// Facts projected: fed to the graph or placed directly.
    pub facts: usize,
    /// Events moved to another narrative; feeds `weft_narratives_moved_total`.
    pub moved: usize,
    /// Nodes loaded back from ClickHouse before the pass settled.
    pub loaded: usize,
    /// Nodes evicted after the pass.
    pub evicted: usize,
    /// Ids the pass neither looked up nor kept (see [`Projector::load_named`]).
    pub spared: usize,
    /// Facts placed without entering the graph (see [`Projector::load_named`]).
    pub direct: usize,
    /// The largest uncolored component the pass assigned.
    pub largest_component: usize,
}

/// Builds and maintains narratives from facts.
pub struct Projector {
    store: Store,
    graph: Graph,
    clock: VersionClock,
    progress: HashMap<(String, i32), i64>,
    max_nodes: usize,
    /// Which ids the narrative tables may know: the others need no lookup.
    seen: IdFilter,
    /// Which ids may be stored without a request id, or linked from such an event: the
    /// others, named by an event with a request id, need neither a lookup nor memory.
    open: IdFilter,
    /// The tenants this projector owns; its progress rows carry the shard's label.
    shard: NarrativeShard,
}

impl Projector {
    /// Load the projector's state from ClickHouse: progress, a killed pass's placements and
    /// the id filter. The graph starts empty and keeps at most `max_nodes` nodes between
    /// passes (a pass may exceed it while its own components are larger). Every tenant, and
    /// no stop: [`Projector::load_shard`] with [`NarrativeShard::WHOLE`], for tools and tests.
    pub async fn load(store: Store, max_nodes: usize) -> Result<Self, LoadError> {
        // Kept until the load returns: a stop signal whose sender is gone reads as a stop.
        let (_never, stop) = watch::channel(false);
        let gate = RebuildGate::open();
        Self::load_shard(store, max_nodes, NarrativeShard::WHOLE, &stop, gate).await
    }

    /// [`Projector::load`] for the tenants of one narrative shard: its own progress rows,
    /// and only its own tenants' rows restored and in the id filter. Another shard's passes,
    /// finished or killed, are none of its business (they write other tenants' rows, with
    /// versions from another clock). `Err(LoadError::Stopped)` once `stop` turns true while
    /// it waits for an earlier process's inserts. The id filters' rebuild waits for
    /// `filters` to open.
    #[instrument(skip(store, stop, filters), fields(shard = %shard))]
    pub async fn load_shard(
        store: Store,
        max_nodes: usize,
        shard: NarrativeShard,
        stop: &watch::Receiver<bool>,
        filters: RebuildGate,
    ) -> Result<Self, LoadError> {
        check_columns::<NarrativeRow>(&store, "weft_narratives").await?;
        check_columns::<NodeRow>(&store, "weft_narrative_nodes").await?;
        check_columns::<LinkRow>(&store, "weft_links").await?;
        check_columns::<LinkRow>(&store, "weft_links_from").await?;
        check_columns::<ProgressRow>(&store, "weft_projector_progress").await?;
        // The projector is the only writer of these tables: an insert running now is a dead
        // predecessor's (with several shards, maybe another shard's: waiting for it costs a
        // moment), and must land before the restore below reads them; why, in
        // `Store::wait_for_earlier_inserts`. A ClickHouse failure meanwhile ends the load (its
        // caller loads again).
        store
            .wait_for_earlier_inserts(NARRATIVE_TABLES, stop, |e, _| async move {
                Err(LoadError::Store(e))
            })
            .await?;
        let c = store.client();
        let progress: Vec<ProgressRow> = c
            .query(
                "SELECT topic, partition, argMax(offset, version) AS offset, max(version) AS version, shard \
                 FROM weft_projector_progress WHERE shard = {shard:String} GROUP BY topic, partition, shard",
            )
            .param("shard", shard.label())
            .fetch_all()
            .await
            .map_err(store.err())?;
        // A pass killed after its narrative rows but before its node rows leaves members
        // whose place only `weft_narratives` records. Restore it from there, so that when
        // a replayed pass puts such a member elsewhere (its batch now holds more events),
        // it moves the member and tombstones the row the killed pass wrote. The restored
        // placements are written to the node rows at once: the next completed pass moves
        // the threshold past the killed pass's version, and a pass that does not feed every
        // member of the killed one (batches differ after a restart) would otherwise leave
        // them known to no later load, so a second kill would lose their tombstones.
        // Both the last completed pass and the rows restored are this shard's own.
        let completed = progress.iter().map(|p| p.version).max().unwrap_or(0);
        let mut placed = c
            .query(&format!(
                "SELECT tenant, kind, id, argMaxIf(narrative_id, version, is_deleted = 0) AS narrative_id, \
                        minIf(request_id, request_id != '') AS request_id, \
                        argMax(ts, version) AS ts, \
                        max(version) AS version \
                 FROM weft_narratives WHERE version > {{completed:UInt64}}{} \
                 GROUP BY tenant, kind, id HAVING countIf(is_deleted = 0) > 0",
                shard.and_sql("tenant")
            ))
            .param("completed", completed)
            .fetch::<NodeRow>()
            .map_err(store.err())?;
        let mut restored = Vec::new();
        while let Some(r) = placed.next().await.map_err(store.err())? {
            restored.push(r);
        }
        keep_colors(&store, &mut restored).await?;
        let n_unfinished = restored.len();
        let newest = restored.iter().map(|r| r.version).fold(completed, u64::max);
        insert_native(&store, "weft_narrative_nodes", &restored).await?;
        let progress = progress
            .into_iter()
            .map(|p| ((p.topic, p.partition as i32), p.offset))
            .collect();
        let seen = IdFilter::load(
            &store,
            IdSet::Seen,
            DEFAULT_EXPECTED_ITEMS,
            shard,
            filters.clone(),
        );
        let open = IdFilter::load(&store, IdSet::Open, DEFAULT_OPEN_ITEMS, shard, filters);
        info!(
            unfinished_pass = n_unfinished,
            %shard,
            "narrative projector loaded (components load on demand)"
        );
        Ok(Self {
            store,
            graph: Graph::with_budget(max_nodes),
            clock: VersionClock::after(newest),
            progress,
            max_nodes,
            seen,
            open,
            shard,
        })
    }

    /// The tenants this projector owns.
    pub fn shard(&self) -> NarrativeShard {
        self.shard
    }

    /// Highest offset of a source partition already projected, or -1.
    pub fn projected(&self, topic: &str, partition: i32) -> i64 {
        self.progress
            .get(&(topic.to_owned(), partition))
            .copied()
            .unwrap_or(-1)
    }

    /// Whether the id filters' background rebuilds have ended (until then every id a pass
    /// names is looked up).
    pub fn id_filter_ready(&self) -> bool {
        self.seen.ready() && self.open.ready()
    }

    /// Number of nodes held in memory (events, flows, phantoms).
    pub fn graph_len(&self) -> usize {
        self.graph.len()
    }

    /// Apply the facts of several source partitions, write the narrative rows, then
    /// record how far each partition is projected. Facts of tenants outside the shard are
    /// passed over (ingest skips them before decoding; this keeps the shard's rows its own
    /// whatever the caller feeds), and still move the progress.
    #[instrument(skip_all, fields(partitions = batches.len()))]
    pub async fn apply(&mut self, batches: &[ProjectBatch<'_>]) -> Result<ApplyStats, StoreError> {
        let version = self.clock.tick();
        self.graph.begin_pass();
        let shard = self.shard;
        let facts: Vec<&Fact> = batches
            .iter()
            .flat_map(|b| b.facts.iter().copied())
            .filter(|f| shard.owns(&f.envelope.tenant))
            .collect();
        let Named {
            loaded,
            spared: n_spared,
            spared_links: spared,
            direct,
        } = self.load_named(&facts).await?;
        let mut seeds = Vec::new();
        let mut fed: Vec<(NodeIdx, &Fact)> = Vec::new();
        // Sized for the pass up front: grown by doubling, these vectors of a 50k-record pass
        // were copied again at each step, into freshly faulted pages.
        let mut link_rows = Vec::with_capacity(facts.iter().map(|f| f.links.len()).sum());
        let mut from_rows = Vec::new();
        let mut narrative_rows = Vec::with_capacity(facts.len());
        // Node rows: the direct facts' first, then those of the graph's nodes.
        let mut nodes: Vec<NodeRow<Cow<str>>> = Vec::with_capacity(facts.len());
        for (f, direct) in facts.into_iter().zip(direct) {
            let env = &f.envelope;
            link_rows.extend(f.links.iter().map(|l| link_row(f, l)));
            if direct {
                let request_id = env.request_id.as_deref().unwrap_or_default();
                narrative_rows.push(narrative_row(f, Cow::Borrowed(request_id), version));
                nodes.push(NodeRow {
                    tenant: Cow::Borrowed(&env.tenant),
                    kind: Cow::Borrowed(env.kind.as_str()),
                    id: Cow::Borrowed(&f.id),
                    narrative_id: Cow::Borrowed(request_id),
                    request_id: Cow::Borrowed(request_id),
                    ts: f.ts_micros,
                    version,
                });
                continue;
            }
            let key = self
                .graph
                .node_key(&env.tenant, NodeKind::Event(env.kind), &f.id);
            let request_id = env.request_id.as_deref().unwrap_or("");
            // A link the pass spared (see `load_named`) stays in ClickHouse only.
            let is_spared =
                |l: &Link| spared.contains(&(env.tenant.as_str(), l.to_kind, l.to_id.as_str()));
            let kept: Vec<Link>;
            let links = if f.links.iter().any(is_spared) {
                kept = f.links.iter().filter(|l| !is_spared(l)).cloned().collect();
                &kept[..]
            } else {
                &f.links[..]
            };
            let n = self.graph.add_event(key, request_id, f.ts_micros, links);
            seeds.extend(self.graph.seeds(n));
            fed.push((n, f));
            // The loader follows a stored node's own links only when it has no request id.
            if !self.graph.is_colored(n) {
                from_rows.extend(f.links.iter().map(|l| link_row(f, l)));
            }
        }
        let changes = self.graph.settle(&seeds);
        let mut node_rows: HashMap<NodeIdx, NodeRow<Cow<str>>> = HashMap::default();
        for (n, f) in &fed {
            let Some(narrative) = self.graph.assigned(*n).cloned() else {
                continue;
            };
            narrative_rows.push(narrative_row(f, Cow::Owned(narrative.to_string()), version));
            node_rows.insert(*n, self.node_row(*n, &narrative, version));
        }
        let moved = move_rows(
            &self.store,
            &self.graph,
            &changes,
            version,
            &mut narrative_rows,
        )
        .await?;
        for c in &changes {
            node_rows
                .entry(c.node)
                .or_insert_with(|| self.node_row(c.node, &c.new, version));
        }
        insert_native(&self.store, "weft_links", &link_rows).await?;
        insert_native(&self.store, "weft_links_from", &from_rows).await?;
        insert_native(&self.store, "weft_narratives", &narrative_rows).await?;
        let n_direct = nodes.len();
        nodes.extend(node_rows.into_values());
        insert_native(&self.store, "weft_narrative_nodes", &nodes).await?;
        let progress: Vec<ProgressRow> = batches
            .iter()
            .map(|b| ProgressRow {
                topic: b.topic.to_owned(),
                partition: b.partition as u32,
                offset: b.last_offset,
                version,
                shard: self.shard.label(),
            })
            .collect();
        insert::<ProgressRow>(&self.store, "weft_projector_progress", &progress).await?;
        for b in batches {
            self.progress
                .insert((b.topic.to_owned(), b.partition), b.last_offset);
        }
        let largest_component = self.graph.largest_component;
        // Eviction compacts the whole graph, so it runs only once the budget is exceeded,
        // and then makes room for a few passes (down to 3/4 of it) rather than one.
        let evicted = if self.graph.len() > self.max_nodes {
            self.graph.evict(self.max_nodes - self.max_nodes / 4)
        } else {
            0
        };
        Ok(ApplyStats {
            facts: fed.len() + n_direct,
            direct: n_direct,
            moved,
            loaded,
            evicted,
            spared: n_spared,
            largest_component,
        })
    }

    /// Load every id the facts name (their own and their links' targets) that is not in
    /// memory and may matter; says how many nodes came back, which link targets the pass
    /// leaves out of memory, and which facts need no graph at all.
    ///
    /// An event without a request id takes its narrative from its component, so every id it
    /// names must be in memory. An event with one is its own anchor: a link target it names
    /// matters only if it is (or links to) something stored without a request id, which the
    /// open filter says. Any other target — a stored event with a request id, a new id, a
    /// phantom whose stored neighbors all have one — is spared: not looked up, and the link
    /// to it kept out of memory, since it changes no assignment (its link row is still
    /// written, so a later load of that id finds it). A target another event of the pass
    /// needs, or that the load brought into memory, is never spared. An event's own id is
    /// never spared: stored before with another request id (an identity reused with other
    /// content), it keeps the node's first color, as a rebuild gives it.
    ///
    /// An event with a request id is placed *directly*, in its own request's narrative and
    /// without entering the graph, when its own id is new (the seen filter never saw it, the
    /// open filter has it not, it is not in memory, no other fact of the pass has it) and
    /// every id it names, or that names it, is a spared target or another direct event.
    /// That is what adding the pass's direct events and evicting them at once would give:
    /// each colors itself, and they touch no uncolored node. Their rows are written as any
    /// other's, so a later event that names one loads it.
    async fn load_named<'f>(&mut self, facts: &[&'f Fact]) -> Result<Named<'f>, StoreError> {
        let mut needed: HashSet<NodeKey> = HashSet::default();
        let mut sparable: Vec<(NodeKey, SparedLink<'f>)> = Vec::new();
        // The facts that may be placed directly, by own id (None: an id two facts have),
        // and every link target with the index of the fact that names it.
        let mut candidates: HashMap<NodeKey, Option<usize>> = HashMap::default();
        let mut targets: Vec<(usize, NodeKey)> = Vec::with_capacity(facts.len() * 2);
        // Own ids with the request id they come with, of the facts whose identity may be
        // stored already (not a candidate: in memory or named by an event without one; or
        // twice in this pass), and below the candidates the seen filter may hold. Only these
        // can take a smaller request id (`Graph::would_recolor`).
        let request_of = |j: usize| facts[j].envelope.request_id.as_deref().unwrap_or("");
        let mut reused: Vec<(NodeKey, &str)> = Vec::new();
        for (i, f) in facts.iter().enumerate() {
            let env = &f.envelope;
            let open = env.request_id.as_deref().is_none_or(str::is_empty);
            let own = self
                .graph
                .node_key(&env.tenant, NodeKind::Event(env.kind), &f.id);
            // Whether the id is new is known after the load: the seen filter's positives are
            // looked up, and the loader brings what it looks up into memory.
            let candidate =
                !open && self.graph.lookup(&own).is_none() && !self.open.may_contain(&own);
            if open {
                self.open.insert(&own);
            }
            match candidates.entry(own.clone()) {
                Entry::Occupied(mut e) => {
                    if let Some(j) = e.get_mut().take() {
                        reused.push((own.clone(), request_of(j)));
                    }
                    if !open {
                        reused.push((own.clone(), request_of(i)));
                    }
                }
                Entry::Vacant(e) => {
                    e.insert(candidate.then_some(i));
                    if !open && !candidate {
                        reused.push((own.clone(), request_of(i)));
                    }
                }
            }
            needed.insert(own);
            for l in &f.links {
                let k = self.graph.node_key(&env.tenant, l.to_kind, &l.to_id);
                targets.push((i, k.clone()));
                if open {
                    self.open.insert(&k);
                    needed.insert(k);
                } else if self.graph.needs_load(&k) && !self.open.may_contain(&k) {
                    sparable.push((k, (env.tenant.as_str(), l.to_kind, l.to_id.as_str())));
                } else {
                    needed.insert(k);
                }
            }
        }
        sparable.retain(|(k, _)| !needed.contains(k));
        for (k, _) in &sparable {
            // Not looked up, but stored by this pass (as a link row's target).
            self.seen.insert(k);
        }
        // Ids the seen filter has never seen are new: only the others are looked up. Every
        // id named is remembered, the looked-up ones too: while the filter is still being
        // rebuilt its "maybe" does not mean it holds the id, and the pass stores them all.
        let mut maybe: Vec<NodeKey> = needed
            .into_iter()
            .filter(|k| self.graph.needs_load(k))
            .filter(|k| self.seen.check_and_insert(k))
            .collect();
        // A candidate the seen filter may hold may be a stored identity (see `reused`).
        for k in &maybe {
            if let Some(Some(i)) = candidates.get(k) {
                reused.push((k.clone(), request_of(*i)));
            }
        }
        // The own id of an event with a request id that no event without one may name
        // (still outside the open set) matters only through a stored node row: links to it
        // come from events with a request id, which change no assignment. So it is probed
        // (node rows only); an id with no node row is new as a node, and may be direct.
        let (probe, full): (Vec<NodeKey>, Vec<NodeKey>) = maybe
            .into_iter()
            .partition(|k| matches!(candidates.get(k), Some(Some(_))) && !self.open.may_contain(k));
        maybe = full;
        maybe.extend(loader::stored(&self.store, &mut self.graph, probe).await?);
        let mut loaded = loader::load(&self.store, &mut self.graph, maybe)
            .await?
            .loaded;
        // An identity stored again with a smaller request id takes it (`Graph::add_event`):
        // every uncolored component around it must be in memory before it settles.
        let mut around = Vec::new();
        for (own, r) in &reused {
            if self.graph.would_recolor(own, r) {
                around.extend(loader::around(&self.store, &mut self.graph, own).await?);
            }
        }
        // Only what may move: an event without a request id (its own id is in the open set),
        // or a phantom or flow such an event names (in it as a link target). An event with a
        // request id keeps its own narrative, however many of them cite the node.
        around.retain(|k| self.graph.needs_load(k) && self.open.may_contain(k));
        if !around.is_empty() {
            loaded += loader::load(&self.store, &mut self.graph, around)
                .await?
                .loaded;
        }
        // A spared target the load brought in (a neighbor of a loaded component) must have
        // every link in memory, this pass's too.
        sparable.retain(|(k, _)| self.graph.lookup(k).is_none());
        let spared = sparable.len();
        let direct = direct_facts(
            facts.len(),
            &candidates,
            &targets,
            |k| self.graph.lookup(k).is_none(),
            &sparable,
        );
        let spared_links: HashSet<SparedLink<'f>> = sparable.into_iter().map(|(_, l)| l).collect();
        Ok(Named {
            loaded,
            spared,
            spared_links,
            direct,
        })
    }

    /// The node row of `n`. Its request id is the node's own color, as the graph holds it
    /// (an identity stored with and without one is colored), so a later load sees the node
    /// as memory did, and as `weft rebuild` writes it.
    fn node_row(&self, n: NodeIdx, narrative: &str, version: u64) -> NodeRow<Cow<'static, str>> {
        let key = self.graph.key(n);
        NodeRow {
            tenant: Cow::Owned(key.tenant.to_string()),
            kind: Cow::Borrowed(key.kind.as_str()),
            id: Cow::Owned(key.id.to_string()),
            narrative_id: Cow::Owned(narrative.to_owned()),
            request_id: Cow::Owned(
                self.graph
                    .request_id(n)
                    .map(|r| r.to_string())
                    .unwrap_or_default(),
            ),
            ts: self.graph.ts(n),
            version,
        }
    }
}

/// The row of `f`'s link `l`, for `weft_links` (and `weft_links_from`), borrowed from `f`.
fn link_row<'f>(f: &'f Fact, l: &'f Link) -> LinkRow<Cow<'f, str>> {
    let env = &f.envelope;
    LinkRow {
        tenant: Cow::Borrowed(&env.tenant),
        to_kind: Cow::Borrowed(l.to_kind.as_str()),
        to_id: Cow::Borrowed(&l.to_id),
        from_kind: Cow::Borrowed(env.kind.as_str()),
        from_id: Cow::Borrowed(&f.id),
        via: Cow::Borrowed(l.via.as_str()),
    }
}

/// The member row of `f` in `narrative`, borrowed from `f` (its payload too).
fn narrative_row<'f>(
    f: &'f Fact,
    narrative: Cow<'f, str>,
    version: u64,
) -> NarrativeRow<Cow<'f, str>> {
    let env = &f.envelope;
    NarrativeRow {
        tenant: Cow::Borrowed(&env.tenant),
        narrative_id: narrative,
        kind: Cow::Borrowed(env.kind.as_str()),
        id: Cow::Borrowed(&f.id),
        content_hash: f.content_hash,
        ts: f.ts_micros,
        request_id: Cow::Borrowed(env.request_id.as_deref().unwrap_or_default()),
        payload: Cow::Borrowed(env.payload.get()),
        version,
        is_deleted: 0,
    }
}

/// A restored node's color is the smallest request id of all its versions, as memory and a
/// rebuild give it ([`takes_color`]): the killed pass's rows hold the versions it placed,
/// the stored node rows the color of the earlier ones (a member the killed pass stored
/// without a request id may be an identity an earlier pass colored).
async fn keep_colors(store: &Store, restored: &mut [NodeRow]) -> Result<(), StoreError> {
    let mut by_tenant: HashMap<String, Vec<String>> = HashMap::default();
    for r in restored.iter() {
        by_tenant
            .entry(r.tenant.clone())
            .or_default()
            .push(r.id.clone());
    }
    let mut colors: HashMap<(String, String, String), String> = HashMap::default();
    for (tenant, ids) in by_tenant {
        for chunk in chunks_by_bytes(ids, MAX_PARAM_BYTES) {
            for n in loader::query_nodes(store, &tenant, &chunk).await? {
                if !n.request_id.is_empty() {
                    colors.insert((n.tenant, n.kind, n.id), n.request_id);
                }
            }
        }
    }
    for r in restored.iter_mut() {
        let key = (r.tenant.clone(), r.kind.clone(), r.id.clone());
        if let Some(c) = colors.remove(&key) {
            if takes_color(Some(r.request_id.as_str()).filter(|s| !s.is_empty()), &c) {
                r.request_id = c;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::VersionClock;

    /// Versions after a restart come after the newest stored, even when the wall clock is
    /// behind it (stepped back, or another host's).
    #[test]
    fn a_clock_resumed_after_a_future_version_stays_ahead_of_it() {
        let future = 4_000_000_000_000_000; // µs: the year 2096
        let mut c = VersionClock::after(future);
        let first = c.tick();
        assert!(first > future);
        assert!(c.tick() > first);
    }
}

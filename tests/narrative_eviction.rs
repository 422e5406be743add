//! The narrative graph under a memory budget, against the real ClickHouse: components evicted
//! long ago load back exactly when a late event names them, and a component larger than the
//! budget is assigned whole.
//!
//! Each test drives the projector as ingest does (passes of facts), with a budget far below
//! what the test holds, and compares every stored placement with the rebuild's rule: a fresh
//! in-memory graph of every fact, settled once.

mod common;

use std::collections::BTreeMap;

use common::facts::{fact, unwrite, KillAfter};
use common::pipeline::{Membership, Pipeline};
use serde_json::{json, Value};
use weft_consumers::decode::Fact;
use weft_consumers::narrative::graph::{Graph, NodeIdx};
use weft_consumers::narrative::projector::{ApplyStats, ProjectBatch, Projector};
use weft_schemas::links::NodeKind;
use weft_schemas::{Envelope, Kind};
use weft_store::{ClickHouseConfig, Store};

fn env(kind: Kind, request_id: Option<&str>, payload: Value) -> Envelope {
    serde_json::from_value(json!({
        "kind": kind.as_str(),
        "request_id": request_id,
        "tenant": "default",
        "payload": payload,
    }))
    .unwrap()
}

fn trace(id: &str, req: &str, handle: &str) -> Envelope {
    trace_of(id, req, handle, "capability_executed")
}

/// [`trace`] with another event type (other content under the same identity).
fn trace_of(id: &str, req: &str, handle: &str, event_type: &str) -> Envelope {
    env(
        Kind::TraceEvent,
        Some(req),
        json!({"event_id": id, "event_type": event_type,
               "timestamp": "2026-03-08T06:00:05Z", "handle_id": handle}),
    )
}

fn handle(id: &str, flow: Option<&str>) -> Envelope {
    handle_in(id, flow, None)
}

/// [`handle`] carrying a request id of its own.
fn handle_in(id: &str, flow: Option<&str>, req: Option<&str>) -> Envelope {
    let mut p = json!({"handle_id": id, "capability_id": "org.test.cap",
                       "artifact_type": "application/json", "created_at": "2026-03-08T06:00:05Z"});
    if let Some(f) = flow {
        p["metadata"] = json!({ "flow_id": f });
    }
    env(Kind::Handle, req, p)
}

/// A trace event stored again: other content, `req`, and no link.
fn trace_again(id: &str, req: &str) -> Envelope {
    env(
        Kind::TraceEvent,
        Some(req),
        json!({"event_id": id, "event_type": "capability_denied",
               "timestamp": "2026-03-08T06:00:06Z"}),
    )
}

/// A handle stored again: other content, `req`, and no link.
fn handle_again(id: &str, req: &str) -> Envelope {
    env(
        Kind::Handle,
        Some(req),
        json!({"handle_id": id, "capability_id": "org.test.cap",
               "artifact_type": "text/plain", "created_at": "2026-03-08T06:00:06Z"}),
    )
}

fn frame(id: &str, refs: &[&str]) -> Envelope {
    env(
        Kind::Frame,
        None,
        json!({"frame_id": id, "capability_id": "org.test.cap", "summary": "s",
               "created_at": "2026-03-08T06:00:05Z", "handle_refs": refs}),
    )
}

/// Unrelated requests, enough to push everything older out of a small budget.
fn filler(tag: &str, n: usize) -> Vec<Envelope> {
    (0..n)
        .flat_map(|i| {
            let h = format!("h-{tag}-{i}");
            [
                trace(&format!("te-{tag}-{i}"), &format!("req-{tag}-{i}"), &h),
                handle(&h, None),
            ]
        })
        .collect()
}

/// A projector on a fresh database and the facts it was fed, one partition.
struct Harness {
    p: Pipeline,
    store: Store,
    projector: Projector,
    fed: Vec<Fact>,
}

impl Harness {
    async fn new(tag: &str, max_nodes: usize) -> Self {
        Self::reading_at_most(tag, max_nodes, None).await
    }

    /// [`Harness::new`] whose projector's every query may read at most `rows` rows
    /// (ClickHouse's `max_rows_to_read`; `None`: no limit).
    async fn reading_at_most(tag: &str, max_nodes: usize, rows: Option<u64>) -> Self {
        let p = Pipeline::new(tag);
        let store = Store::new(ClickHouseConfig {
            url: common::clickhouse_url(),
            database: p.db.clone(),
            ..ClickHouseConfig::default()
        })
        .unwrap();
        let limited = rows.map_or_else(|| store.clone(), |r| store.with_read_limit(r));
        let projector = Projector::load(limited, max_nodes).await.unwrap();
        Self {
            p,
            store,
            projector,
            fed: Vec::new(),
        }
    }

    /// [`Harness::new`], once the id filters' background rebuild has ended (so passes may
    /// place facts directly).
    async fn warm(tag: &str, max_nodes: usize) -> Self {
        let h = Self::new(tag, max_nodes).await;
        common::facts::wait_for_id_filters(&h.projector).await;
        h
    }

    /// Feed `events` in passes of `per_pass`; returns the summed stats.
    async fn feed(&mut self, events: &[Envelope], per_pass: usize) -> ApplyStats {
        let mut total = ApplyStats::default();
        for chunk in events.chunks(per_pass) {
            let first = self.fed.len();
            for e in chunk {
                let f = fact(e, 0, self.fed.len() as i64);
                self.fed.push(f);
            }
            let batch = ProjectBatch {
                topic: "t",
                partition: 0,
                facts: self.fed[first..].iter().collect(),
                last_offset: self.fed.len() as i64 - 1,
            };
            let s = self.projector.apply(&[batch]).await.unwrap();
            total.facts += s.facts;
            total.direct += s.direct;
            total.moved += s.moved;
            total.loaded += s.loaded;
            total.evicted += s.evicted;
            total.largest_component = total.largest_component.max(s.largest_component);
        }
        total
    }

    /// Apply the last `n` facts fed again, as one pass: the replay of a killed pass by a
    /// restarted process.
    async fn replay(&mut self, n: usize) {
        let first = self.fed.len() - n;
        let batch = ProjectBatch {
            topic: "t",
            partition: 0,
            facts: self.fed[first..].iter().collect(),
            last_offset: self.fed.len() as i64 - 1,
        };
        self.projector.apply(&[batch]).await.unwrap();
    }

    /// What a rebuild gives: every fact in one graph, settled once.
    fn rebuilt(&self) -> Membership {
        Self::rebuilt_from(self.fed.iter())
    }

    /// [`Harness::rebuilt`] reading the facts in the order given.
    fn rebuilt_from<'a>(facts: impl Iterator<Item = &'a Fact>) -> Membership {
        let mut g = Graph::new();
        for f in facts {
            let env = &f.envelope;
            let key = g.node_key(&env.tenant, NodeKind::Event(env.kind), &f.id);
            g.add_event(key, env.request_id.as_deref().unwrap_or(""), 0, &f.links);
        }
        g.settle_all();
        let mut m = Membership::new();
        for n in 0..g.len() as NodeIdx {
            if let Some(nid) = g.assigned(n).filter(|_| g.is_present(n)) {
                let k = g.key(n);
                m.entry(nid.to_string())
                    .or_default()
                    .insert((k.kind.as_str().to_owned(), k.id.to_string()));
            }
        }
        m
    }

    /// Stored narratives equal the rebuild's, in both narrative tables.
    async fn assert_exact(&self) {
        let want = self.rebuilt();
        self.p
            .wait_for_narratives(&want, std::time::Duration::ZERO)
            .await;
        let rows: Vec<(String, String, String)> = self
            .store
            .client()
            .query(
                "SELECT argMax(narrative_id, version), kind, id FROM weft_narrative_nodes \
                 GROUP BY tenant, kind, id",
            )
            .fetch_all()
            .await
            .unwrap();
        let mut nodes = Membership::new();
        for (n, k, i) in rows {
            nodes.entry(n).or_default().insert((k, i));
        }
        assert_eq!(nodes, want, "weft_narrative_nodes differs from the rebuild");
    }

    /// Each `(kind, id)` is stored in `narrative`.
    async fn assert_placed(&self, want: &[(&str, &str, &str)]) {
        let m = self.p.membership().await;
        for (kind, id, narrative) in want {
            assert_eq!(
                self.narrative_of(&m, kind, id).as_deref(),
                Some(*narrative),
                "{kind} {id}"
            );
        }
    }

    fn narrative_of(&self, m: &Membership, kind: &str, id: &str) -> Option<String> {
        let member = (kind.to_owned(), id.to_owned());
        m.iter()
            .find(|(_, ms)| ms.contains(&member))
            .map(|(n, _)| n.clone())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_event_whose_anchor_was_evicted_long_ago_lands_in_the_anchors_narrative() {
    let mut h = Harness::new("it_evict_late", 30).await;
    h.feed(&[trace("te-anchor", "req-anchor", "h-late")], 1)
        .await;
    let churn = h.feed(&filler("a", 300), 20).await;
    assert!(
        churn.evicted > 500,
        "the anchor must be long gone: {churn:?}"
    );
    assert!(h.projector.graph_len() <= 30 + 40);
    // A restart in between: the new process holds nothing and must find the anchor.
    h.projector = Projector::load(h.store.clone(), 30).await.unwrap();
    assert_eq!(h.projector.graph_len(), 0);
    let late = h.feed(&[handle("h-late", None)], 1).await;
    assert!(
        late.loaded >= 1,
        "the anchor came back from ClickHouse: {late:?}"
    );
    h.assert_placed(&[("handle", "h-late", "req-anchor")]).await;
    h.assert_exact().await;
    // The id filter is rebuilt in the background; once it is, a late event still finds an
    // anchor stored before the restart (a filter missing it would skip the lookup).
    common::facts::wait_for_id_filters(&h.projector).await;
    h.feed(&filler("b", 300), 20).await;
    h.feed(&[frame("f-late", &["h-late"])], 1).await;
    h.assert_placed(&[("frame", "f-late", "req-anchor")]).await;
    h.assert_exact().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_event_joining_two_evicted_components_gives_the_rebuilds_result() {
    let mut h = Harness::new("it_evict_join", 30).await;
    // X: a frame and its handle, no request (ad hoc). Y: a request's trace event and handle.
    h.feed(&[frame("f-x", &["h-x"]), handle("h-x", None)], 2)
        .await;
    h.feed(&[trace("te-y", "req-y", "h-y"), handle("h-y", None)], 2)
        .await;
    let before = h.p.membership().await;
    assert_eq!(
        h.narrative_of(&before, "frame", "f-x").as_deref(),
        Some("adhoc:frame:f-x")
    );
    let churn = h.feed(&filler("b", 300), 20).await;
    assert!(churn.evicted > 500, "{churn:?}");
    // A frame citing both handles joins X to Y's request.
    let join = h.feed(&[frame("f-z", &["h-x", "h-y"])], 1).await;
    assert!(join.loaded >= 4, "both components came back: {join:?}");
    let m = h.p.membership().await;
    for (kind, id) in [("frame", "f-x"), ("handle", "h-x"), ("frame", "f-z")] {
        assert_eq!(
            h.narrative_of(&m, kind, id).as_deref(),
            Some("req-y"),
            "{id}"
        );
    }
    assert!(
        !m.contains_key("adhoc:frame:f-x"),
        "the old narrative is empty"
    );
    h.assert_exact().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_far_over_the_budget_is_assigned_exactly() {
    const N: usize = 250_000;
    let budget = 50_000;
    let mut h = Harness::new("it_evict_big", budget).await;
    // One flow of 250k handles without a request id: one uncolored component, fed in passes
    // as ingest would; then the flow's one trace event with a request id claims them all.
    let handles: Vec<Envelope> = (0..N)
        .map(|i| handle(&format!("hb-{i:06}"), Some("flow-big")))
        .collect();
    let grow = h.feed(&handles, 25_000).await;
    assert_eq!(
        grow.largest_component,
        N + 1,
        "every handle and the flow, whole"
    );
    let te = env(
        Kind::TraceEvent,
        Some("req-big"),
        json!({"event_id": "te-big", "event_type": "capability_executed",
               "timestamp": "2026-03-08T06:00:05Z", "metadata": {"flow_id": "flow-big"}}),
    );
    // Push the component out of memory first, so the claim must load all of it back.
    let churn = h.feed(&filler("c", 30_000), 10_000).await;
    assert!(churn.evicted >= N, "{churn:?}");
    assert!(h.projector.graph_len() <= budget + 20_000);
    let claim = h.feed(&[te], 1).await;
    assert!(claim.loaded >= N, "{claim:?}");
    let m = h.p.membership().await;
    let members = m.get("req-big").map_or(0, |s| s.len());
    assert_eq!(members, N + 1, "every handle and the trace event");
    let by_id: BTreeMap<_, _> = m.iter().map(|(n, s)| (n.clone(), s.len())).collect();
    assert!(
        !by_id.contains_key("adhoc:handle:hb-000000"),
        "the ad hoc narrative is empty"
    );
    h.assert_exact().await;
    // Read back whole, as the API does: its member ids take many query parameters.
    let n = weft_store::narrative::query::lookup(&h.store, "default", "req-big")
        .await
        .expect("a narrative of 250k members reads")
        .expect("the narrative exists");
    assert_eq!(n.entries.len(), N + 1);
    assert_eq!(n.members_total, (N + 1) as u64);
    // As the HTTP APIs read it: the first members in time, and the count of them all.
    let api_max = weft_store::narrative::query::API_MAX_MEMBERS;
    let first =
        weft_store::narrative::query::lookup_at_most(&h.store, "default", "req-big", api_max)
            .await
            .expect("a bounded read")
            .expect("the narrative exists");
    assert_eq!(first.members_total, (N + 1) as u64);
    assert_eq!(first.entries, n.entries[..api_max as usize]);
    // Its first members are handles without a request id: the anchor is beyond the cut, and
    // the narrative is still the request's.
    assert_eq!(first.request_id.as_deref(), Some("req-big"));
    assert_eq!(first.request_id, n.request_id);
}

/// A few members leaving a large narrative cost a read of their own rows, not of the whole
/// narrative: the projector's queries may read fewer rows than the narrative holds, so a
/// move that read every member (payloads included) would fail the pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_leaving_a_large_narrative_read_their_own_rows_only() {
    const N: usize = 60_000;
    const MOVED: usize = 5;
    // Under half the narrative, over the few granules (8,192 rows each) the movers sit in.
    let read_limit = 30_000;
    let mut h = Harness::reading_at_most("it_evict_move", 1_000_000, Some(read_limit)).await;
    common::facts::wait_for_id_filters(&h.projector).await;
    // The anchor first, then a flow of N handles without a request id: each pass adds
    // members to req-big, and none moves (a move out of req-big would read it).
    let te = env(
        Kind::TraceEvent,
        Some("req-big"),
        json!({"event_id": "te-big", "event_type": "capability_executed",
               "timestamp": "2026-03-08T06:00:05Z", "metadata": {"flow_id": "flow-big"}}),
    );
    h.feed(&[te], 1).await;
    let handles: Vec<Envelope> = (0..N)
        .map(|i| handle(&format!("hm-{i:06}"), Some("flow-big")))
        .collect();
    h.feed(&handles, 20_000).await;
    assert_eq!(h.projector.graph_len(), N + 2, "nothing evicted");
    // A few handles get a nearer anchor (their own trace event, one link away; req-big is
    // two, through the flow): they leave req-big, which keeps the rest.
    let claims: Vec<Envelope> = (1..=MOVED)
        .map(|i| {
            trace(
                &format!("te-m-{i}"),
                &format!("req-m-{i}"),
                &format!("hm-{i:06}"),
            )
        })
        .collect();
    let stats = h.feed(&claims, MOVED).await;
    assert_eq!(stats.moved, MOVED, "{stats:?}");
    let m = h.p.membership().await;
    assert_eq!(m.get("req-big").map_or(0, |s| s.len()), N + 1 - MOVED);
    for i in 1..=MOVED {
        let want = [
            ("trace_event".to_owned(), format!("te-m-{i}")),
            ("handle".to_owned(), format!("hm-{i:06}")),
        ];
        assert_eq!(
            m.get(&format!("req-m-{i}")),
            Some(&want.into_iter().collect())
        );
    }
    h.assert_exact().await;
}

/// The id filter's hashes, computed by ClickHouse when it is rebuilt at start, are the ones
/// the projector computes for the ids it meets (else a restarted process would miss them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_id_filter_hashes_as_clickhouse_does() {
    let client = clickhouse::Client::default().with_url(common::clickhouse_url());
    for (t, k, i) in [
        ("default", "handle", "h-1"),
        ("tenant-β", "flow", ""),
        ("a", "b", "c\u{1f}d"),
    ] {
        let got: u64 = client
            .query(
                "SELECT xxHash64(concat({t:String}, char(31), {k:String}, char(31), {i:String}))",
            )
            .param("t", t)
            .param("k", k)
            .param("i", i)
            .fetch_one()
            .await
            .unwrap();
        assert_eq!(got, weft_store::ids::id_hash(t, k, i), "{t}/{k}/{i}");
        // The tenant's own hash, which picks its narrative shard on both sides.
        let got: u64 = client
            .query("SELECT xxHash64({t:String})")
            .param("t", t)
            .fetch_one()
            .await
            .unwrap();
        assert_eq!(got, weft_store::ids::tenant_hash(t), "{t}");
    }
}

/// An event without a request id whose pass was killed after its links by target but before
/// the rest is known to ClickHouse only by those links. After a restart, an event with a
/// request id that links to it must keep that link when another event of the same pass
/// loads it as a neighbor (a spared target the load brings in is no longer spared); and the
/// killed event's replay lands where a rebuild puts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_known_only_by_its_links_is_not_passed_over_after_a_restart() {
    let mut h = Harness::new("it_evict_links_only", 30).await;
    h.feed(&[handle("h-1", None)], 1).await;
    h.feed(&[frame("f-1", &["h-1"])], 1).await;
    // The kill, between the pass's `weft_links` insert and the next ones: f-1 is known only
    // as the source of a link by target, so the open filter cannot hold it, and the pass
    // below must keep te-1's link to it because its load brings f-1 in.
    for (t, id) in [
        ("weft_links_from", "from_id"),
        ("weft_narratives", "id"),
        ("weft_narrative_nodes", "id"),
    ] {
        h.store
            .client()
            .query(&format!("DELETE FROM {t} WHERE {id} = 'f-1'"))
            .execute()
            .await
            .unwrap();
    }
    h.projector = Projector::load(h.store.clone(), 30).await.unwrap();
    common::facts::wait_for_id_filters(&h.projector).await;
    // One pass: a trace event of req-1 citing f-1, and a frame without a request id citing
    // h-1 (its load brings f-1 in as h-1's neighbor).
    let te = env(
        Kind::TraceEvent,
        Some("req-1"),
        json!({"event_id": "te-1", "event_type": "capability_executed",
               "timestamp": "2026-03-08T06:00:05Z", "frame_id": "f-1"}),
    );
    h.feed(&[te, frame("f-2", &["h-1"])], 2).await;
    // The replay of the killed pass.
    h.feed(&[frame("f-1", &["h-1"])], 1).await;
    h.assert_placed(&[
        ("frame", "f-1", "req-1"),
        ("handle", "h-1", "req-1"),
        ("frame", "f-2", "req-1"),
    ])
    .await;
    h.assert_exact().await;
}

/// An event placed directly (a new id with a request id, naming nothing in memory) is an
/// anchor a later load finds like any other; an identity stored again with a larger request
/// id (other content) is not new, so it goes through the graph and keeps its color.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_identity_keeps_its_smaller_request_after_a_direct_placement() {
    let mut h = Harness::warm("it_evict_direct", 30).await;
    let first = h.feed(&[trace("te-1", "req-1", "h-1")], 1).await;
    assert_eq!(
        first.direct, 1,
        "a new id naming nothing in memory: {first:?}"
    );
    assert_eq!(h.projector.graph_len(), 0);
    // The same identity, other content, another request.
    let again = trace_of("te-1", "req-2", "h-1", "capability_denied");
    let second = h.feed(&[again], 1).await;
    assert_eq!(second.direct, 0, "a stored id is looked up: {second:?}");
    // The handle comes late and without a request: the direct anchor's link brings it in.
    h.feed(&[handle("h-1", None)], 1).await;
    h.assert_placed(&[("trace_event", "te-1", "req-1"), ("handle", "h-1", "req-1")])
        .await;
    h.assert_exact().await;
}

/// An identity stored again with a smaller request id takes it, and so does everything
/// anchored to it: what its stored version links to (a colored event's own links are not
/// indexed by source) and what links to it, long evicted and after a restart. A rebuild gives
/// the same in either order of the facts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identity_stored_again_with_a_smaller_request_takes_it_with_all_anchored_to_it() {
    let mut h = Harness::warm("it_evict_recolor", 30).await;
    // te-1 (req-b) names h-1; f-1 cites h-1. h-2 (req-d) is cited by f-2. h-3 (req-f) is
    // named by nothing yet.
    h.feed(
        &[
            trace("te-1", "req-b", "h-1"),
            handle("h-1", None),
            frame("f-1", &["h-1"]),
            handle_in("h-2", None, Some("req-d")),
            frame("f-2", &["h-2"]),
            handle_in("h-3", None, Some("req-f")),
        ],
        6,
    )
    .await;
    h.assert_placed(&[("frame", "f-1", "req-b"), ("frame", "f-2", "req-d")])
        .await;
    let churn = h.feed(&filler("r", 300), 20).await;
    assert!(churn.evicted > 500, "{churn:?}");
    h.projector = Projector::load(h.store.clone(), 30).await.unwrap();
    common::facts::wait_for_id_filters(&h.projector).await;
    // Second versions, naming nothing: only their stored links reach the components.
    // h-3 comes again with, in the same pass, a new frame without a request citing it.
    let again = h
        .feed(
            &[
                trace_again("te-1", "req-a"),
                handle_again("h-2", "req-c"),
                handle_again("h-3", "req-e"),
                frame("f-3", &["h-3"]),
            ],
            4,
        )
        .await;
    assert!(
        again.loaded >= 5,
        "both and their components came back: {again:?}"
    );
    h.assert_placed(&[
        ("trace_event", "te-1", "req-a"),
        ("handle", "h-1", "req-a"),
        ("frame", "f-1", "req-a"),
        ("handle", "h-2", "req-c"),
        ("frame", "f-2", "req-c"),
        ("handle", "h-3", "req-e"),
        ("frame", "f-3", "req-e"),
    ])
    .await;
    h.assert_exact().await;
    assert_eq!(Harness::rebuilt_from(h.fed.iter().rev()), h.rebuilt());
}

/// Recoloring a hub loads the uncolored components around it, not the events with a request
/// id that cite it: those keep their own narrative whatever the hub's color. It used to load
/// every one (a decision cited by a million requests: a million nodes in one pass).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recoloring_a_hub_loads_only_what_can_move() {
    const CITING: usize = 200;
    let mut h = Harness::warm("it_evict_hub", 30).await;
    let mut first = vec![
        handle_in("h-hub", None, Some("req-m")),
        frame("f-hub", &["h-hub"]),
    ];
    first
        .extend((0..CITING).map(|i| trace(&format!("te-cite-{i}"), &format!("req-x{i}"), "h-hub")));
    h.feed(&first, 50).await;
    h.assert_placed(&[("frame", "f-hub", "req-m")]).await;
    let churn = h.feed(&filler("hub", 300), 20).await;
    assert!(churn.evicted > 500, "{churn:?}");
    h.projector = Projector::load(h.store.clone(), 30).await.unwrap();
    common::facts::wait_for_id_filters(&h.projector).await;
    let again = h.feed(&[handle_again("h-hub", "req-a")], 1).await;
    assert!(
        again.loaded < 20,
        "the hub, its frame and their neighbors, not the {CITING} citing events: {again:?}"
    );
    h.assert_placed(&[("handle", "h-hub", "req-a"), ("frame", "f-hub", "req-a")])
        .await;
    h.assert_placed(&[("trace_event", "te-cite-7", "req-x7")])
        .await;
    h.assert_exact().await;
    assert_eq!(Harness::rebuilt_from(h.fed.iter().rev()), h.rebuilt());
}

/// A pass that recolors an identity, killed after any of its writes (see
/// `tests/narrative_crash_points.rs`) and replayed by a restarted projector, ends as the
/// rebuild says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recolor_killed_after_any_write_is_finished_by_the_replay() {
    for at in [KillAfter::Links, KillAfter::Narratives, KillAfter::Nodes] {
        let mut h = Harness::warm("it_evict_recolor_kill", 30).await;
        h.feed(
            &[
                trace("te-1", "req-b", "h-1"),
                handle("h-1", None),
                frame("f-1", &["h-1"]),
            ],
            3,
        )
        .await;
        h.feed(&filler("k", 100), 20).await;
        h.feed(&[trace_again("te-1", "req-a")], 1).await;
        let version: u64 = h
            .store
            .client()
            .query("SELECT max(version) FROM weft_projector_progress")
            .fetch_one()
            .await
            .unwrap();
        unwrite(&h.store, version, at).await;
        h.projector = Projector::load(h.store.clone(), 30).await.unwrap();
        h.replay(1).await;
        h.assert_placed(&[
            ("trace_event", "te-1", "req-a"),
            ("handle", "h-1", "req-a"),
            ("frame", "f-1", "req-a"),
        ])
        .await;
        h.assert_exact().await;
    }
}

/// An id named before only by events with a request id has no node row: the event that
/// brings it, with a request id of its own, is probed (node rows only), nothing is loaded,
/// and it is placed directly in its own request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_named_only_by_anchors_is_probed_and_placed_directly() {
    let mut h = Harness::warm("it_evict_probe", 30).await;
    h.feed(&[trace("te-1", "req-1", "h-1")], 1).await;
    let s = h.feed(&[handle_in("h-1", None, Some("req-h"))], 1).await;
    assert_eq!((s.direct, s.loaded), (1, 0), "{s:?}");
    h.assert_placed(&[("handle", "h-1", "req-h"), ("trace_event", "te-1", "req-1")])
        .await;
    h.assert_exact().await;
}

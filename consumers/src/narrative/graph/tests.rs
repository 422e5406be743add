//! Unit tests of the graph: arrival order, ties, late anchors, tenants, eviction.

use super::*;
use weft_schemas::links::NodeKind;

fn link(via: Via, kind: Kind, id: &str) -> Link {
    Link {
        via,
        to_kind: NodeKind::Event(kind),
        to_id: id.into(),
    }
}

type Ev = (Kind, &'static str, &'static str, Vec<Link>);

/// A flow: token <- decision <- trace event -> frame -> handle; only the trace event
/// carries the request id.
fn flow(req: &'static str, p: &'static str) -> Vec<Ev> {
    let s = |x: &str| -> &'static str { Box::leak(format!("{p}{x}").into_boxed_str()) };
    vec![
        (Kind::CapabilityToken, s("tok"), "", vec![]),
        (
            Kind::PolicyDecision,
            s("pd"),
            "",
            vec![link(Via::TokenId, Kind::CapabilityToken, s("tok"))],
        ),
        (
            Kind::TraceEvent,
            s("te"),
            req,
            vec![
                link(Via::DecisionId, Kind::PolicyDecision, s("pd")),
                link(Via::FrameId, Kind::Frame, s("fr")),
                link(Via::HandleId, Kind::Handle, s("h")),
            ],
        ),
        (
            Kind::Frame,
            s("fr"),
            "",
            vec![link(Via::HandleRefs, Kind::Handle, s("h"))],
        ),
        (Kind::Handle, s("h"), "", vec![]),
    ]
}

fn run(events: &[Ev]) -> Vec<(String, String)> {
    let mut g = Graph::new();
    for (kind, id, req, links) in events {
        let n = g.add_event(NodeKey::event("t", *kind, id), req, 0, links);
        let seeds = g.seeds(n);
        g.settle(&seeds);
    }
    let mut out: Vec<(String, String)> = (0..g.len() as NodeIdx)
        .filter_map(|n| Some((g.key(n).id.to_string(), g.assigned(n)?.to_string())))
        .collect();
    out.sort();
    out
}

#[test]
fn uncolored_events_join_the_request_through_the_chain() {
    let got = run(&flow("req-1", "a-"));
    assert_eq!(got.len(), 5);
    assert!(got.iter().all(|(_, n)| n == "req-1"), "{got:?}");
}

#[test]
fn every_arrival_order_gives_the_same_narratives() {
    let mut events = flow("req-1", "a-");
    events.extend(flow("req-2", "b-"));
    // A cross-request reference: b's frame also cites a's handle (lower priority than
    // its own handle link? equal: handle_refs). Ties go to the smaller narrative id.
    events[8].3.push(link(Via::HandleRefs, Kind::Handle, "a-h"));
    let want = run(&events);
    // Deterministic pseudo-random permutations.
    let mut seed = 7u64;
    for _ in 0..200 {
        let mut perm = events.clone();
        for i in (1..perm.len()).rev() {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let j = (seed >> 33) as usize % (i + 1);
            perm.swap(i, j);
        }
        assert_eq!(run(&perm), want);
    }
    let map: HashMap<_, _> = want.into_iter().collect();
    assert_eq!(map["b-fr"], "req-2", "its own trace event is nearer");
    assert_eq!(map["a-h"], "req-1");
}

#[test]
fn an_identity_with_two_request_ids_takes_the_smaller_in_every_order() {
    // One trace event stored twice (other content) in req-b and in req-a, and a handle
    // without a request that only it names: both end in req-a, whatever the order.
    let te = |req: &'static str| {
        (
            Kind::TraceEvent,
            "te",
            req,
            vec![link(Via::HandleId, Kind::Handle, "h")],
        )
    };
    let h = (Kind::Handle, "h", "", vec![]);
    let want = vec![
        ("h".to_owned(), "req-a".to_owned()),
        ("te".into(), "req-a".into()),
    ];
    for events in [
        vec![te("req-b"), h.clone(), te("req-a")],
        vec![te("req-a"), h.clone(), te("req-b")],
        vec![h.clone(), te("req-b"), te("req-a")],
        vec![te("req-b"), te("req-a"), h],
    ] {
        assert_eq!(run(&events), want, "{events:?}");
    }
    let mut g = Graph::new();
    let key = NodeKey::event("t", Kind::TraceEvent, "te");
    assert!(!g.would_recolor(&key, "req-a"), "not in memory");
    g.add_event(key.clone(), "req-b", 0, &[]);
    assert!(g.would_recolor(&key, "req-a"));
    assert!(!g.would_recolor(&key, "req-c"));
    assert!(!g.would_recolor(&key, ""));
    assert!(takes_color(None, "req-b") && takes_color(Some("req-b"), "req-a"));
    assert!(!takes_color(None, "") && !takes_color(Some("req-a"), "req-a"));
}

#[test]
fn priority_breaks_ties_between_equally_near_requests() {
    // An uncolored frame linked at distance 1 to two colored events: one via frame_id
    // (priority 2), one via prior_frame_id (priority 8). frame_id wins.
    let events: Vec<Ev> = vec![
        (Kind::Frame, "f", "", vec![]),
        (
            Kind::TraceEvent,
            "te-z",
            "req-z",
            vec![link(Via::FrameId, Kind::Frame, "f")],
        ),
        (
            Kind::TraceEvent,
            "te-a",
            "req-a",
            vec![link(Via::PriorFrameId, Kind::Frame, "f")],
        ),
    ];
    let got: HashMap<_, _> = run(&events).into_iter().collect();
    assert_eq!(got["f"], "req-z");
}

#[test]
fn late_anchor_reassigns_and_reports_the_old_narrative() {
    let mut g = Graph::new();
    let h = g.add_event(NodeKey::event("t", Kind::Handle, "h"), "", 0, &[]);
    let c = g.settle(&g.seeds(h));
    assert_eq!(c.len(), 1);
    assert_eq!(&*c[0].new, "adhoc:handle:h");
    let te = g.add_event(
        NodeKey::event("t", Kind::TraceEvent, "te"),
        "req",
        0,
        &[link(Via::HandleId, Kind::Handle, "h")],
    );
    let c = g.settle(&g.seeds(te));
    let moved = c.iter().find(|c| c.node == h).unwrap();
    assert_eq!(moved.old.as_deref(), Some("adhoc:handle:h"));
    assert_eq!(&*moved.new, "req");
}

#[test]
fn tenants_never_link() {
    let mut g = Graph::new();
    let a = g.add_event(
        NodeKey::event("A", Kind::TraceEvent, "te"),
        "req",
        0,
        &[link(Via::HandleId, Kind::Handle, "h")],
    );
    g.settle(&g.seeds(a));
    let b = g.add_event(NodeKey::event("B", Kind::Handle, "h"), "", 0, &[]);
    let c = g.settle(&g.seeds(b));
    assert_eq!(&*c[0].new, "adhoc:handle:h");
}

/// After an eviction every kept node is still found by its key at its new place, and every
/// link is held by both of its ends there.
fn assert_consistent(g: &Graph) {
    assert_eq!(g.index.len(), g.nodes.len());
    for (i, node) in g.nodes.iter().enumerate() {
        let i = i as NodeIdx;
        assert_eq!(g.lookup(&node.key), Some(i), "{:?}", node.key);
        for &(p, via) in &node.adj {
            let back = &g.nodes[p as usize].adj;
            assert!(back.contains(&(i, via)), "{:?} -> {p}", node.key);
        }
    }
}

#[test]
fn eviction_drops_whole_stale_components_and_keeps_the_current_pass() {
    let mut g = Graph::new();
    // Pass 1: request a (te with a handle and a frame); pass 2: request b.
    for (pass, p) in [(1, "a-"), (2, "b-")] {
        g.begin_pass();
        let req = if pass == 1 { "req-a" } else { "req-b" };
        for (kind, id, r, links) in flow(req, p) {
            let n = g.add_event(
                NodeKey::event("t", kind, id),
                if r.is_empty() { "" } else { req },
                0,
                &links,
            );
            let seeds = g.seeds(n);
            g.settle(&seeds);
        }
    }
    assert_eq!(g.len(), 10);
    let evicted = g.evict(6);
    assert_eq!(
        evicted, 5,
        "all of pass 1's request goes, nothing of pass 2's"
    );
    assert_consistent(&g);
    for id in ["b-tok", "b-pd", "b-te", "b-fr", "b-h"] {
        let n = g
            .lookup(&NodeKey::event("t", Kind::CapabilityToken, id))
            .or_else(|| g.lookup(&NodeKey::event("t", Kind::PolicyDecision, id)))
            .or_else(|| g.lookup(&NodeKey::event("t", Kind::TraceEvent, id)))
            .or_else(|| g.lookup(&NodeKey::event("t", Kind::Frame, id)))
            .or_else(|| g.lookup(&NodeKey::event("t", Kind::Handle, id)));
        let n = n.unwrap_or_else(|| panic!("{id} was evicted"));
        assert_eq!(g.assigned(n).map(|s| &**s), Some("req-b"));
    }
    // Nothing the current pass touched goes, even over the budget.
    assert_eq!(g.evict(0), 0);
    g.begin_pass();
    assert_eq!(g.evict(0), 5);
    assert!(g.is_empty());
}

/// The projector's cycle (a pass, then eviction once over the budget, down to 3/4 of it)
/// never makes the node table or the index grow: they were sized for the budget at start.
#[test]
fn a_graph_at_its_budget_never_grows_its_tables() {
    let mut g = Graph::with_budget(20);
    let room = (g.nodes.capacity(), g.index.capacity());
    assert!(room.0 >= 30 && room.1 >= 30, "{room:?}");
    for pass in 0..40 {
        g.begin_pass();
        let p: &'static str = Box::leak(format!("p{pass}-").into_boxed_str());
        for (kind, id, r, links) in flow("req", p) {
            let n = g.add_event(NodeKey::event("t", kind, id), r, 0, &links);
            let seeds = g.seeds(n);
            g.settle(&seeds);
        }
        if g.len() > 20 {
            g.evict(15);
        }
    }
    assert_eq!((g.nodes.capacity(), g.index.capacity()), room);
}

#[test]
fn a_colored_node_stays_while_a_kept_component_borders_it() {
    let mut g = Graph::new();
    let add = |g: &mut Graph, kind, id, req, links: &[Link]| {
        g.begin_pass();
        let n = g.add_event(NodeKey::event("t", kind, id), req, 0, links);
        g.settle(&g.seeds(n));
    };
    // te (colored) borders h1's component and, from pass 2, f2's; pass 3 grows f2's.
    add(
        &mut g,
        Kind::TraceEvent,
        "te",
        "req",
        &[link(Via::HandleId, Kind::Handle, "h1")],
    );
    add(
        &mut g,
        Kind::Frame,
        "f2",
        "",
        &[link(Via::FrameId, Kind::TraceEvent, "te")],
    );
    add(
        &mut g,
        Kind::Handle,
        "g2",
        "",
        &[link(Via::HandleRefs, Kind::Frame, "f2")],
    );
    g.begin_pass();
    assert_eq!(g.evict(3), 1, "only h1's component is older than f2's");
    assert!(g.lookup(&NodeKey::event("t", Kind::Handle, "h1")).is_none());
    assert_consistent(&g);
    let te = g
        .lookup(&NodeKey::event("t", Kind::TraceEvent, "te"))
        .unwrap();
    assert!(!g.nodes[te as usize].complete, "te lost its link to h1");
    assert!(!g.needs_load(g.key(te)), "a colored node may be partial");
    let f2 = g.lookup(&NodeKey::event("t", Kind::Frame, "f2")).unwrap();
    assert_eq!(g.assigned(f2).map(|s| &**s), Some("req"));
}

//! The narrative assignment rule, as a pure in-memory graph algorithm.
//!
//! Nodes are events (and two kinds of stand-ins: flows, which every event with the same
//! `metadata.flow_id` links to, and "phantoms", ids that are referenced but have not arrived).
//! Edges are the id links of [`weft_schemas::links`], undirected for this purpose.
//!
//! **The rule.** An event that carries a request id belongs to that request's narrative
//! ("colored"). Any other node takes the narrative of its *nearest* colored node through
//! uncolored nodes; among equally near candidates, the one reached over the edge with the
//! highest [`Via`] priority wins (decision, frame, handle, handle_refs, token, feedback,
//! flow, prior_frame, frame_ids), then the smallest narrative id. A component with no
//! colored node at all forms its own narrative, `adhoc:<kind>:<id>` of its smallest event.
//!
//! Because the rule is a function of the final graph only, the narratives are the same
//! whatever order the events arrived in; [`Graph::settle`] recomputes, after each arrival,
//! every uncolored component the new event touches, which is what keeps the incremental
//! result equal to a from-scratch rebuild.

use std::sync::Arc;

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use weft_schemas::links::{Link, NodeKind, Via};
use weft_schemas::Kind;

/// Identity of a node: the tenant is part of it, so links never cross tenants.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeKey {
    /// Tenant the node belongs to.
    pub tenant: Arc<str>,
    /// An event kind, or a flow.
    pub kind: NodeKind,
    /// The event's identity, or the flow id.
    pub id: Arc<str>,
}

impl NodeKey {
    /// The key of an event node.
    pub fn event(tenant: &str, kind: Kind, id: &str) -> Self {
        Self {
            tenant: tenant.into(),
            kind: NodeKind::Event(kind),
            id: id.into(),
        }
    }
}

/// Dense index of a node inside a [`Graph`].
pub type NodeIdx = u32;

#[derive(Debug)]
struct Node {
    key: NodeKey,
    /// The request id, when this node is an arrived event that carries one.
    color: Option<Arc<str>>,
    /// `true` once the event itself arrived (flows and phantoms stay `false`).
    present: bool,
    adj: Vec<(NodeIdx, Via)>,
    /// The narrative currently published for this node (present nodes only).
    assigned: Option<Arc<str>>,
}

/// A narrative assignment that changed: publish `new`, retract `old` if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The node whose narrative changed.
    pub node: NodeIdx,
    /// The narrative it leaves, `None` on its first assignment.
    pub old: Option<Arc<str>>,
    /// The narrative it now belongs to.
    pub new: Arc<str>,
}

/// The link graph of the events seen so far, with current assignments.
#[derive(Debug, Default)]
pub struct Graph {
    index: HashMap<NodeKey, NodeIdx>,
    nodes: Vec<Node>,
    /// Components larger than this are not expanded further (logged by the caller).
    pub max_component: usize,
    /// Set when the last settle hit `max_component`.
    pub truncated: bool,
}

impl Graph {
    /// An empty graph that expands components up to 200,000 nodes.
    pub fn new() -> Self {
        Self {
            max_component: 200_000,
            ..Self::default()
        }
    }

    /// Number of nodes, including flows and phantoms.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// `true` before any node was added.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The identity of a node.
    pub fn key(&self, n: NodeIdx) -> &NodeKey {
        &self.nodes[n as usize].key
    }

    /// The index of a known node, `None` if it was never added.
    pub fn lookup(&self, key: &NodeKey) -> Option<NodeIdx> {
        self.index.get(key).copied()
    }

    /// The narrative currently assigned to a node.
    pub fn assigned(&self, n: NodeIdx) -> Option<&Arc<str>> {
        self.nodes[n as usize].assigned.as_ref()
    }

    fn intern(&mut self, key: NodeKey) -> NodeIdx {
        if let Some(i) = self.index.get(&key) {
            return *i;
        }
        let i = self.nodes.len() as NodeIdx;
        self.index.insert(key.clone(), i);
        self.nodes.push(Node {
            key,
            color: None,
            present: false,
            adj: Vec::new(),
            assigned: None,
        });
        i
    }

    fn connect(&mut self, a: NodeIdx, b: NodeIdx, via: Via) {
        if a == b {
            return;
        }
        if !self.nodes[a as usize].adj.contains(&(b, via)) {
            self.nodes[a as usize].adj.push((b, via));
            self.nodes[b as usize].adj.push((a, via));
        }
    }

    /// Record an arrived event with its request id (empty = none) and outgoing links.
    /// Returns its index. Call [`Graph::settle`] with [`Graph::seeds`] afterwards.
    pub fn add_event(&mut self, key: NodeKey, request_id: &str, links: &[Link]) -> NodeIdx {
        let tenant = key.tenant.clone();
        let me = self.intern(key);
        let node = &mut self.nodes[me as usize];
        node.present = true;
        if !request_id.is_empty() && node.color.is_none() {
            node.color = Some(request_id.into());
        }
        for l in links {
            let peer = self.intern(NodeKey {
                tenant: tenant.clone(),
                kind: l.to_kind,
                id: l.to_id.as_str().into(),
            });
            self.connect(me, peer, l.via);
        }
        me
    }

    /// Reload an arrived event without its links (they are added with [`Graph::add_link`]).
    pub fn add_node(&mut self, key: NodeKey, request_id: &str) -> NodeIdx {
        self.add_event(key, request_id, &[])
    }

    /// Reload one link between two nodes.
    pub fn add_link(&mut self, from: NodeKey, to: NodeKey, via: Via) {
        let a = self.intern(from);
        let b = self.intern(to);
        self.connect(a, b, via);
    }

    /// `true` when the node is an arrived event (not a flow or a phantom).
    pub fn is_present(&self, n: NodeIdx) -> bool {
        self.nodes[n as usize].present
    }

    /// Restore a previously published assignment (after a restart), so that only real
    /// changes are published again.
    pub fn restore_assignment(&mut self, n: NodeIdx, narrative: &str) {
        self.nodes[n as usize].assigned = Some(narrative.into());
    }

    /// The nodes whose narrative may change after `n` arrived: itself and its neighbors.
    pub fn seeds(&self, n: NodeIdx) -> Vec<NodeIdx> {
        let mut s = vec![n];
        s.extend(self.nodes[n as usize].adj.iter().map(|(p, _)| *p));
        s
    }

    /// Recompute the narratives around `seeds` and return what changed.
    pub fn settle(&mut self, seeds: &[NodeIdx]) -> Vec<Change> {
        self.truncated = false;
        let mut changes = Vec::new();
        let mut done: HashSet<NodeIdx> = HashSet::default();
        for &s in seeds {
            let starts: Vec<NodeIdx> = match &self.nodes[s as usize].color {
                Some(c) => {
                    let c = c.clone();
                    self.publish(s, c, &mut changes);
                    self.nodes[s as usize]
                        .adj
                        .iter()
                        .map(|(p, _)| *p)
                        .filter(|p| self.nodes[*p as usize].color.is_none())
                        .collect()
                }
                None => vec![s],
            };
            for start in starts {
                if done.contains(&start) {
                    continue;
                }
                let component = self.component(start);
                done.extend(component.iter().copied());
                self.assign_component(&component, &mut changes);
            }
        }
        changes
    }

    /// Recompute every node (used by `weft rebuild`).
    pub fn settle_all(&mut self) -> Vec<Change> {
        let all: Vec<NodeIdx> = (0..self.nodes.len() as NodeIdx).collect();
        self.settle(&all)
    }

    fn publish(&mut self, n: NodeIdx, narrative: Arc<str>, changes: &mut Vec<Change>) {
        let node = &mut self.nodes[n as usize];
        if !node.present || node.assigned.as_deref() == Some(&*narrative) {
            return;
        }
        let old = node.assigned.replace(narrative.clone());
        changes.push(Change {
            node: n,
            old,
            new: narrative,
        });
    }

    /// The uncolored nodes connected to `start` through uncolored nodes.
    fn component(&mut self, start: NodeIdx) -> Vec<NodeIdx> {
        let mut seen = HashSet::from_iter([start]);
        let mut stack = vec![start];
        let mut out = Vec::new();
        while let Some(n) = stack.pop() {
            out.push(n);
            if out.len() >= self.max_component {
                self.truncated = true;
                break;
            }
            for &(p, _) in &self.nodes[n as usize].adj {
                if self.nodes[p as usize].color.is_none() && seen.insert(p) {
                    stack.push(p);
                }
            }
        }
        out
    }

    fn assign_component(&mut self, component: &[NodeIdx], changes: &mut Vec<Change>) {
        let members: HashSet<NodeIdx> = component.iter().copied().collect();
        // Layer 0: the colored neighbors of the component, with their own colors.
        let mut narrative: HashMap<NodeIdx, Arc<str>> = HashMap::default();
        let mut layer: Vec<NodeIdx> = Vec::new();
        for &u in component {
            for &(p, _) in &self.nodes[u as usize].adj {
                if let Some(c) = &self.nodes[p as usize].color {
                    if narrative.insert(p, c.clone()).is_none() {
                        layer.push(p);
                    }
                }
            }
        }
        // Breadth-first, one whole layer at a time, so that every candidate of a node is
        // known before its choice is made.
        while !layer.is_empty() {
            let mut best: HashMap<NodeIdx, (Via, Arc<str>)> = HashMap::default();
            for &v in &layer {
                let nv = narrative[&v].clone();
                for &(u, via) in &self.nodes[v as usize].adj {
                    if !members.contains(&u) || narrative.contains_key(&u) {
                        continue;
                    }
                    let cand = (via, nv.clone());
                    match best.get(&u) {
                        Some(b) if *b <= cand => {}
                        _ => {
                            best.insert(u, cand);
                        }
                    }
                }
            }
            let mut next: Vec<NodeIdx> = best.keys().copied().collect();
            next.sort_unstable();
            for u in &next {
                narrative.insert(*u, best[u].1.clone());
            }
            layer = next;
        }
        // Nodes no colored node reaches: one ad-hoc narrative for the component.
        let adhoc: Option<Arc<str>> = component
            .iter()
            .filter(|u| self.nodes[**u as usize].present)
            .map(|u| &self.nodes[*u as usize].key)
            .min()
            .map(|k| format!("adhoc:{}:{}", k.kind.as_str(), k.id).into());
        for &u in component {
            let n = narrative.get(&u).cloned().or_else(|| adhoc.clone());
            if let Some(n) = n {
                self.publish(u, n, changes);
            }
        }
    }
}

#[cfg(test)]
mod tests {
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
            let n = g.add_event(NodeKey::event("t", *kind, id), req, links);
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
        let h = g.add_event(NodeKey::event("t", Kind::Handle, "h"), "", &[]);
        let c = g.settle(&g.seeds(h));
        assert_eq!(c.len(), 1);
        assert_eq!(&*c[0].new, "adhoc:handle:h");
        let te = g.add_event(
            NodeKey::event("t", Kind::TraceEvent, "te"),
            "req",
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
            &[link(Via::HandleId, Kind::Handle, "h")],
        );
        g.settle(&g.seeds(a));
        let b = g.add_event(NodeKey::event("B", Kind::Handle, "h"), "", &[]);
        let c = g.settle(&g.seeds(b));
        assert_eq!(&*c[0].new, "adhoc:handle:h");
    }
}

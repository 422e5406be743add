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

/// Dense index of a node inside a [`Graph`]; valid until the next [`Graph::evict`].
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
    /// The event's own time (micros), 0 for flows and phantoms.
    ts: i64,
    /// The pass that last touched the node, for least-recently-touched eviction.
    touched: u64,
    /// Every link of the node is in memory. Uncolored nodes are always complete between
    /// loads (see [`Graph`]); a colored node loaded at a component's edge may not be.
    complete: bool,
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

/// What a stored event says about itself when its node is loaded.
#[derive(Debug, Clone)]
pub struct Stored<'a> {
    /// Its request id, empty when none.
    pub request_id: &'a str,
    /// The narrative it was last published in.
    pub narrative: &'a str,
    /// Its own time (micros).
    pub ts: i64,
}

/// The link graph of the events in memory, with current assignments.
///
/// **Invariant:** every uncolored node in memory has all its links in memory, so its whole
/// uncolored component and the colored nodes around it are here, and [`Graph::settle`]
/// assigns it exactly as a rebuild over all events would. A colored node's own narrative is
/// its request id whatever its links, so colored nodes may be held with only some of them.
/// [`Graph::evict`] keeps the invariant by dropping whole uncolored components (and only the
/// colored nodes no kept component touches); the projector keeps it by loading the
/// component of every id a pass names that is not in memory before the pass settles.
#[derive(Debug, Default)]
pub struct Graph {
    index: HashMap<NodeKey, NodeIdx>,
    nodes: Vec<Node>,
    tenants: HashSet<Arc<str>>,
    /// The current pass, stamped on every node it touches.
    pass: u64,
    /// Size of the largest uncolored component the last [`Graph::settle`] assigned.
    pub largest_component: usize,
}

impl Graph {
    /// An empty graph.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty graph with room for `max_nodes` and half as many more (what one pass may add
    /// before it is evicted back under the budget), claimed now: the node table and the
    /// index never double later, when a long run first reaches a larger pass (a doubling of
    /// the node table added 32 MB to a soak's second half, the jemalloc heap profile showed).
    pub fn with_budget(max_nodes: usize) -> Self {
        let room = max_nodes.saturating_add(max_nodes / 2);
        Self {
            index: HashMap::with_capacity_and_hasher(room, Default::default()),
            nodes: Vec::with_capacity(room),
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

    /// The key of a node of `tenant`, sharing one allocation per tenant.
    pub fn node_key(&mut self, tenant: &str, kind: NodeKind, id: &str) -> NodeKey {
        let tenant = match self.tenants.get(tenant) {
            Some(t) => t.clone(),
            None => {
                let t: Arc<str> = tenant.into();
                self.tenants.insert(t.clone());
                t
            }
        };
        NodeKey {
            tenant,
            kind,
            id: id.into(),
        }
    }

    /// The identity of a node.
    pub fn key(&self, n: NodeIdx) -> &NodeKey {
        &self.nodes[n as usize].key
    }

    /// The index of a node in memory, `None` if it is not.
    pub fn lookup(&self, key: &NodeKey) -> Option<NodeIdx> {
        self.index.get(key).copied()
    }

    /// The narrative currently assigned to a node.
    pub fn assigned(&self, n: NodeIdx) -> Option<&Arc<str>> {
        self.nodes[n as usize].assigned.as_ref()
    }

    /// The event's own time (micros), 0 for flows and phantoms.
    pub fn ts(&self, n: NodeIdx) -> i64 {
        self.nodes[n as usize].ts
    }

    /// The node's own request id (arrived events that carry one).
    pub fn request_id(&self, n: NodeIdx) -> Option<&Arc<str>> {
        self.nodes[n as usize].color.as_ref()
    }

    /// `true` when the node is an arrived event (not a flow or a phantom).
    pub fn is_present(&self, n: NodeIdx) -> bool {
        self.nodes[n as usize].present
    }

    /// Start a pass: nodes it touches are stamped with it.
    pub fn begin_pass(&mut self) {
        self.pass += 1;
    }

    /// `true` when `key` must be loaded before a pass may touch it: it is not in memory, or
    /// it is an uncolored node whose links are still being loaded.
    pub fn needs_load(&self, key: &NodeKey) -> bool {
        match self.lookup(key) {
            None => true,
            Some(n) => {
                let node = &self.nodes[n as usize];
                node.color.is_none() && !node.complete
            }
        }
    }

    /// `true` when the node is an arrived event with a request id.
    pub fn is_colored(&self, n: NodeIdx) -> bool {
        self.nodes[n as usize].color.is_some()
    }

    /// `true` when [`Graph::add_event`] with `request_id` would change the color of the
    /// colored node `key`: the identity is stored again with a smaller request id.
    pub fn would_recolor(&self, key: &NodeKey, request_id: &str) -> bool {
        self.lookup(key)
            .and_then(|n| self.nodes[n as usize].color.as_deref())
            .is_some_and(|c| takes_color(Some(c), request_id))
    }

    fn intern(&mut self, key: NodeKey, complete: bool) -> NodeIdx {
        if let Some(i) = self.index.get(&key) {
            self.nodes[*i as usize].touched = self.pass;
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
            ts: 0,
            touched: self.pass,
            complete,
        });
        i
    }

    fn connect(&mut self, a: NodeIdx, b: NodeIdx, via: Via) {
        if a == b {
            return;
        }
        // Links are kept on both ends, so the shorter list answers; a hub's (a flow's, or
        // a token's) can hold every event of its component.
        let (na, nb) = (&self.nodes[a as usize].adj, &self.nodes[b as usize].adj);
        let known = if na.len() <= nb.len() {
            na.contains(&(b, via))
        } else {
            nb.contains(&(a, via))
        };
        if !known {
            self.nodes[a as usize].adj.push((b, via));
            self.nodes[b as usize].adj.push((a, via));
        }
    }

    /// Record an arrived event with its request id (empty = none), its time and its
    /// outgoing links. Every id it names must be in memory or new (see [`Graph`]). Returns
    /// its index; call [`Graph::settle`] with [`Graph::seeds`] afterwards.
    ///
    /// An identity stored again with another request id (other content) is colored by the
    /// smallest of its request ids ([`takes_color`]). A smaller one recolors the node, so
    /// every uncolored component around it must be in memory first
    /// ([`Graph::would_recolor`], `loader::around`).
    pub fn add_event(
        &mut self,
        key: NodeKey,
        request_id: &str,
        ts: i64,
        links: &[Link],
    ) -> NodeIdx {
        let tenant = key.tenant.clone();
        let me = self.intern(key, true);
        let node = &mut self.nodes[me as usize];
        node.present = true;
        node.ts = ts;
        if takes_color(node.color.as_deref(), request_id) {
            node.color = Some(request_id.into());
        }
        for l in links {
            let peer = self.intern(
                NodeKey {
                    tenant: tenant.clone(),
                    kind: l.to_kind,
                    id: l.to_id.as_str().into(),
                },
                true,
            );
            self.connect(me, peer, l.via);
        }
        me
    }

    /// Load a node from storage, its links still to come ([`Graph::load_link`]): as a
    /// stored event when `stored` is given, else as a flow or phantom.
    pub fn load_node(&mut self, key: NodeKey, stored: Option<Stored<'_>>) -> NodeIdx {
        let n = self.intern(key, false);
        if let Some(s) = stored {
            let node = &mut self.nodes[n as usize];
            node.present = true;
            node.ts = s.ts;
            if !s.request_id.is_empty() {
                node.color = Some(s.request_id.into());
            }
            node.assigned = Some(s.narrative.into());
        }
        n
    }

    /// Load one stored link of `n`; returns the peer's index when the peer was not in
    /// memory (its own links must be loaded next if it turns out uncolored).
    pub fn load_link(&mut self, n: NodeIdx, peer: NodeKey, via: Via) -> Option<NodeIdx> {
        let new = self.lookup(&peer).is_none();
        let p = self.intern(peer, false);
        self.connect(n, p, via);
        new.then_some(p)
    }

    /// Mark a node's links as all loaded.
    pub fn set_complete(&mut self, n: NodeIdx) {
        self.nodes[n as usize].complete = true;
    }

    /// The nodes whose narrative may change after `n` arrived: itself and its neighbors.
    pub fn seeds(&self, n: NodeIdx) -> Vec<NodeIdx> {
        let mut s = vec![n];
        s.extend(self.nodes[n as usize].adj.iter().map(|(p, _)| *p));
        s
    }

    /// Recompute the narratives around `seeds` and return what changed. A seed named more
    /// than once is settled once: a pass of k events citing one colored hub names the hub k
    /// times, and each repeat used to scan all of its neighbors again (k × degree).
    pub fn settle(&mut self, seeds: &[NodeIdx]) -> Vec<Change> {
        self.largest_component = 0;
        let mut changes = Vec::new();
        let mut done: HashSet<NodeIdx> = HashSet::default();
        let mut seen: HashSet<NodeIdx> = HashSet::default();
        for &s in seeds {
            if !seen.insert(s) {
                continue;
            }
            self.nodes[s as usize].touched = self.pass;
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
                self.largest_component = self.largest_component.max(component.len());
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

    /// The uncolored nodes connected to `start` through uncolored nodes, stamped as touched.
    fn component(&mut self, start: NodeIdx) -> Vec<NodeIdx> {
        let mut seen = HashSet::from_iter([start]);
        let mut stack = vec![start];
        let mut out = Vec::new();
        while let Some(n) = stack.pop() {
            out.push(n);
            self.nodes[n as usize].touched = self.pass;
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

    /// Drop the least recently touched components until at most `keep` nodes remain, and
    /// return how many nodes went. Nothing the current pass touched goes, so a pass whose
    /// own components exceed `keep` keeps them (and the graph stays over `keep` until later
    /// passes move on). Indices change: no [`NodeIdx`] survives this call.
    pub fn evict(&mut self, keep: usize) -> usize {
        if self.nodes.len() <= keep {
            return 0;
        }
        let stamps = self.unit_stamps();
        // The cutoff: the smallest stamp whose removal (with every older one) leaves `keep`.
        let mut by_stamp: Vec<u64> = stamps.iter().copied().filter(|s| *s < self.pass).collect();
        by_stamp.sort_unstable();
        let excess = self.nodes.len() - keep;
        let Some(&cutoff) = by_stamp.get(excess.min(by_stamp.len()).saturating_sub(1)) else {
            return 0;
        };
        let before = self.nodes.len();
        self.retain(|n| stamps[n as usize] > cutoff);
        before - self.nodes.len()
    }

    /// Every node's eviction stamp: an uncolored node carries its component's latest touch;
    /// a colored node the latest of its own and of every uncolored component it borders, so
    /// that it never goes while a component that needs it stays.
    fn unit_stamps(&self) -> Vec<u64> {
        let mut stamp = vec![0u64; self.nodes.len()];
        let mut seen = vec![false; self.nodes.len()];
        let mut members: Vec<NodeIdx> = Vec::new();
        for start in 0..self.nodes.len() {
            if seen[start] || self.nodes[start].color.is_some() {
                continue;
            }
            members.clear();
            members.push(start as NodeIdx);
            seen[start] = true;
            let mut i = 0;
            let mut latest = 0;
            while i < members.len() {
                let n = &self.nodes[members[i] as usize];
                latest = latest.max(n.touched);
                for &(p, _) in &n.adj {
                    if self.nodes[p as usize].color.is_none() && !seen[p as usize] {
                        seen[p as usize] = true;
                        members.push(p);
                    }
                }
                i += 1;
            }
            for &m in &members {
                stamp[m as usize] = latest;
                for &(p, _) in &self.nodes[m as usize].adj {
                    if self.nodes[p as usize].color.is_some() {
                        stamp[p as usize] = stamp[p as usize].max(latest);
                    }
                }
            }
        }
        for (n, s) in self.nodes.iter().zip(stamp.iter_mut()) {
            if n.color.is_some() {
                *s = (*s).max(n.touched);
            }
        }
        stamp
    }

    /// Keep only the nodes `keep` accepts; a kept node that loses a link is no longer complete.
    fn retain(&mut self, keep: impl Fn(NodeIdx) -> bool) {
        let mut remap: Vec<Option<NodeIdx>> = Vec::with_capacity(self.nodes.len());
        let mut next = 0;
        for n in 0..self.nodes.len() as NodeIdx {
            remap.push(keep(n).then(|| {
                next += 1;
                next - 1
            }));
        }
        // The index keeps its keys where they are (no key is hashed again): a kept entry
        // takes its node's new place, a gone one leaves.
        self.index.retain(|_, i| match remap[*i as usize] {
            Some(to) => {
                *i = to;
                true
            }
            None => false,
        });
        let mut n = 0;
        self.nodes.retain_mut(|node| {
            let kept = remap[n].is_some();
            n += 1;
            if kept {
                let degree = node.adj.len();
                node.adj.retain_mut(|(p, _)| match remap[*p as usize] {
                    Some(to) => {
                        *p = to;
                        true
                    }
                    None => false,
                });
                if node.adj.len() < degree {
                    node.complete = false;
                }
            }
            kept
        });
    }
}

/// The color rule: request id `new` (empty = none) colors a node whose color is `current`
/// when it has none or `new` is smaller. A color therefore only ever gets smaller, and an
/// identity stored with several request ids takes the smallest, whatever their order, as
/// `weft rebuild` (which reads the facts in no particular order) does too. The loader and
/// the unfinished-pass restore read stored colors with `minIf` for the same reason.
pub fn takes_color(current: Option<&str>, new: &str) -> bool {
    !new.is_empty() && current.is_none_or(|c| new < c)
}

#[cfg(test)]
mod tests;

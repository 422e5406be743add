//! Realistic agent-kernel + ChainWeaver traffic, with the ground truth to check weft by.
//!
//! Why it exists: ingest, narratives and the audit can only be tested against a stream
//! whose right answer is known. The simulator writes that stream *and* the answer — which
//! event belongs to which request, how events link, which violations were injected — and
//! can make the stream hard on purpose (events without a request id, shuffled, held back,
//! duplicated), the way real producers behave.
//!
//! Every payload is built from the typed contracts in [`weft_schemas::contracts`] and
//! passes [`Envelope::validate`]. Output is deterministic: the same [`SimConfig`] gives
//! byte-identical envelopes, timestamps included (they derive from [`SimConfig::start`],
//! never from the clock).
//!
//! ```
//! use weft_sim::{generate, SimConfig};
//! let (envelopes, truth) = generate(&SimConfig { flows: 3, ..SimConfig::default() })?;
//! assert_eq!(truth.requests.len(), 3);
//! assert_eq!(truth.totals.envelopes as usize, envelopes.len());
//! # Ok::<(), weft_sim::SimError>(())
//! ```

#![warn(missing_docs)]

mod flow;
pub mod stream;
#[cfg(test)]
mod tests;
mod truth;

use std::collections::VecDeque;

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use weft_schemas::envelope::is_valid_tenant;
use weft_schemas::{Envelope, DEFAULT_TENANT};

pub use truth::{
    EventRef, GroundTruth, InjectedViolation, Invariant, Link, NodeKind, NodeRef, RequestTruth,
    Scenario, Totals, Via,
};

/// The default `--start`: a fixed instant, so outputs never depend on when they were made.
pub const DEFAULT_START: &str = "2026-11-01T00:00:00Z";

/// The longest gap between flow starts the simulator accepts (a day).
pub const MAX_FLOW_INTERVAL_MS: u64 = 86_400_000;

/// Why a simulation cannot start. Only the config can be wrong: generation itself is total.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A probability outside 0..=1.
    #[error("{name} is {value}; a proportion must be within 0..=1")]
    Proportion {
        /// The option, as named in [`SimConfig`] / [`Mix`].
        name: &'static str,
        /// The value given.
        value: f64,
    },
    /// Each flow gets at most one scenario, so their shares cannot exceed 1 together.
    #[error("the scenario proportions add up to {0}, more than 1")]
    MixOverOne(f64),
    /// The tenant would be refused by every weft stage.
    #[error("tenant `{0}` is not 1..=128 characters of [A-Za-z0-9_.-]")]
    Tenant(String),
    /// `start` does not parse as RFC 3339.
    #[error("start `{0}` is not an RFC 3339 timestamp (e.g. {DEFAULT_START})")]
    Start(String),
    /// Flow starts so far apart that times could overflow.
    #[error("flow interval {0} ms is longer than a day")]
    FlowInterval(u64),
}

/// How often each non-clean [`Scenario`] occurs, as a probability per flow. Each flow gets
/// at most one, so the sum must be at most 1; the rest are clean.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Mix {
    /// [`Scenario::Deny`]: a denied step, `flow_failed` (legitimate).
    pub deny: f64,
    /// [`Scenario::Partial`]: an execution with outcome `partial` (legitimate).
    pub partial: f64,
    /// [`Scenario::Failure`]: a failing tool, `flow_failed` (legitimate).
    pub failure: f64,
    /// [`Scenario::ExpiredToken`]: I-06.
    pub expired_token: f64,
    /// [`Scenario::ReusedToken`]: I-06.
    pub reused_token: f64,
    /// [`Scenario::OutOfScope`]: I-06.
    pub out_of_scope: f64,
    /// [`Scenario::Unauthorized`]: I-02.
    pub unauthorized: f64,
    /// [`Scenario::RawOutput`]: I-01.
    pub raw_output: f64,
    /// [`Scenario::Orphan`]: a reference that never resolves.
    pub orphan: f64,
    /// [`Scenario::IdConflict`]: one id, two contents.
    pub id_conflict: f64,
    /// [`Scenario::UnknownToken`]: I-06 `token_unknown`. 0 by default, so that the default
    /// streams of every seed stay what they were before it existed.
    pub unknown_token: f64,
}

impl Default for Mix {
    /// Mostly clean traffic: 4 % denials, 4 % partial, 3 % failures and 1 % of each of the
    /// seven older violations (about 82 % clean); no unknown token unless asked for.
    fn default() -> Self {
        Self {
            deny: 0.04,
            partial: 0.04,
            failure: 0.03,
            expired_token: 0.01,
            reused_token: 0.01,
            out_of_scope: 0.01,
            unauthorized: 0.01,
            raw_output: 0.01,
            orphan: 0.01,
            id_conflict: 0.01,
            unknown_token: 0.0,
        }
    }
}

impl Mix {
    /// Only clean flows: for throughput runs and tests that want no findings.
    pub fn clean() -> Self {
        Self {
            deny: 0.0,
            partial: 0.0,
            failure: 0.0,
            expired_token: 0.0,
            reused_token: 0.0,
            out_of_scope: 0.0,
            unauthorized: 0.0,
            raw_output: 0.0,
            orphan: 0.0,
            id_conflict: 0.0,
            unknown_token: 0.0,
        }
    }

    /// Each non-clean scenario with its probability, in a fixed order (the draw order; a
    /// scenario added later goes last, so the others' draws do not move).
    pub fn entries(&self) -> [(Scenario, f64); 11] {
        [
            (Scenario::Deny, self.deny),
            (Scenario::Partial, self.partial),
            (Scenario::Failure, self.failure),
            (Scenario::ExpiredToken, self.expired_token),
            (Scenario::ReusedToken, self.reused_token),
            (Scenario::OutOfScope, self.out_of_scope),
            (Scenario::Unauthorized, self.unauthorized),
            (Scenario::RawOutput, self.raw_output),
            (Scenario::Orphan, self.orphan),
            (Scenario::IdConflict, self.id_conflict),
            (Scenario::UnknownToken, self.unknown_token),
        ]
    }
}

/// Everything that decides a simulation's output. Same config ⇒ same bytes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SimConfig {
    /// Seeds every random choice; also part of every id (`req-<seed>-<n>`), so runs with
    /// different seeds never collide in one store.
    pub seed: u64,
    /// Number of flows (= requests) to generate.
    pub flows: u64,
    /// When set, keep generating whole flows until at least this many envelopes have been
    /// produced (duplicates included); `flows` is then ignored.
    pub min_events: Option<u64>,
    /// RFC 3339 time of flow 0.
    pub start: String,
    /// Mean gap between flow starts, in ms; flows overlap in time like real traffic.
    pub flow_interval_ms: u64,
    /// Tenant of every envelope.
    pub tenant: String,
    /// How often each variation occurs.
    pub mix: Mix,
    /// Fraction of events sent without a request id. Only events that stay linked by id to
    /// an event of their request that keeps its request id are eligible, so the narrative
    /// builder can always recover them; the RoutingDecision always keeps it.
    pub no_request_id: f64,
    /// Fraction of envelopes sent a second time, byte for byte.
    pub duplicates: f64,
    /// Fraction of flows whose RoutingDecision is sent twice: first pending
    /// (`selected_item_id` and `selected_card_id` null, as weaver-spec allows while the LLM
    /// has not answered), then selected. Legitimate: the audit must report nothing for it.
    pub pending_routing: f64,
    /// Fraction of envelopes held back and emitted after all the others.
    pub delay: f64,
    /// Shuffle the stream (within windows of `shuffle_window` envelopes).
    pub shuffle: bool,
    /// Window of the shuffle, in envelopes; 0 shuffles the whole stream in memory.
    pub shuffle_window: usize,
    /// Keep the ground truth (costs memory proportional to the stream).
    pub record_truth: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            seed: 1,
            flows: 100,
            min_events: None,
            start: DEFAULT_START.into(),
            flow_interval_ms: 100,
            tenant: DEFAULT_TENANT.into(),
            mix: Mix::default(),
            no_request_id: 0.0,
            duplicates: 0.0,
            pending_routing: 0.0,
            delay: 0.0,
            shuffle: false,
            shuffle_window: 10_000,
            record_truth: true,
        }
    }
}

impl SimConfig {
    /// Check the config; on success return the start time in µs since the epoch.
    pub fn check(&self) -> Result<i64, SimError> {
        let mut sum = 0.0;
        for (s, p) in self.mix.entries() {
            proportion(scenario_name(s), p)?;
            sum += p;
        }
        if sum > 1.0 + 1e-9 {
            return Err(SimError::MixOverOne(sum));
        }
        proportion("no_request_id", self.no_request_id)?;
        proportion("duplicates", self.duplicates)?;
        proportion("pending_routing", self.pending_routing)?;
        proportion("delay", self.delay)?;
        if !is_valid_tenant(&self.tenant) {
            return Err(SimError::Tenant(self.tenant.clone()));
        }
        if self.flow_interval_ms > MAX_FLOW_INTERVAL_MS {
            return Err(SimError::FlowInterval(self.flow_interval_ms));
        }
        weft_schemas::time::parse_micros(&self.start)
            .ok_or_else(|| SimError::Start(self.start.clone()))
    }
}

fn scenario_name(s: Scenario) -> &'static str {
    match s {
        Scenario::Clean => "clean",
        Scenario::Deny => "deny",
        Scenario::Partial => "partial",
        Scenario::Failure => "failure",
        Scenario::ExpiredToken => "expired_token",
        Scenario::ReusedToken => "reused_token",
        Scenario::OutOfScope => "out_of_scope",
        Scenario::Unauthorized => "unauthorized",
        Scenario::RawOutput => "raw_output",
        Scenario::Orphan => "orphan",
        Scenario::IdConflict => "id_conflict",
        Scenario::UnknownToken => "unknown_token",
    }
}

fn proportion(name: &'static str, value: f64) -> Result<(), SimError> {
    if (0.0..=1.0).contains(&value) {
        Ok(())
    } else {
        Err(SimError::Proportion { name, value })
    }
}

/// The simulation as a stream: an iterator of envelopes, generated flow by flow, so a
/// million events need no more memory than the shuffle window, the held-back events and
/// (if kept) the truth.
///
/// Order: flows in index order, each in causal order (duplicates right after a random later
/// event of their flow), optionally shuffled window by window; held-back envelopes last.
pub struct Simulation {
    cfg: SimConfig,
    start: i64,
    next_flow: u64,
    generated: u64,
    ready: VecDeque<Envelope>,
    window: Vec<Envelope>,
    held: Vec<Envelope>,
    releasing: bool,
    shuffle_rng: ChaCha8Rng,
    truth: GroundTruth,
}

impl Simulation {
    /// Check the config and set up the stream; nothing is generated until iterated.
    pub fn new(cfg: SimConfig) -> Result<Self, SimError> {
        let start = cfg.check()?;
        let mut shuffle_rng = ChaCha8Rng::seed_from_u64(cfg.seed);
        shuffle_rng.set_stream(u64::MAX);
        Ok(Self {
            truth: GroundTruth {
                config: cfg.clone(),
                totals: Totals::default(),
                requests: Vec::new(),
            },
            cfg,
            start,
            next_flow: 0,
            generated: 0,
            ready: VecDeque::new(),
            window: Vec::new(),
            held: Vec::new(),
            releasing: false,
            shuffle_rng,
        })
    }

    /// `true` once the envelopes being yielded are the held-back ones (`--delay`). They are
    /// always the last `truth().totals.held_back` of the stream; this lets a writer send
    /// them elsewhere, e.g. to publish them only after the rest has been ingested.
    pub fn emitting_held_back(&self) -> bool {
        self.releasing
    }

    /// The ground truth so far; complete once the iterator has returned `None`. Requests
    /// are recorded only when [`SimConfig::record_truth`] is set; totals always are.
    pub fn truth(&self) -> &GroundTruth {
        &self.truth
    }

    /// Take the ground truth (see [`Simulation::truth`]).
    pub fn into_truth(self) -> GroundTruth {
        self.truth
    }

    fn more_flows(&self) -> bool {
        match self.cfg.min_events {
            Some(min) => self.generated < min,
            None => self.next_flow < self.cfg.flows,
        }
    }

    /// Generate the next flow and route its envelopes to the ready queue, the shuffle
    /// window or the held-back list.
    fn generate_flow(&mut self) {
        let n = self.next_flow;
        self.next_flow += 1;
        let _span = tracing::trace_span!("flow", n).entered();
        let out = flow::generate(&self.cfg, self.start, n);
        let mut rng = ChaCha8Rng::seed_from_u64(self.cfg.seed);
        rng.set_stream(n.wrapping_mul(2).wrapping_add(1));
        let (stream, mut truth) = stress(&self.cfg, out, &mut rng, &mut self.truth.totals);
        let totals = &mut self.truth.totals;
        totals.flows += 1;
        *totals.scenarios.entry(truth.scenario).or_default() += 1;
        for v in &truth.violations {
            *totals.violations.entry(v.invariant).or_default() += 1;
        }
        totals.distinct_ids += truth.members.len() as u64;
        for (envelope, held) in stream {
            let totals = &mut self.truth.totals;
            totals.envelopes += 1;
            self.generated += 1;
            if envelope.request_id.is_none() {
                totals.without_request_id += 1;
            }
            if held {
                totals.held_back += 1;
                self.held.push(envelope);
            } else if self.cfg.shuffle {
                self.window.push(envelope);
                if self.cfg.shuffle_window > 0 && self.window.len() >= self.cfg.shuffle_window {
                    self.flush_window();
                }
            } else {
                self.ready.push_back(envelope);
            }
        }
        if self.cfg.record_truth {
            truth.without_request_id.sort();
            self.truth.requests.push(truth);
        }
    }

    fn flush_window(&mut self) {
        self.window.shuffle(&mut self.shuffle_rng);
        self.ready.extend(self.window.drain(..));
    }
}

impl Iterator for Simulation {
    type Item = Envelope;

    fn next(&mut self) -> Option<Envelope> {
        loop {
            if let Some(e) = self.ready.pop_front() {
                return Some(e);
            }
            if self.more_flows() {
                self.generate_flow();
            } else if !self.window.is_empty() {
                self.flush_window();
            } else if !self.releasing && !self.held.is_empty() {
                self.releasing = true;
                if self.cfg.shuffle {
                    self.held.shuffle(&mut self.shuffle_rng);
                }
                self.ready.extend(self.held.drain(..));
            } else {
                return None;
            }
        }
    }
}

/// Apply the per-flow stressors — drop request ids, duplicate, hold back — and finish the
/// request's truth. Returns the flow's envelopes, each with whether it is held back.
fn stress(
    cfg: &SimConfig,
    out: flow::FlowOut,
    rng: &mut ChaCha8Rng,
    totals: &mut Totals,
) -> (Vec<(Envelope, bool)>, RequestTruth) {
    let flow::FlowOut {
        events,
        member_links,
        mut truth,
        distinct,
    } = out;
    totals.distinct_events += distinct;
    let n = truth.members.len();

    // Which members lose their request id: drawn, then any group of linked members left
    // with no request id at all gets it back on its first member.
    let mut dropped: Vec<bool> = (0..n)
        .map(|_| cfg.no_request_id > 0.0 && rng.random_bool(cfg.no_request_id))
        .collect();
    // Node `n` is the flow: events linked through it are linked to each other.
    let mut parent: Vec<usize> = (0..=n).collect();
    fn root(p: &mut [usize], mut i: usize) -> usize {
        while p[i] != i {
            p[i] = p[p[i]];
            i = p[i];
        }
        i
    }
    for &(a, b) in &member_links {
        let (ra, rb) = (root(&mut parent, a), root(&mut parent, b));
        if ra != rb {
            parent[ra.max(rb)] = ra.min(rb);
        }
    }
    let mut anchored = vec![false; n + 1];
    for (i, &d) in dropped.iter().enumerate() {
        if !d {
            anchored[root(&mut parent, i)] = true;
        }
    }
    for i in 0..n {
        let r = root(&mut parent, i);
        if !anchored[r] {
            // The lowest index of a group is its root: restore the id there.
            dropped[r] = false;
            anchored[r] = true;
        }
    }
    truth.without_request_id = (0..n)
        .filter(|&i| dropped[i])
        .map(|i| truth.members[i].clone())
        .collect();

    let mut stream: Vec<(Envelope, bool)> = Vec::with_capacity(events.len() + 2);
    for p in events {
        let mut env = p.envelope.with_tenant(cfg.tenant.clone());
        if dropped[p.member] {
            env.request_id = None;
        }
        stream.push((env, false));
    }
    // Duplicates go right after a random event at or after their original.
    if cfg.duplicates > 0.0 {
        let originals = stream.len();
        let mut inserts: Vec<(usize, Envelope)> = Vec::new();
        for (i, (env, _)) in stream.iter().enumerate() {
            if rng.random_bool(cfg.duplicates) {
                let at = rng.random_range(i..originals);
                inserts.push((at, env.clone()));
            }
        }
        totals.duplicates += inserts.len() as u64;
        // Insert from the back so earlier positions stay valid; stable for equal `at`.
        inserts.sort_by_key(|(at, _)| *at);
        for (at, env) in inserts.into_iter().rev() {
            stream.insert(at + 1, (env, false));
        }
    }
    if cfg.delay > 0.0 {
        for item in &mut stream {
            item.1 = rng.random_bool(cfg.delay);
        }
    }
    (stream, truth)
}

/// Run a whole simulation in memory: the envelopes in stream order, and the ground truth.
/// For tests and small runs; stream large ones with [`Simulation`].
pub fn generate(cfg: &SimConfig) -> Result<(Vec<Envelope>, GroundTruth), SimError> {
    let mut sim = Simulation::new(cfg.clone())?;
    let envelopes: Vec<Envelope> = sim.by_ref().collect();
    Ok((envelopes, sim.into_truth()))
}

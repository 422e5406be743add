//! The simulator's ground truth: what the stream *should* turn into.
//!
//! Ingest tests compare the narratives weft builds with [`RequestTruth::members`] and
//! [`RequestTruth::links`]; audit tests compare `weft audit check` with the injected
//! [`InjectedViolation`]s. The file is plain JSON so tests in any language can read it.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// The link model is `weft_schemas::links`, shared with ingest and the audit.
pub use weft_schemas::links::{NodeKind, Via};
use weft_schemas::Kind;

use super::SimConfig;

/// One event, named the way weft names it: its kind and its natural identity
/// ([`weft_schemas::identity::identity`]; `jcs-sha256:<hex>` for ExecutionFeedback).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct EventRef {
    /// The contract, e.g. `frame`.
    pub kind: Kind,
    /// Its natural identity.
    pub id: String,
}

impl EventRef {
    /// Shorthand used throughout the generator and the tests.
    pub fn new(kind: Kind, id: impl Into<String>) -> Self {
        Self {
            kind,
            id: id.into(),
        }
    }
}

impl fmt::Display for EventRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.kind, self.id)
    }
}

/// The target of a link: an event ([`EventRef`]'s kind and id) or a flow (`flow` and the
/// flow id).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NodeRef {
    /// An event kind, or `flow`.
    pub kind: NodeKind,
    /// The event's identity, or the flow id.
    pub id: String,
}

impl NodeRef {
    /// The flow node of `flow_id`.
    pub fn flow(flow_id: impl Into<String>) -> Self {
        Self {
            kind: NodeKind::Flow,
            id: flow_id.into(),
        }
    }

    /// The event this node is, if it is one.
    pub fn event(&self) -> Option<EventRef> {
        match self.kind {
            NodeKind::Event(kind) => Some(EventRef::new(kind, self.id.clone())),
            NodeKind::Flow => None,
        }
    }
}

impl From<EventRef> for NodeRef {
    fn from(e: EventRef) -> Self {
        Self {
            kind: NodeKind::Event(e.kind),
            id: e.id,
        }
    }
}

impl fmt::Display for NodeRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.kind.as_str(), self.id)
    }
}

/// A directed reference from an event to another event or to its flow, found in `from`'s
/// payload. Serialized as `{"from": {kind, id}, "to": {kind, id}, "via": "..."}`, the shape
/// of `weft narrative --format json` links.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Link {
    /// The event whose payload holds the reference.
    pub from: EventRef,
    /// What it refers to.
    pub to: NodeRef,
    /// The field that holds it.
    pub via: Via,
}

/// Which variation a flow was generated with. Exactly one per flow, so every injected
/// violation is alone in its flow and an audit finding can be attributed without doubt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scenario {
    /// Every step authorized, executed, completed.
    Clean,
    /// A step is denied (`capability_denied`); the flow fails. Not a violation.
    Deny,
    /// A step executes with outcome `partial`; the flow still completes.
    Partial,
    /// A step's tool fails; `flow_failed`. Not a violation.
    Failure,
    /// I-06: a token is used after its `expires_at`.
    ExpiredToken,
    /// I-06: a single-use token is used by two steps.
    ReusedToken,
    /// I-06: an allowed, executed capability is not in the token's scope.
    OutOfScope,
    /// I-02: an execution without an allow decision, after a deny, or without
    /// `capability_authorized` first; or a PolicyDecision that no TraceEvent names.
    Unauthorized,
    /// I-01: a Frame carries `raw_output`.
    RawOutput,
    /// A `capability_executed` references a Handle that is never emitted.
    Orphan,
    /// The same id is emitted twice with different content.
    IdConflict,
    /// I-06 `token_unknown`: an allow PolicyDecision names a token whose CapabilityToken is
    /// never emitted (minted where nothing logs it); the step is authorized and executes.
    UnknownToken,
}

impl Scenario {
    /// Every scenario, `Clean` first (used for tallies and CLI help).
    pub const ALL: [Scenario; 12] = [
        Scenario::Clean,
        Scenario::Deny,
        Scenario::Partial,
        Scenario::Failure,
        Scenario::ExpiredToken,
        Scenario::ReusedToken,
        Scenario::OutOfScope,
        Scenario::Unauthorized,
        Scenario::RawOutput,
        Scenario::Orphan,
        Scenario::IdConflict,
        Scenario::UnknownToken,
    ];

    /// The violation class a scenario injects, if any.
    pub fn invariant(self) -> Option<Invariant> {
        match self {
            Scenario::Clean | Scenario::Deny | Scenario::Partial | Scenario::Failure => None,
            Scenario::ExpiredToken
            | Scenario::ReusedToken
            | Scenario::OutOfScope
            | Scenario::UnknownToken => Some(Invariant::I06),
            Scenario::Unauthorized => Some(Invariant::I02),
            Scenario::RawOutput => Some(Invariant::I01),
            Scenario::Orphan => Some(Invariant::Orphan),
            Scenario::IdConflict => Some(Invariant::IdConflict),
        }
    }
}

/// The classes of finding `weft audit check` reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Invariant {
    /// A Frame carries raw tool output.
    #[serde(rename = "I-01")]
    I01,
    /// An execution is not preceded by an allow PolicyDecision and `capability_authorized`,
    /// or a PolicyDecision is named by no TraceEvent.
    #[serde(rename = "I-02")]
    I02,
    /// A token is used expired, reused while single-use, or outside its scope; or an allow
    /// decision names a token stored nowhere (`token_unknown`, [`Scenario::UnknownToken`]).
    #[serde(rename = "I-06")]
    I06,
    /// A TraceEvent references a decision, frame or handle that never arrives.
    #[serde(rename = "orphan")]
    Orphan,
    /// One identity, two contents.
    #[serde(rename = "id_conflict")]
    IdConflict,
}

impl Invariant {
    /// The name used in the truth file and in audit findings.
    pub fn as_str(self) -> &'static str {
        match self {
            Invariant::I01 => "I-01",
            Invariant::I02 => "I-02",
            Invariant::I06 => "I-06",
            Invariant::Orphan => "orphan",
            Invariant::IdConflict => "id_conflict",
        }
    }
}

/// One violation the simulator put in the stream on purpose.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InjectedViolation {
    /// The class of finding expected from `weft audit check`.
    pub invariant: Invariant,
    /// The event an auditor would name first: the token (I-06; never emitted for
    /// [`Scenario::UnknownToken`], the target of its decision's dangling link), the `capability_executed`
    /// (I-02, orphan), the PolicyDecision no TraceEvent names (I-02), the Frame (I-01) or
    /// the conflicting identity.
    pub subject: EventRef,
    /// Every event that together proves the violation, `subject` included.
    pub events: Vec<EventRef>,
    /// A human sentence, for reports.
    pub detail: String,
}

/// Everything about one request (one flow).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestTruth {
    /// `req-<seed>-<n>`: the envelopes' request id and the Kafka key.
    pub request_id: String,
    /// The flow run id carried in `metadata.flow_id`.
    pub flow_id: String,
    /// The compiled flow that ran (the ExecutionRoutingDecision's candidate id).
    pub flow_name: String,
    /// The variation this flow was generated with.
    pub scenario: Scenario,
    /// Each distinct event of the narrative once, in causal (and timestamp) order.
    pub members: Vec<EventRef>,
    /// Every reference from a member to a member or to the request's flow node
    /// (`{kind: "flow", id: flow_id}`), deduplicated.
    pub links: Vec<Link>,
    /// References to events that are never emitted (orphans): not part of the narrative.
    pub dangling: Vec<Link>,
    /// Members whose envelopes carry no request id; each is connected through `links`
    /// (followed either way, through the flow node too) to a member that does, so the
    /// narrative builder can recover it.
    pub without_request_id: Vec<EventRef>,
    /// What `weft audit check` must find in this request (at most one; none if clean).
    pub violations: Vec<InjectedViolation>,
}

/// Stream-wide counts, for "nothing lost, nothing doubled" checks.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Totals {
    /// Flows (= requests) generated.
    pub flows: u64,
    /// Envelopes emitted, duplicates and held-back ones included (= lines of the output).
    pub envelopes: u64,
    /// Distinct facts ingest must store: distinct (kind, id, content). An id conflict counts
    /// twice, an exact duplicate once.
    pub distinct_events: u64,
    /// Distinct identities (kind, id) = the sum of all members.
    pub distinct_ids: u64,
    /// Exact copies sent again.
    pub duplicates: u64,
    /// Envelopes held back and emitted after all the others (the output's last lines).
    pub held_back: u64,
    /// Envelopes without a request id (duplicates included).
    pub without_request_id: u64,
    /// Flows per scenario.
    pub scenarios: BTreeMap<Scenario, u64>,
    /// Injected violations per class.
    pub violations: BTreeMap<Invariant, u64>,
}

/// The whole ground truth of one simulation: the config that produced it (so it can be
/// reproduced), the totals, and one entry per request, in flow order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroundTruth {
    /// The config that produced the stream: rerun it to get the same bytes.
    pub config: SimConfig,
    /// Stream-wide counts.
    pub totals: Totals,
    /// One per flow, in flow order (empty unless [`SimConfig::record_truth`]).
    pub requests: Vec<RequestTruth>,
}

impl GroundTruth {
    /// Every injected violation, with the request it was injected in.
    pub fn violations(&self) -> impl Iterator<Item = (&RequestTruth, &InjectedViolation)> {
        self.requests
            .iter()
            .flat_map(|r| r.violations.iter().map(move |v| (r, v)))
    }
}

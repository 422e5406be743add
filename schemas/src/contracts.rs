//! Typed Rust views of the weaver-spec 0.9.0 contracts.
//!
//! Why these types look the way they do:
//! - Every struct keeps unknown keys in `extra` (`#[serde(flatten)]`), because the spec sets
//!   `additionalProperties: true` everywhere and reserves `x_<org>_<field>` extension keys.
//!   Dropping them would break the audit promise that a payload survives every hop.
//! - Fields the spec types as `["T", "null"]` and does not require are `Option<Option<T>>`:
//!   `None` = absent, `Some(None)` = explicit `null`. Absent and null are different JSON
//!   documents, and a tamper-evident log must not turn one into the other.
//! - Timestamps stay `String`s holding the producer's exact RFC 3339 text; the JSON Schema
//!   check (`format: date-time`) guards their shape and [`crate::time`] parses them when needed.
//! - Range and length rules (`minLength`, `minimum`, `[0, 1]`) are enforced by the JSON Schema
//!   validator in [`crate::validate`], the single source of truth, not re-implemented here.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use serde_with::rust::double_option;
use serde_with::skip_serializing_none;

/// Unknown and extension keys, kept verbatim.
pub type Extra = Map<String, Value>;

/// Implementation-specific `metadata` bag (always a JSON object in the spec).
pub type Metadata = Map<String, Value>;

/// `TraceEvent.event_type`: the closed set of core event types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TraceEventType {
    /// Policy allowed a capability invocation.
    CapabilityAuthorized,
    /// Policy refused a capability invocation.
    CapabilityDenied,
    /// A capability ran.
    CapabilityExecuted,
    /// The firewall turned a raw tool result into a Frame.
    FirewallApplied,
    /// A raw artifact was stored behind a Handle.
    HandleCreated,
    /// A Handle was resolved to its content.
    HandleResolved,
    /// A CapabilityToken was issued.
    TokenIssued,
    /// A CapabilityToken was made unusable.
    TokenInvalidated,
    /// A flow began.
    FlowStarted,
    /// A step of a flow began.
    FlowStepStarted,
    /// A step of a flow finished.
    FlowStepCompleted,
    /// A flow finished.
    FlowCompleted,
    /// A flow stopped on a failure.
    FlowFailed,
}

impl TraceEventType {
    /// The wire name, as used in the spec's enum and in ClickHouse columns.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::CapabilityAuthorized => "capability_authorized",
            Self::CapabilityDenied => "capability_denied",
            Self::CapabilityExecuted => "capability_executed",
            Self::FirewallApplied => "firewall_applied",
            Self::HandleCreated => "handle_created",
            Self::HandleResolved => "handle_resolved",
            Self::TokenIssued => "token_issued",
            Self::TokenInvalidated => "token_invalidated",
            Self::FlowStarted => "flow_started",
            Self::FlowStepStarted => "flow_step_started",
            Self::FlowStepCompleted => "flow_step_completed",
            Self::FlowCompleted => "flow_completed",
            Self::FlowFailed => "flow_failed",
        }
    }
}

/// `TraceEvent.outcome`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The step did what it was asked.
    Success,
    /// The step failed.
    Failure,
    /// The step did part of what it was asked.
    Partial,
}

/// An immutable audit log entry (Core, produced by agent-kernel).
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceEvent {
    /// The event's natural id (non-empty).
    pub event_id: String,
    /// What happened.
    pub event_type: TraceEventType,
    /// When it happened (RFC 3339); narratives are ordered by it.
    pub timestamp: String,
    /// The capability involved. Optional, nullable.
    #[serde(default, with = "double_option")]
    pub capability_id: Option<Option<String>>,
    /// Who acted (a principal id). Optional, nullable.
    #[serde(default, with = "double_option")]
    pub principal: Option<Option<String>>,
    /// The authorization PolicyDecision this event belongs to.
    #[serde(default, with = "double_option")]
    pub decision_id: Option<Option<String>>,
    /// The Frame this event refers to. Optional, nullable.
    #[serde(default, with = "double_option")]
    pub frame_id: Option<Option<String>>,
    /// The Handle this event refers to. Optional, nullable.
    #[serde(default, with = "double_option")]
    pub handle_id: Option<Option<String>>,
    /// How the step ended. Optional.
    pub outcome: Option<Outcome>,
    /// Error text, when there is one. Optional, nullable.
    #[serde(default, with = "double_option")]
    pub error_message: Option<Option<String>>,
    /// Implementation-specific data. Optional.
    pub metadata: Option<Metadata>,
    /// Keys the spec does not define (including `x_` extensions), kept verbatim.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `PolicyDecision.decision`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The invocation may go ahead.
    Allow,
    /// The invocation is refused.
    Deny,
}

/// The kernel's authorization verdict for one capability invocation (Core).
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyDecision {
    /// The decision's natural id; TraceEvents point at it by `decision_id`.
    pub decision_id: String,
    /// The verdict.
    pub decision: Verdict,
    /// The capability whose invocation was judged.
    pub capability_id: String,
    /// Who asked for the capability (a principal id).
    pub principal: String,
    /// The CapabilityToken the decision links to. Optional, nullable.
    #[serde(default, with = "double_option")]
    pub token_id: Option<Option<String>>,
    /// Why this verdict, for people. Optional.
    pub reason: Option<String>,
    /// When the decision was made (RFC 3339).
    pub timestamp: String,
    /// Implementation-specific data. Optional.
    pub metadata: Option<Metadata>,
    /// Keys the spec does not define (including `x_` extensions), kept verbatim.
    #[serde(flatten)]
    pub extra: Extra,
}

/// A firewall-filtered, LLM-safe view of a tool result (Core). Never raw output (I-01).
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Frame {
    /// The frame's natural id.
    pub frame_id: String,
    /// The capability whose result this frame shows.
    pub capability_id: String,
    /// The filtered result as text the LLM may see (non-empty).
    pub summary: String,
    /// The filtered result as a JSON object. Optional, nullable.
    #[serde(default, with = "double_option")]
    pub structured_data: Option<Option<Map<String, Value>>>,
    /// Handles holding the raw output behind this frame. Optional.
    pub handle_refs: Option<Vec<String>>,
    /// What was filtered out, and where it went. Optional.
    pub redaction_notes: Option<String>,
    /// When the frame was made (RFC 3339).
    pub created_at: String,
    /// Implementation-specific data. Optional.
    pub metadata: Option<Metadata>,
    /// Keys the spec does not define (including `x_` extensions), kept verbatim.
    #[serde(flatten)]
    pub extra: Extra,
}

/// An opaque, access-controlled reference to a raw artifact (Core).
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Handle {
    /// The handle's natural id; Frames list it in `handle_refs`.
    pub handle_id: String,
    /// The capability whose execution produced the artifact.
    pub capability_id: String,
    /// What the artifact is, e.g. a media type such as `application/json`.
    pub artifact_type: String,
    /// When the handle was made (RFC 3339).
    pub created_at: String,
    /// When the handle expires (RFC 3339). Optional, nullable.
    #[serde(default, with = "double_option")]
    pub expires_at: Option<Option<String>>,
    /// The policy that governs resolving the handle. Optional.
    pub access_policy: Option<String>,
    /// Size of the raw artifact in bytes. Optional, nullable. A JSON number: to the schema
    /// `10.0` and `1e20` are integers too, which `u64` refused.
    #[serde(default, with = "double_option")]
    pub byte_size: Option<Option<serde_json::Number>>,
    /// Implementation-specific data. Optional.
    pub metadata: Option<Metadata>,
    /// Keys the spec does not define (including `x_` extensions), kept verbatim.
    #[serde(flatten)]
    pub extra: Extra,
}

/// A scoped authorization credential (Core). Single-use or expiring (I-06).
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CapabilityToken {
    /// The token's natural id; PolicyDecisions point at it by `token_id`.
    pub token_id: String,
    /// Who the token was issued to (a principal id).
    pub principal: String,
    /// The capability ids the token grants (at least one).
    pub scope: Vec<String>,
    /// When the token was issued (RFC 3339).
    pub issued_at: String,
    /// When the token expires (RFC 3339). Optional, nullable; if unset, `single_use` must be true.
    #[serde(default, with = "double_option")]
    pub expires_at: Option<Option<String>>,
    /// Absent means `false` (the spec's default).
    pub single_use: Option<bool>,
    /// Who issued the token, e.g. an agent-kernel instance. Optional.
    pub issuer: Option<String>,
    /// Implementation-specific data. Optional.
    pub metadata: Option<Metadata>,
    /// Keys the spec does not define (including `x_` extensions), kept verbatim.
    #[serde(flatten)]
    pub extra: Extra,
}

/// One option presented to an LLM inside a ChoiceCard (Core).
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SelectableItem {
    /// The item's id; `RoutingDecision.selected_item_id` names it.
    pub id: String,
    /// Short name presented to the LLM.
    pub label: String,
    /// What the item does, as presented to the LLM.
    pub description: String,
    /// The capability the item stands for. Optional.
    pub capability_id: Option<String>,
    /// Implementation-specific data. Optional.
    pub metadata: Option<Metadata>,
    /// Keys the spec does not define (including `x_` extensions), kept verbatim.
    #[serde(flatten)]
    pub extra: Extra,
}

/// A bounded menu of SelectableItems (Core).
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChoiceCard {
    /// The card's id; `RoutingDecision.selected_card_id` names it.
    pub id: String,
    /// The options on the card, 1 to 20.
    pub items: Vec<SelectableItem>,
    /// Guidance for the LLM on what to choose. Optional.
    pub context_hint: Option<String>,
    /// Implementation-specific data. Optional.
    pub metadata: Option<Metadata>,
    /// Keys the spec does not define (including `x_` extensions), kept verbatim.
    #[serde(flatten)]
    pub extra: Extra,
}

/// contextweaver's routing output: the ChoiceCards shown and the selection (Core).
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoutingDecision {
    /// The decision's natural id.
    pub id: String,
    /// The cards presented to the LLM (at least one).
    pub choice_cards: Vec<ChoiceCard>,
    /// The item the LLM picked. Optional, nullable. Unset until the LLM has responded.
    #[serde(default, with = "double_option")]
    pub selected_item_id: Option<Option<String>>,
    /// The card the picked item came from. Optional, nullable.
    #[serde(default, with = "double_option")]
    pub selected_card_id: Option<Option<String>>,
    /// When routing happened (RFC 3339).
    pub timestamp: String,
    /// Short account of what was being routed. Optional.
    pub context_summary: Option<String>,
    /// Implementation-specific data. Optional.
    pub metadata: Option<Metadata>,
    /// Keys the spec does not define (including `x_` extensions), kept verbatim.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `CompiledFlow.sensitivity` (also nullable).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Sensitivity {
    /// The least sensitive level.
    Public,
    /// Above `public`, below `confidential`.
    Internal,
    /// Above `internal`, below `restricted`.
    Confidential,
    /// The most sensitive level.
    Restricted,
}

/// A compiled flow exposed as a routable item (Extended).
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompiledFlow {
    /// The flow's id (non-empty).
    pub flow_id: String,
    /// Human-readable name. Optional, nullable.
    #[serde(default, with = "double_option")]
    pub name: Option<Option<String>>,
    /// The flow's version. Optional, nullable.
    #[serde(default, with = "double_option")]
    pub version: Option<Option<String>>,
    /// What the flow does. Optional, nullable.
    #[serde(default, with = "double_option")]
    pub description: Option<Option<String>>,
    /// Reference to the schema of the flow's input. Optional, nullable.
    #[serde(default, with = "double_option")]
    pub input_schema_ref: Option<Option<String>>,
    /// Reference to the schema of the flow's output. Optional, nullable.
    #[serde(default, with = "double_option")]
    pub output_schema_ref: Option<Option<String>>,
    /// The tools the flow calls. Optional.
    pub tool_dependencies: Option<Vec<String>>,
    /// Classification of the data the flow handles. Optional, nullable.
    #[serde(default, with = "double_option")]
    pub sensitivity: Option<Option<Sensitivity>>,
    /// Effects beyond the flow's output, e.g. `external_email`. Optional.
    pub side_effects: Option<Vec<String>>,
    /// Absent means `true` (the spec's default: flows never bypass authorization).
    pub requires_authorization: Option<bool>,
    /// Implementation-specific data. Optional.
    pub metadata: Option<Metadata>,
    /// Keys the spec does not define (including `x_` extensions), kept verbatim.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `ExecutionCandidate.candidate_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CandidateType {
    /// The candidate is a tool.
    Tool,
    /// The candidate is a compiled flow; only these may carry `compiled_flow`.
    Flow,
    /// The candidate is a capability.
    Capability,
    /// The candidate is an agent.
    Agent,
    /// The candidate is a workflow.
    Workflow,
}

/// Something a router can select for execution (Extended).
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecutionCandidate {
    /// The candidate's id; ExecutionFeedback refers to it by `candidate_id`.
    pub candidate_id: String,
    /// What sort of thing would run.
    pub candidate_type: CandidateType,
    /// Human-readable name. Optional, nullable.
    #[serde(default, with = "double_option")]
    pub name: Option<Option<String>>,
    /// The candidate's version. Optional, nullable.
    #[serde(default, with = "double_option")]
    pub version: Option<Option<String>>,
    /// What the candidate does. Optional, nullable.
    #[serde(default, with = "double_option")]
    pub description: Option<Option<String>>,
    /// Only valid when `candidate_type` is `flow` (checked by the JSON Schema `if/then`).
    #[serde(default, with = "double_option")]
    pub compiled_flow: Option<Option<CompiledFlow>>,
    /// Implementation-specific data. Optional.
    pub metadata: Option<Metadata>,
    /// Keys the spec does not define (including `x_` extensions), kept verbatim.
    #[serde(flatten)]
    pub extra: Extra,
}

/// A router's advisory recommendation (Extended). It grants nothing (I-02, I-07).
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecutionRoutingDecision {
    /// The *routing* decision id; ExecutionFeedback.decision_id points here.
    pub decision_id: String,
    /// The recommended candidate.
    pub candidate: ExecutionCandidate,
    /// The router's confidence in the choice, in [0, 1]. Optional, nullable.
    #[serde(default, with = "double_option")]
    pub confidence: Option<Option<f64>>,
    /// Machine-readable reasons for the choice. Optional.
    pub reason_codes: Option<Vec<String>>,
    /// Why this candidate, for people. Optional, nullable.
    #[serde(default, with = "double_option")]
    pub reason: Option<Option<String>>,
    /// Alternatives to the recommended candidate. Optional.
    pub fallback_candidates: Option<Vec<ExecutionCandidate>>,
    /// The limits the choice was made under, e.g. `max_latency_ms`. Optional.
    pub constraints: Option<Map<String, Value>>,
    /// Reference to the policy context of the decision. Optional, nullable.
    #[serde(default, with = "double_option")]
    pub policy_context_ref: Option<Option<String>>,
    /// Reference to a trace of the routing. Optional, nullable.
    #[serde(default, with = "double_option")]
    pub trace_ref: Option<Option<String>>,
    /// When the decision was made (RFC 3339); narratives are ordered by it. Optional, nullable.
    #[serde(default, with = "double_option")]
    pub created_at: Option<Option<String>>,
    /// Implementation-specific data. Optional.
    pub metadata: Option<Metadata>,
    /// Keys the spec does not define (including `x_` extensions), kept verbatim.
    #[serde(flatten)]
    pub extra: Extra,
}

/// The observed outcome of executing a routed candidate (Extended). It has no id of its
/// own; weft identifies it by the hash of its canonical JSON (see [`crate::identity`]).
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecutionFeedback {
    /// The *routing* decision id (ExecutionRoutingDecision), not an authorization decision.
    pub decision_id: String,
    /// The candidate that was run.
    pub candidate_id: String,
    /// Whether the execution succeeded.
    pub success: bool,
    /// When the outcome was recorded (RFC 3339).
    pub timestamp: String,
    /// How long the execution took, in milliseconds. Optional, nullable. A JSON number (see
    /// [`Handle::byte_size`]).
    #[serde(default, with = "double_option")]
    pub latency_ms: Option<Option<serde_json::Number>>,
    /// What the execution cost, e.g. tokens or money. Optional.
    pub cost: Option<Map<String, Value>>,
    /// Quality of the result, in [0, 1]. Optional, nullable.
    #[serde(default, with = "double_option")]
    pub quality_score: Option<Option<f64>>,
    /// Category of the failure. Optional, nullable.
    #[serde(default, with = "double_option")]
    pub error_type: Option<Option<String>>,
    /// Error text, when there is one. Optional, nullable.
    #[serde(default, with = "double_option")]
    pub error_message: Option<Option<String>>,
    /// Reference to the execution's trace. Optional, nullable.
    #[serde(default, with = "double_option")]
    pub trace_ref: Option<Option<String>>,
    /// Implementation-specific account of the run, e.g. its step count. Optional.
    pub execution_summary: Option<Map<String, Value>>,
    /// Implementation-specific data. Optional.
    pub metadata: Option<Metadata>,
    /// Keys the spec does not define (including `x_` extensions), kept verbatim.
    #[serde(flatten)]
    pub extra: Extra,
}

/// A detached signature (ed25519 or es256) over a JCS-canonicalized document (Extended).
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Signature {
    /// Signing algorithm: `ed25519` or `es256`.
    pub alg: String,
    /// Id of the signing key, to find it in a keyring.
    pub kid: String,
    /// Base64url, no padding, 86 characters.
    pub sig: String,
    /// How the document was canonicalised before signing; only `JCS`, the default when absent.
    pub canonicalization: Option<String>,
    /// When it was signed (RFC 3339). Optional, nullable.
    #[serde(default, with = "double_option")]
    pub signed_at: Option<Option<String>>,
    /// Keys the spec does not define (including `x_` extensions), kept verbatim.
    #[serde(flatten)]
    pub extra: Extra,
}

/// One request's Core artifacts in a single, optionally signed document (Extended).
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceBundle {
    /// The bundle's id.
    pub bundle_id: String,
    /// The request's RoutingDecision.
    pub routing_decision: RoutingDecision,
    /// The request's PolicyDecisions.
    pub policy_decisions: Vec<PolicyDecision>,
    /// The request's Frames.
    pub frames: Vec<Frame>,
    /// The request's Handles.
    pub handles: Vec<Handle>,
    /// The request's TraceEvents.
    pub trace_events: Vec<TraceEvent>,
    /// How the bundle is canonicalised for signing; only `JCS`, the default when absent.
    pub canonicalization: Option<String>,
    /// Signature over the bundle. Optional. Absent means unsigned.
    pub signature: Option<Signature>,
    /// When the bundle was assembled (RFC 3339). Optional, nullable.
    #[serde(default, with = "double_option")]
    pub created_at: Option<Option<String>>,
    /// Implementation-specific data. Optional.
    pub metadata: Option<Metadata>,
    /// Keys the spec does not define (including `x_` extensions), kept verbatim.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `EvaluationArtifact.support_state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SupportState {
    /// The data support the estimates.
    Ok,
    /// Support is limited; read the estimates with care.
    Caution,
    /// Support is too weak to trust; `deploy` may not be recommended.
    HighRisk,
}

/// `EvaluationArtifact.recommendation_kind`. `Deploy` is forbidden with `HighRisk` support.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecommendationKind {
    /// Roll the candidate policy out; not allowed with `high_risk` support.
    Deploy,
    /// Keep the candidate policy out.
    DoNotDeploy,
    /// Ready for an online experiment, not a rollout.
    ExperimentReady,
    /// Collect more data before deciding.
    NeedsMoreData,
}

/// An offline evaluation report with explicit support semantics (Extended).
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvaluationArtifact {
    /// The report's id (non-empty).
    pub artifact_id: String,
    /// The tool that wrote the report.
    pub producer: String,
    /// When the report was written (RFC 3339).
    pub created_at: String,
    /// What sort of evaluation, e.g. `offline_policy_evaluation`. Optional.
    pub artifact_type: Option<String>,
    /// Version of the tool that wrote it. Optional, nullable.
    #[serde(default, with = "double_option")]
    pub producer_version: Option<Option<String>>,
    /// The quantity being estimated. Optional, nullable.
    #[serde(default, with = "double_option")]
    pub target_estimand: Option<Option<String>>,
    /// The policy being evaluated. Optional, nullable.
    #[serde(default, with = "double_option")]
    pub candidate_policy: Option<Option<String>>,
    /// The policy it is compared with. Optional, nullable.
    #[serde(default, with = "double_option")]
    pub baseline_policy: Option<Option<String>>,
    /// The estimates. Optional.
    pub metrics: Option<Map<String, Value>>,
    /// Uncertainty of the estimates, e.g. confidence intervals. Optional.
    pub uncertainty: Option<Map<String, Value>>,
    /// How far the data support the estimates. Optional.
    pub support_state: Option<SupportState>,
    /// Evidence behind `support_state`, e.g. effective sample size. Optional.
    pub support_diagnostics: Option<Map<String, Value>>,
    /// Checks on the propensities used, e.g. the largest importance weight. Optional.
    pub propensity_diagnostics: Option<Map<String, Value>>,
    /// Classification of the report's data. Optional.
    pub sensitivity: Option<Sensitivity>,
    /// Caveats for readers. Optional.
    pub warnings: Option<Vec<String>>,
    /// What to do, for people. Optional, nullable.
    #[serde(default, with = "double_option")]
    pub recommendation: Option<Option<String>>,
    /// What to do, machine-readable. Optional, nullable.
    #[serde(default, with = "double_option")]
    pub recommendation_kind: Option<Option<RecommendationKind>>,
    /// Known limits of the evaluation. Optional.
    pub limitations: Option<Vec<String>>,
    /// Where the inputs came from. Optional.
    pub provenance: Option<Map<String, Value>>,
    /// Implementation-specific data. Optional.
    pub metadata: Option<Metadata>,
    /// Keys the spec does not define (including `x_` extensions), kept verbatim.
    #[serde(flatten)]
    pub extra: Extra,
}

/// A contract that travels as a weft event of its own [`Kind`] (the eight of the event
/// topics), so code generic over contracts knows where one goes.
pub trait Contract: Serialize {
    /// The event kind this contract is published as.
    const KIND: crate::Kind;
}

macro_rules! contract_kinds {
    ($($t:ident),*) => {
        $(impl Contract for $t {
            const KIND: crate::Kind = crate::Kind::$t;
        })*
    };
}

contract_kinds!(
    TraceEvent,
    PolicyDecision,
    CapabilityToken,
    Frame,
    Handle,
    RoutingDecision,
    ExecutionRoutingDecision,
    ExecutionFeedback
);

#[cfg(test)]
mod tests {
    use super::*;

    /// To the schema an integer is any number with no fraction, however written: the typed
    /// contracts read `10.0` and `1e20` (which `u64` refused, failing every bundle export of
    /// a narrative that held one) and write back the same JSON value.
    #[test]
    fn integers_written_as_floats_are_read_and_kept() {
        let handle = r#"{"handle_id":"h","capability_id":"c","artifact_type":"t","created_at":"2026-01-01T00:00:00Z","byte_size":1e20}"#;
        let h: Handle = serde_json::from_str(handle).expect("a schema-valid handle");
        let back = serde_json::to_value(&h).expect("serializes");
        let sent: serde_json::Value = serde_json::from_str(handle).expect("JSON");
        assert_eq!(back, sent);
        let fb = r#"{"decision_id":"d","candidate_id":"c","success":true,"timestamp":"2026-01-01T00:00:00Z","latency_ms":5.0}"#;
        let f: ExecutionFeedback = serde_json::from_str(fb).expect("a schema-valid feedback");
        assert_eq!(f.latency_ms.flatten().map(|n| n.as_f64()), Some(Some(5.0)));
    }
}

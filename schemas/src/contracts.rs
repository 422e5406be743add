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

/// Unknown and extension keys, kept verbatim.
pub type Extra = Map<String, Value>;

/// Implementation-specific `metadata` bag (always a JSON object in the spec).
pub type Metadata = Map<String, Value>;

/// `TraceEvent.event_type`: the closed set of core event types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TraceEventType {
    CapabilityAuthorized,
    CapabilityDenied,
    CapabilityExecuted,
    FirewallApplied,
    HandleCreated,
    HandleResolved,
    TokenIssued,
    TokenInvalidated,
    FlowStarted,
    FlowStepStarted,
    FlowStepCompleted,
    FlowCompleted,
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
    Success,
    Failure,
    Partial,
}

/// An immutable audit log entry (Core, produced by agent-kernel).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceEvent {
    pub event_id: String,
    pub event_type: TraceEventType,
    pub timestamp: String,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    pub capability_id: Option<Option<String>>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    pub principal: Option<Option<String>>,
    /// The authorization PolicyDecision this event belongs to.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    pub decision_id: Option<Option<String>>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    pub frame_id: Option<Option<String>>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    pub handle_id: Option<Option<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<Outcome>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    pub error_message: Option<Option<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Metadata>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// `PolicyDecision.decision`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Allow,
    Deny,
}

/// The kernel's authorization verdict for one capability invocation (Core).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyDecision {
    pub decision_id: String,
    pub decision: Verdict,
    pub capability_id: String,
    pub principal: String,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    pub token_id: Option<Option<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub timestamp: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Metadata>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// A firewall-filtered, LLM-safe view of a tool result (Core). Never raw output (I-01).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Frame {
    pub frame_id: String,
    pub capability_id: String,
    pub summary: String,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    pub structured_data: Option<Option<Map<String, Value>>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handle_refs: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redaction_notes: Option<String>,
    pub created_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Metadata>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// An opaque, access-controlled reference to a raw artifact (Core).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Handle {
    pub handle_id: String,
    pub capability_id: String,
    pub artifact_type: String,
    pub created_at: String,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    pub expires_at: Option<Option<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_policy: Option<String>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    pub byte_size: Option<Option<u64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Metadata>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// A scoped authorization credential (Core). Single-use or expiring (I-06).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CapabilityToken {
    pub token_id: String,
    pub principal: String,
    pub scope: Vec<String>,
    pub issued_at: String,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    pub expires_at: Option<Option<String>>,
    /// Absent means `false` (the spec's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub single_use: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Metadata>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// One option presented to an LLM inside a ChoiceCard (Core).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SelectableItem {
    pub id: String,
    pub label: String,
    pub description: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capability_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Metadata>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// A bounded menu of SelectableItems (Core).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChoiceCard {
    pub id: String,
    pub items: Vec<SelectableItem>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_hint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Metadata>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// contextweaver's routing output: the ChoiceCards shown and the selection (Core).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoutingDecision {
    pub id: String,
    pub choice_cards: Vec<ChoiceCard>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    pub selected_item_id: Option<Option<String>>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    pub selected_card_id: Option<Option<String>>,
    pub timestamp: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_summary: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Metadata>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// `CompiledFlow.sensitivity` (also nullable).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Sensitivity {
    Public,
    Internal,
    Confidential,
    Restricted,
}

/// A compiled flow exposed as a routable item (Extended).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompiledFlow {
    pub flow_id: String,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    pub name: Option<Option<String>>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    pub version: Option<Option<String>>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    pub description: Option<Option<String>>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    pub input_schema_ref: Option<Option<String>>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    pub output_schema_ref: Option<Option<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_dependencies: Option<Vec<String>>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    pub sensitivity: Option<Option<Sensitivity>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub side_effects: Option<Vec<String>>,
    /// Absent means `true` (the spec's default: flows never bypass authorization).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requires_authorization: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Metadata>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// `ExecutionCandidate.candidate_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CandidateType {
    Tool,
    Flow,
    Capability,
    Agent,
    Workflow,
}

/// Something a router can select for execution (Extended).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecutionCandidate {
    pub candidate_id: String,
    pub candidate_type: CandidateType,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    pub name: Option<Option<String>>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    pub version: Option<Option<String>>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    pub description: Option<Option<String>>,
    /// Only valid when `candidate_type` is `flow` (checked by the JSON Schema `if/then`).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    pub compiled_flow: Option<Option<CompiledFlow>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Metadata>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// A router's advisory recommendation (Extended). It grants nothing (I-02, I-07).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecutionRoutingDecision {
    /// The *routing* decision id; ExecutionFeedback.decision_id points here.
    pub decision_id: String,
    pub candidate: ExecutionCandidate,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    pub confidence: Option<Option<f64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason_codes: Option<Vec<String>>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    pub reason: Option<Option<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback_candidates: Option<Vec<ExecutionCandidate>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub constraints: Option<Map<String, Value>>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    pub policy_context_ref: Option<Option<String>>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    pub trace_ref: Option<Option<String>>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    pub created_at: Option<Option<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Metadata>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// The observed outcome of executing a routed candidate (Extended). It has no id of its
/// own; weft identifies it by the hash of its canonical JSON (see [`crate::identity`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecutionFeedback {
    /// The *routing* decision id (ExecutionRoutingDecision), not an authorization decision.
    pub decision_id: String,
    pub candidate_id: String,
    pub success: bool,
    pub timestamp: String,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    pub latency_ms: Option<Option<u64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<Map<String, Value>>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    pub quality_score: Option<Option<f64>>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    pub error_type: Option<Option<String>>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    pub error_message: Option<Option<String>>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    pub trace_ref: Option<Option<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_summary: Option<Map<String, Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Metadata>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// A detached signature (ed25519 or es256) over a JCS-canonicalized document (Extended).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Signature {
    pub alg: String,
    pub kid: String,
    /// Base64url, no padding, 86 characters.
    pub sig: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canonicalization: Option<String>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    pub signed_at: Option<Option<String>>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// One request's Core artifacts in a single, optionally signed document (Extended).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceBundle {
    pub bundle_id: String,
    pub routing_decision: RoutingDecision,
    pub policy_decisions: Vec<PolicyDecision>,
    pub frames: Vec<Frame>,
    pub handles: Vec<Handle>,
    pub trace_events: Vec<TraceEvent>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canonicalization: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<Signature>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    pub created_at: Option<Option<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Metadata>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// `EvaluationArtifact.support_state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SupportState {
    Ok,
    Caution,
    HighRisk,
}

/// `EvaluationArtifact.recommendation_kind`. `Deploy` is forbidden with `HighRisk` support.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecommendationKind {
    Deploy,
    DoNotDeploy,
    ExperimentReady,
    NeedsMoreData,
}

/// An offline evaluation report with explicit support semantics (Extended).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvaluationArtifact {
    pub artifact_id: String,
    pub producer: String,
    pub created_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_type: Option<String>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    pub producer_version: Option<Option<String>>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    pub target_estimand: Option<Option<String>>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    pub candidate_policy: Option<Option<String>>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    pub baseline_policy: Option<Option<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<Map<String, Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uncertainty: Option<Map<String, Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub support_state: Option<SupportState>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub support_diagnostics: Option<Map<String, Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub propensity_diagnostics: Option<Map<String, Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sensitivity: Option<Sensitivity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warnings: Option<Vec<String>>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    pub recommendation: Option<Option<String>>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    pub recommendation_kind: Option<Option<RecommendationKind>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limitations: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provenance: Option<Map<String, Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Metadata>,
    #[serde(flatten)]
    pub extra: Extra,
}

//! The eight kinds of event that travel through weft, and what each one implies.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The contract carried by an [`crate::Envelope`]. One Kafka topic per kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// An audit log entry for one step of the execution lifecycle.
    TraceEvent,
    /// agent-kernel's authorisation verdict on a capability invocation.
    PolicyDecision,
    /// The observed outcome of running a selected candidate (extended contract).
    ExecutionFeedback,
    /// A router's advisory recommendation of an execution candidate (extended contract).
    ExecutionRoutingDecision,
    /// contextweaver's routing output: the choice cards and the LLM's pick.
    RoutingDecision,
    /// A filtered, safe view of a tool result, as the LLM sees it.
    Frame,
    /// An access-controlled reference to a raw tool artifact.
    Handle,
    /// A signed, scoped credential to invoke capabilities.
    CapabilityToken,
}

impl Kind {
    /// Every kind, in a fixed order (used for topic lists and metrics labels).
    pub const ALL: [Kind; 8] = [
        Kind::TraceEvent,
        Kind::PolicyDecision,
        Kind::ExecutionFeedback,
        Kind::ExecutionRoutingDecision,
        Kind::RoutingDecision,
        Kind::Frame,
        Kind::Handle,
        Kind::CapabilityToken,
    ];

    /// Wire name: the envelope's `kind`, the `weft-kind` header and the ClickHouse `kind` column.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::TraceEvent => "trace_event",
            Kind::PolicyDecision => "policy_decision",
            Kind::ExecutionFeedback => "execution_feedback",
            Kind::ExecutionRoutingDecision => "execution_routing_decision",
            Kind::RoutingDecision => "routing_decision",
            Kind::Frame => "frame",
            Kind::Handle => "handle",
            Kind::CapabilityToken => "capability_token",
        }
    }

    /// The weaver-spec schema (file stem) that validates this kind's payload.
    pub fn schema_name(self) -> &'static str {
        self.as_str()
    }

    /// The payload key holding the natural identity, or `None` for ExecutionFeedback,
    /// which has no id of its own and is identified by its canonical-JSON hash.
    pub fn id_field(self) -> Option<&'static str> {
        match self {
            Kind::TraceEvent => Some("event_id"),
            Kind::PolicyDecision | Kind::ExecutionRoutingDecision => Some("decision_id"),
            Kind::ExecutionFeedback => None,
            Kind::RoutingDecision => Some("id"),
            Kind::Frame => Some("frame_id"),
            Kind::Handle => Some("handle_id"),
            Kind::CapabilityToken => Some("token_id"),
        }
    }

    /// The payload key holding the event's own time (what narratives are ordered by).
    pub fn time_field(self) -> &'static str {
        match self {
            Kind::TraceEvent
            | Kind::PolicyDecision
            | Kind::ExecutionFeedback
            | Kind::RoutingDecision => "timestamp",
            Kind::Frame | Kind::Handle => "created_at",
            Kind::CapabilityToken => "issued_at",
            Kind::ExecutionRoutingDecision => "created_at",
        }
    }

    /// The topic name after the prefix, e.g. `trace_events` in `weaver.trace_events`.
    pub fn topic_suffix(self) -> &'static str {
        match self {
            Kind::TraceEvent => "trace_events",
            Kind::PolicyDecision => "policy_decisions",
            Kind::ExecutionFeedback => "execution_feedback",
            Kind::ExecutionRoutingDecision => "execution_routing_decisions",
            Kind::RoutingDecision => "routing_decisions",
            Kind::Frame => "frames",
            Kind::Handle => "handles",
            Kind::CapabilityToken => "capability_tokens",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error for a kind name weft does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown kind `{0}` (expected one of: trace_event, policy_decision, execution_feedback, execution_routing_decision, routing_decision, frame, handle, capability_token)")]
pub struct UnknownKind(pub String);

impl FromStr for Kind {
    type Err = UnknownKind;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Kind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| UnknownKind(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_topics_are_distinct() {
        let mut topics = std::collections::HashSet::new();
        for k in Kind::ALL {
            assert_eq!(k.as_str().parse::<Kind>(), Ok(k));
            assert_eq!(serde_json::to_value(k).unwrap(), k.as_str());
            assert!(topics.insert(k.topic_suffix()), "duplicate topic for {k}");
        }
        assert!("trace_events".parse::<Kind>().is_err());
    }
}

//! The id links between events: what chains decision_id -> frame_id -> handle_id.
//!
//! One function, [`extract`], says which other events a payload points at. Narratives, the
//! audit checks and the dashboards all use it, so "what is linked to what" is defined once.
//! Beware the spec's double meaning of `decision_id`: on TraceEvent and PolicyDecision it is
//! the authorization decision; on ExecutionFeedback it is the router's decision, so that link
//! is named `feedback_decision_id` and points at an ExecutionRoutingDecision.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::Kind;

/// The kind of node a link points at: an event kind, or a flow (a pseudo-node that every
/// event carrying the same `metadata.flow_id` shares; flows are not events themselves).
/// Serialized as a plain string: the kind's wire name, or `flow`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NodeKind {
    /// An event of this kind.
    Event(Kind),
    /// The flow named by `metadata.flow_id`.
    Flow,
}

impl NodeKind {
    /// Wire name: the kind's name, or `flow`.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeKind::Event(k) => k.as_str(),
            NodeKind::Flow => "flow",
        }
    }

    /// Parse a wire name.
    pub fn parse(s: &str) -> Option<Self> {
        if s == "flow" {
            return Some(NodeKind::Flow);
        }
        s.parse::<Kind>().ok().map(NodeKind::Event)
    }
}

impl Serialize for NodeKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for NodeKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        NodeKind::parse(&s)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown node kind `{s}`")))
    }
}

/// Why two nodes are linked. The order of the variants is the **priority** used when an
/// event without a request id is linked to several narratives: the first wins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Via {
    /// TraceEvent.decision_id -> PolicyDecision.
    DecisionId,
    /// TraceEvent.frame_id -> Frame.
    FrameId,
    /// TraceEvent.handle_id -> Handle.
    HandleId,
    /// Frame.handle_refs[] -> Handle.
    HandleRefs,
    /// PolicyDecision.token_id -> CapabilityToken.
    TokenId,
    /// ExecutionFeedback.decision_id -> ExecutionRoutingDecision.
    FeedbackDecisionId,
    /// metadata.flow_id -> the flow.
    FlowId,
    /// metadata.prior_frame_id -> Frame.
    PriorFrameId,
    /// metadata.frame_ids[] -> Frame.
    FrameIds,
}

impl Via {
    /// Parse a wire name.
    pub fn parse(s: &str) -> Option<Self> {
        serde_json::from_value(Value::String(s.to_owned())).ok()
    }

    /// Wire name, e.g. `decision_id`; [`Via::parse`] reads it back.
    pub fn as_str(self) -> &'static str {
        match self {
            Via::DecisionId => "decision_id",
            Via::FrameId => "frame_id",
            Via::HandleId => "handle_id",
            Via::HandleRefs => "handle_refs",
            Via::TokenId => "token_id",
            Via::FeedbackDecisionId => "feedback_decision_id",
            Via::FlowId => "flow_id",
            Via::PriorFrameId => "prior_frame_id",
            Via::FrameIds => "frame_ids",
        }
    }
}

/// One outgoing link of a payload.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Link {
    /// The field the link was read from.
    pub via: Via,
    /// What kind of node the link points at.
    pub to_kind: NodeKind,
    /// The target's id (an event's natural id, or the flow id).
    pub to_id: String,
}

fn str_at<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str).filter(|s| !s.is_empty())
}

/// The non-empty strings of the array at `key` (none when it is absent or not an array).
fn strs_at<'a>(v: &'a Value, key: &str) -> impl Iterator<Item = &'a str> {
    v.get(key)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .filter(|s| !s.is_empty())
}

/// Every link a payload of `kind` carries, in a fixed order, without duplicates.
pub fn extract(kind: Kind, payload: &Value) -> Vec<Link> {
    let mut out: Vec<Link> = Vec::new();
    let mut push = |via: Via, to_kind: NodeKind, id: &str| {
        let link = Link {
            via,
            to_kind,
            to_id: id.to_owned(),
        };
        if !out.contains(&link) {
            out.push(link);
        }
    };
    let ev = NodeKind::Event;
    match kind {
        Kind::TraceEvent => {
            if let Some(id) = str_at(payload, "decision_id") {
                push(Via::DecisionId, ev(Kind::PolicyDecision), id);
            }
            if let Some(id) = str_at(payload, "frame_id") {
                push(Via::FrameId, ev(Kind::Frame), id);
            }
            if let Some(id) = str_at(payload, "handle_id") {
                push(Via::HandleId, ev(Kind::Handle), id);
            }
        }
        Kind::Frame => {
            for id in strs_at(payload, "handle_refs") {
                push(Via::HandleRefs, ev(Kind::Handle), id);
            }
        }
        Kind::PolicyDecision => {
            if let Some(id) = str_at(payload, "token_id") {
                push(Via::TokenId, ev(Kind::CapabilityToken), id);
            }
        }
        Kind::ExecutionFeedback => {
            if let Some(id) = str_at(payload, "decision_id") {
                push(
                    Via::FeedbackDecisionId,
                    ev(Kind::ExecutionRoutingDecision),
                    id,
                );
            }
        }
        _ => {}
    }
    if let Some(meta) = payload.get("metadata") {
        if let Some(id) = str_at(meta, "flow_id") {
            push(Via::FlowId, NodeKind::Flow, id);
        }
        if let Some(id) = str_at(meta, "prior_frame_id") {
            push(Via::PriorFrameId, ev(Kind::Frame), id);
        }
        for id in strs_at(meta, "frame_ids") {
            push(Via::FrameIds, ev(Kind::Frame), id);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn trace_event_chains_decision_frame_handle_and_flow() {
        let te = json!({"event_id": "e", "decision_id": "pd", "frame_id": "f", "handle_id": "h",
                        "metadata": {"flow_id": "fl", "frame_ids": ["f", "f2", ""]}});
        let links = extract(Kind::TraceEvent, &te);
        let got: Vec<(Via, &str)> = links.iter().map(|l| (l.via, l.to_id.as_str())).collect();
        assert_eq!(
            got,
            vec![
                (Via::DecisionId, "pd"),
                (Via::FrameId, "f"),
                (Via::HandleId, "h"),
                (Via::FlowId, "fl"),
                (Via::FrameIds, "f"),
                (Via::FrameIds, "f2"),
            ]
        );
        assert!(Via::DecisionId < Via::FrameId && Via::HandleRefs < Via::TokenId);
    }

    #[test]
    fn feedback_decision_id_points_at_the_routing_decision() {
        let fb = json!({"decision_id": "erd-1", "candidate_id": "c"});
        let l = extract(Kind::ExecutionFeedback, &fb);
        assert_eq!(l.len(), 1);
        assert_eq!(l[0].via, Via::FeedbackDecisionId);
        assert_eq!(
            l[0].to_kind,
            NodeKind::Event(Kind::ExecutionRoutingDecision)
        );
        // On a PolicyDecision, decision_id is its own identity, not a link.
        assert!(extract(Kind::PolicyDecision, &json!({"decision_id": "pd"})).is_empty());
    }

    #[test]
    fn nulls_and_empty_strings_are_not_links() {
        let te = json!({"decision_id": null, "frame_id": "", "handle_id": 3});
        assert!(extract(Kind::TraceEvent, &te).is_empty());
    }
}

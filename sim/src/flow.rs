//! One flow (one request) of agent-kernel + ChainWeaver traffic, built from the typed
//! contracts, with its ground truth.
//!
//! A flow's content depends only on the seed, the flow's index and the config, never on
//! the flows before it: each flow draws from its own ChaCha stream. So `--shuffle`,
//! `--delay` and friends reorder the same events instead of producing different ones.

use std::collections::HashMap;
use std::ops::ControlFlow;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use serde_json::{json, Map, Value};
use weft_schemas::contracts::{
    CandidateType, CapabilityToken, ChoiceCard, CompiledFlow, ExecutionCandidate,
    ExecutionFeedback, ExecutionRoutingDecision, Frame, Handle, Metadata, Outcome, PolicyDecision,
    RoutingDecision, SelectableItem, Sensitivity, TraceEvent, TraceEventType, Verdict,
};
use weft_schemas::time::micros_to_rfc3339;
use weft_schemas::{identity, Envelope, Kind};

use super::truth::{
    EventRef, InjectedViolation, Invariant, Link, NodeRef, RequestTruth, Scenario, Via,
};
use super::{SimConfig, MAX_FLOW_INTERVAL_MS};

mod catalog;
mod kernel;

use catalog::{Step, Template, TEMPLATES, TOPICS, UNRELATED_SCOPE};

/// Which way an [`Scenario::Unauthorized`] flow breaks I-02.
#[derive(Clone, Copy, PartialEq, Eq)]
enum I02 {
    /// No token, no PolicyDecision, no `capability_authorized`: the kernel was bypassed.
    NoDecision,
    /// The PolicyDecision is a deny, `capability_denied` is emitted, and it executes anyway.
    AfterDeny,
    /// An allow PolicyDecision, but no `capability_authorized` before the execution.
    NoAuthorizedEvent,
    /// The kernel records a deny PolicyDecision that no TraceEvent names: no
    /// `capability_denied`, nothing executes, the flow fails (weaver-spec I-02
    /// `policy_decisions_are_traced`).
    Untraced,
}

/// One envelope of the flow, and which member it is.
pub(super) struct Pending {
    pub member: usize,
    pub envelope: Envelope,
}

/// A generated flow: its envelopes in causal order (an id conflict's second version
/// included, duplicates not yet) and its truth, minus the stream decisions.
pub(super) struct FlowOut {
    pub events: Vec<Pending>,
    /// Member-index links (to members, or to index `members.len()` = the flow node), for
    /// the request-id recovery check.
    pub member_links: Vec<(usize, usize)>,
    pub truth: RequestTruth,
    /// Distinct payloads (members plus conflicting second versions).
    pub distinct: u64,
}

/// Draw a flow's scenario from the configured mix.
fn draw_scenario(cfg: &SimConfig, rng: &mut ChaCha8Rng) -> Scenario {
    let u: f64 = rng.random();
    let mut acc = 0.0;
    for (scenario, p) in cfg.mix.entries() {
        acc += p;
        if u < acc {
            return scenario;
        }
    }
    Scenario::Clean
}

/// Generate flow number `n`, starting at `t0` (µs since the epoch).
pub(super) fn generate(cfg: &SimConfig, t0: i64, n: u64) -> FlowOut {
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    rng.set_stream(n.wrapping_mul(2));
    let scenario = draw_scenario(cfg, &mut rng);
    let template = match rng.random_range(0..20) {
        0..=11 => &TEMPLATES[0],
        12..=16 => &TEMPLATES[1],
        _ => &TEMPLATES[2],
    };
    // SimConfig::check bounds the interval to a day, so this cannot overflow.
    let interval = cfg.flow_interval_ms.min(MAX_FLOW_INTERVAL_MS) as i64 * 1000;
    let jitter = if interval > 0 {
        rng.random_range(0..interval)
    } else {
        0
    };
    let start = t0
        .saturating_add(interval.saturating_mul(i64::try_from(n).unwrap_or(i64::MAX)))
        .saturating_add(jitter);
    let principal = format!("agent-session-{:08x}", rng.random::<u32>());
    // Drawn only when asked for, so that every other configuration's flows stay the same.
    let pending_routing = cfg.pending_routing > 0.0 && rng.random_bool(cfg.pending_routing);
    let g = Gen {
        prefix: format!("{}-{}", cfg.seed, n),
        request_id: format!("req-{}-{}", cfg.seed, n),
        flow_id: format!("flow-{}-{}", cfg.seed, n),
        principal,
        topic: TOPICS[rng.random_range(0..TOPICS.len())],
        rng,
        t: start,
        te: 0,
        events: Vec::new(),
        members: Vec::new(),
        index: HashMap::new(),
        links: Vec::new(),
        violations: Vec::new(),
        pending_routing,
    };
    g.run(template, scenario)
}

/// What a flow decided before its first step: the template, the scenario, the step the
/// scenario hits and, for an I-02, how the kernel is bypassed.
struct Plan {
    tpl: &'static Template,
    scenario: Scenario,
    hit: usize,
    i02: I02,
}

/// What carries from one step to the next, and on to the flow's close and feedback.
#[derive(Default)]
struct FlowState {
    /// The Frame ids so far.
    frames: Vec<String>,
    /// Why the flow failed (error type, message), once it has.
    failure: Option<(&'static str, String)>,
    partial: bool,
    /// The previous step's token, policy decision and execution (for token reuse).
    prev: Option<(String, EventRef, EventRef)>,
    last_token: Option<String>,
}

/// The kernel's answer for one step (all `None` when it was bypassed).
#[derive(Default)]
struct Auth {
    decision: Option<(String, EventRef)>,
    token_ref: Option<EventRef>,
    denied_ref: Option<EventRef>,
}

/// One step's execution and the ids of what it produced.
struct Exec {
    exec_id: String,
    exec_ref: EventRef,
    frame_id: String,
    frame_ref: EventRef,
    handle_id: String,
    handle_ref: EventRef,
    outcome: Outcome,
    /// The previous step's Frame, which this step's Frame follows.
    frames_before: Option<String>,
}

/// The state of one flow being generated.
struct Gen {
    /// `<seed>-<n>`, the suffix of every id of this flow.
    prefix: String,
    request_id: String,
    flow_id: String,
    principal: String,
    topic: &'static str,
    rng: ChaCha8Rng,
    /// The current time, µs since the epoch; only ever moves forward.
    t: i64,
    /// TraceEvent counter.
    te: u32,
    events: Vec<Pending>,
    members: Vec<EventRef>,
    index: HashMap<EventRef, usize>,
    links: Vec<(usize, NodeRef, Via)>,
    violations: Vec<InjectedViolation>,
    /// Send the RoutingDecision pending first, then selected ([`SimConfig::pending_routing`]).
    pending_routing: bool,
}

fn meta(pairs: impl IntoIterator<Item = (&'static str, Value)>) -> Metadata {
    pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

/// Round to `places` decimals so floats print short and identically everywhere.
fn round(x: f64, places: i32) -> f64 {
    let f = 10f64.powi(places);
    (x * f).round() / f
}

impl Gen {
    /// Advance the clock by a random amount in `lo..hi` microseconds; return the new time.
    fn tick_us(&mut self, lo: i64, hi: i64) -> i64 {
        self.t += self.rng.random_range(lo..hi.max(lo + 1));
        self.t
    }

    fn tick_ms(&mut self, lo: i64, hi: i64) -> i64 {
        self.tick_us(lo * 1000, hi * 1000)
    }

    fn now(&self) -> String {
        micros_to_rfc3339(self.t)
    }

    fn next_te_id(&mut self) -> String {
        let id = format!("te-{}-{}", self.prefix, self.te);
        self.te += 1;
        id
    }

    /// A TraceEvent of this flow at the current time, with its id and principal set.
    fn trace_event(&mut self, id: String, event_type: TraceEventType) -> TraceEvent {
        TraceEvent {
            event_id: id,
            event_type,
            timestamp: self.now(),
            capability_id: None,
            principal: Some(Some(self.principal.clone())),
            decision_id: None,
            frame_id: None,
            handle_id: None,
            outcome: None,
            error_message: None,
            metadata: None,
            extra: Map::new(),
        }
    }

    /// Add one event: serialize it into an envelope, make it a member, record its links.
    /// An id already seen becomes a second version of that member (an id conflict).
    fn emit(
        &mut self,
        kind: Kind,
        id: String,
        payload: &impl Serialize,
        links: Vec<(NodeRef, Via)>,
    ) -> EventRef {
        let envelope = Envelope::new(kind, payload)
            // The payload is one of our own contract structs: string keys, finite floats.
            .expect("a typed contract always serializes to JSON")
            .with_request_id(self.request_id.clone());
        let id = match kind {
            Kind::ExecutionFeedback => serde_json::from_str(envelope.payload.get())
                .ok()
                .and_then(|v: Value| identity::identity(kind, &v).ok())
                .expect("ExecutionFeedback identity is a hash of JSON we just wrote"),
            _ => id,
        };
        let me = EventRef::new(kind, id);
        let member = match self.index.get(&me) {
            Some(&m) => m,
            None => {
                let m = self.members.len();
                self.members.push(me.clone());
                self.index.insert(me.clone(), m);
                for (to, via) in links {
                    self.links.push((m, to, via));
                }
                m
            }
        };
        self.events.push(Pending { member, envelope });
        me
    }

    fn violation(&mut self, invariant: Invariant, events: Vec<EventRef>, detail: String) {
        let subject = events[0].clone();
        self.violations.push(InjectedViolation {
            invariant,
            subject,
            events,
            detail,
        });
    }

    fn flow_link(&self) -> (NodeRef, Via) {
        (NodeRef::flow(self.flow_id.clone()), Via::FlowId)
    }

    /// The whole flow: routing, the flow's start, each step, its close and the feedback.
    /// Every random draw and clock tick happens in the order the steps below are written,
    /// so a flow is the same for the same seed whatever the code's layout.
    fn run(mut self, tpl: &'static Template, scenario: Scenario) -> FlowOut {
        let steps = tpl.steps.len();
        let hit = match scenario {
            Scenario::ReusedToken => self.rng.random_range(1..steps),
            _ => self.rng.random_range(0..steps),
        };
        let i02 = match self.rng.random_range(0..4) {
            0 => I02::NoDecision,
            1 => I02::AfterDeny,
            2 => I02::Untraced,
            _ => I02::NoAuthorizedEvent,
        };
        let plan = Plan {
            tpl,
            scenario,
            hit,
            i02,
        };
        let flow_start = self.t;
        self.routing_decision(tpl);
        // flow_started's id is taken first so it is always te-<seed>-<n>-0.
        let anchor = self.next_te_id();
        let erd_ref = self.execution_routing_decision(tpl);
        self.flow_started(tpl, anchor);
        let mut st = FlowState::default();
        for (i, step) in tpl.steps.iter().enumerate() {
            if self.step(&plan, i, step, &mut st).is_break() {
                break;
            }
        }
        self.flow_closed(tpl, &st);
        self.feedback(tpl, &st, erd_ref, flow_start);
        self.finish(tpl, scenario)
    }

    /// contextweaver routes the request to a flow.
    fn routing_decision(&mut self, tpl: &'static Template) {
        let rd_id = format!("rd-{}", self.prefix);
        let mut rd = RoutingDecision {
            id: rd_id.clone(),
            choice_cards: vec![ChoiceCard {
                id: "card-flows".into(),
                items: TEMPLATES
                    .iter()
                    .map(|t| SelectableItem {
                        id: t.name.into(),
                        label: t.label.into(),
                        description: t.description.into(),
                        capability_id: Some(t.steps[0].capability.into()),
                        metadata: None,
                        extra: Map::new(),
                    })
                    .collect(),
                context_hint: Some("Select the flow that best serves the user's request.".into()),
                metadata: None,
                extra: Map::new(),
            }],
            selected_item_id: Some(Some(tpl.name.into())),
            selected_card_id: Some(Some("card-flows".into())),
            timestamp: self.now(),
            context_summary: Some(format!(
                "User asked about {}. Routing to {}.",
                self.topic, tpl.name
            )),
            metadata: None,
            extra: Map::new(),
        };
        if self.pending_routing {
            // The same decision before the LLM answered: a second content under its id,
            // which the audit must recognise as the decision's completion.
            let selected = (rd.selected_item_id.take(), rd.selected_card_id.take());
            rd.selected_item_id = Some(None);
            rd.selected_card_id = Some(None);
            self.emit(Kind::RoutingDecision, rd_id.clone(), &rd, vec![]);
            (rd.selected_item_id, rd.selected_card_id) = selected;
        }
        self.emit(Kind::RoutingDecision, rd_id, &rd, vec![]);
    }

    /// The router recommends the compiled flow.
    fn execution_routing_decision(&mut self, tpl: &'static Template) -> EventRef {
        self.tick_ms(2, 8);
        let erd_id = format!("erd-{}", self.prefix);
        let erd = ExecutionRoutingDecision {
            decision_id: erd_id.clone(),
            candidate: ExecutionCandidate {
                candidate_id: tpl.name.into(),
                candidate_type: CandidateType::Flow,
                name: Some(Some(tpl.label.into())),
                version: Some(Some(tpl.version.into())),
                description: None,
                compiled_flow: Some(Some(CompiledFlow {
                    flow_id: tpl.name.into(),
                    name: None,
                    version: Some(Some(tpl.version.into())),
                    description: Some(Some(tpl.description.into())),
                    input_schema_ref: None,
                    output_schema_ref: None,
                    tool_dependencies: Some(
                        tpl.steps.iter().map(|s| s.capability.into()).collect(),
                    ),
                    sensitivity: Some(Some(Sensitivity::Internal)),
                    side_effects: Some(vec!["data_read".into()]),
                    requires_authorization: Some(true),
                    metadata: None,
                    extra: Map::new(),
                })),
                metadata: None,
                extra: Map::new(),
            },
            confidence: Some(Some(round(self.rng.random_range(0.55..0.99), 3))),
            reason_codes: Some(vec!["capability_match".into(), "historical_success".into()]),
            reason: Some(Some(format!(
                "{} matches the request and has succeeded before.",
                tpl.name
            ))),
            fallback_candidates: Some(vec![ExecutionCandidate {
                candidate_id: "generic_agent_loop".into(),
                candidate_type: CandidateType::Workflow,
                name: Some(Some("Generic agent loop".into())),
                version: None,
                description: None,
                compiled_flow: None,
                metadata: None,
                extra: Map::new(),
            }]),
            constraints: None,
            policy_context_ref: None,
            trace_ref: None,
            created_at: Some(Some(self.now())),
            metadata: Some(meta([("flow_id", json!(self.flow_id))])),
            extra: Map::new(),
        };
        self.emit(
            Kind::ExecutionRoutingDecision,
            erd_id,
            &erd,
            vec![self.flow_link()],
        )
    }

    /// ChainWeaver starts the flow.
    fn flow_started(&mut self, tpl: &'static Template, anchor: String) {
        self.tick_ms(1, 4);
        let mut ev = self.trace_event(anchor.clone(), TraceEventType::FlowStarted);
        ev.metadata = Some(meta([
            ("flow_id", json!(self.flow_id)),
            ("flow_name", json!(tpl.name)),
            ("step_count", json!(tpl.steps.len())),
        ]));
        self.emit(Kind::TraceEvent, anchor, &ev, vec![self.flow_link()]);
    }

    /// One step: started, authorized by the kernel, executed, its Frame and Handle, the
    /// violation it injects, completed. Breaks when the step ends the flow (a deny or a
    /// failing tool).
    fn step(
        &mut self,
        plan: &Plan,
        i: usize,
        step: &'static Step,
        st: &mut FlowState,
    ) -> ControlFlow<()> {
        let here = i == plan.hit;
        self.tick_ms(1, 5);
        let id = self.next_te_id();
        let mut ev = self.trace_event(id.clone(), TraceEventType::FlowStepStarted);
        ev.capability_id = Some(Some(step.capability.into()));
        ev.metadata = Some(meta([
            ("flow_id", json!(self.flow_id)),
            ("step", json!(i)),
            ("step_name", json!(step.name)),
        ]));
        self.emit(Kind::TraceEvent, id, &ev, vec![self.flow_link()]);

        let bypass = here && plan.scenario == Scenario::Unauthorized && plan.i02 == I02::NoDecision;
        let auth = if bypass {
            Auth::default()
        } else {
            self.authorize(plan, i, step, st)?
        };
        let ex = self.execute(plan, i, step, &auth, st)?;
        let frame = self.frame_and_handle(plan, i, step, &ex);
        if here {
            self.step_violation(plan, step, &ex, &auth, st);
        }
        if let (Some(tok), Some((_, pd_ref))) = (st.last_token.clone(), auth.decision.clone()) {
            st.prev = Some((tok, pd_ref, ex.exec_ref.clone()));
        }
        self.step_completed(plan, i, step, &ex, frame, st);
        ControlFlow::Continue(())
    }

    /// ChainWeaver closes the flow: `flow_completed`, or `flow_failed` after a deny or a
    /// failing tool.
    fn flow_closed(&mut self, tpl: &'static Template, st: &FlowState) {
        self.tick_ms(1, 5);
        let id = self.next_te_id();
        let ty = if st.failure.is_some() {
            TraceEventType::FlowFailed
        } else {
            TraceEventType::FlowCompleted
        };
        let mut ev = self.trace_event(id.clone(), ty);
        ev.outcome = Some(match (&st.failure, st.partial) {
            (Some(_), _) => Outcome::Failure,
            (None, true) => Outcome::Partial,
            (None, false) => Outcome::Success,
        });
        if let Some((_, msg)) = &st.failure {
            ev.error_message = Some(Some(msg.clone()));
        }
        ev.metadata = Some(meta([
            ("flow_id", json!(self.flow_id)),
            ("frame_ids", json!(st.frames)),
            ("step_count", json!(tpl.steps.len())),
        ]));
        let mut links = vec![self.flow_link()];
        links.extend(
            st.frames
                .iter()
                .map(|f| (EventRef::new(Kind::Frame, f.clone()).into(), Via::FrameIds)),
        );
        self.emit(Kind::TraceEvent, id, &ev, links);
    }

    /// ChainWeaver reports how the routed flow did.
    fn feedback(
        &mut self,
        tpl: &'static Template,
        st: &FlowState,
        erd_ref: EventRef,
        flow_start: i64,
    ) {
        self.tick_ms(1, 10);
        let ok = st.failure.is_none();
        let quality = match (ok, st.partial) {
            (false, _) => None,
            (true, true) => Some(Some(round(self.rng.random_range(0.3..0.7), 2))),
            (true, false) => Some(Some(round(self.rng.random_range(0.7..1.0), 2))),
        };
        let tokens = self.rng.random_range(300..6000u64);
        let failure = &st.failure;
        let fb = ExecutionFeedback {
            decision_id: erd_ref.id.clone(),
            candidate_id: tpl.name.into(),
            success: ok,
            timestamp: self.now(),
            latency_ms: Some(Some(
                u64::try_from((self.t - flow_start) / 1000)
                    .unwrap_or(0)
                    .into(),
            )),
            cost: Some(meta([
                ("llm_tokens", json!(tokens)),
                ("usd", json!(round(tokens as f64 * 0.000_002, 6))),
            ])),
            quality_score: quality,
            error_type: failure.as_ref().map(|(t, _)| Some((*t).to_owned())),
            error_message: failure.as_ref().map(|(_, m)| Some(m.clone())),
            trace_ref: Some(Some(format!("chainweaver:trace_id:{}", self.request_id))),
            execution_summary: Some(meta([
                ("flow_name", json!(tpl.name)),
                ("step_count", json!(st.frames.len())),
            ])),
            metadata: None,
            extra: Map::new(),
        };
        self.emit(
            Kind::ExecutionFeedback,
            String::new(),
            &fb,
            vec![(erd_ref.into(), Via::FeedbackDecisionId)],
        );
    }

    /// A plausible firewall summary and structured data for a step.
    fn summary(&mut self, step: &Step, outcome: Outcome) -> (String, Map<String, Value>) {
        let topic = self.topic;
        let partial = if outcome == Outcome::Partial {
            " Output was truncated."
        } else {
            ""
        };
        let (summary, data) = match step.name {
            "research" => {
                let k = self.rng.random_range(1..9);
                (
                    format!("Found {k} documents about {topic}.{partial}"),
                    meta([("result_count", json!(k))]),
                )
            }
            "codegen" => {
                let lines = self.rng.random_range(20..400);
                (
                    format!("Generated {lines} lines of Python for {topic}; source stored as a Handle.{partial}"),
                    meta([("lines", json!(lines)), ("language", json!("python"))]),
                )
            }
            "test" => {
                let total = self.rng.random_range(5..60);
                let passed = self.rng.random_range(total / 2..=total);
                (
                    format!("{passed} of {total} tests passed.{partial}"),
                    meta([("passed", json!(passed)), ("total", json!(total))]),
                )
            }
            "fetch" => {
                let kb = self.rng.random_range(4..300);
                (
                    format!("Fetched a {kb} KB page about {topic}.{partial}"),
                    meta([("kilobytes", json!(kb))]),
                )
            }
            _ => {
                let n = self.rng.random_range(2..12);
                (
                    format!("Summarized {n} sections about {topic}.{partial}"),
                    meta([("sections", json!(n))]),
                )
            }
        };
        (summary, data)
    }

    fn finish(self, tpl: &Template, scenario: Scenario) -> FlowOut {
        let mut links = Vec::new();
        let mut dangling = Vec::new();
        let mut member_links = Vec::new();
        let flow_node = self.members.len();
        for (from, to, via) in self.links {
            let target = match to.event() {
                Some(e) => self.index.get(&e).copied(),
                None => Some(flow_node),
            };
            let link = Link {
                from: self.members[from].clone(),
                to,
                via,
            };
            match target {
                Some(t) => {
                    member_links.push((from, t));
                    links.push(link);
                }
                None => dangling.push(link),
            }
        }
        // Every payload of a flow is distinct: exact copies are only added later, by the
        // stream stage, and an id conflict's second version always differs from the first.
        let distinct = self.events.len() as u64;
        FlowOut {
            member_links,
            distinct,
            truth: RequestTruth {
                request_id: self.request_id,
                flow_id: self.flow_id,
                flow_name: tpl.name.into(),
                scenario,
                members: self.members,
                links,
                dangling,
                without_request_id: Vec::new(),
                violations: self.violations,
            },
            events: self.events,
        }
    }
}

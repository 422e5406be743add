//! The kernel's side of one flow step: the token and the PolicyDecision, the execution and
//! its Frame and Handle, the violations a scenario injects there, and the step's close.
//! Methods of [`Gen`](super::Gen), split off `flow.rs` along that seam.

use super::*;

impl Gen {
    /// The kernel's part of a step: a token (new, or the previous step's when reused), the
    /// PolicyDecision, then `capability_denied` or `capability_authorized`. Breaks when a
    /// deny ends the flow.
    pub(super) fn authorize(
        &mut self,
        plan: &Plan,
        i: usize,
        step: &'static Step,
        st: &mut FlowState,
    ) -> ControlFlow<(), Auth> {
        let here = i == plan.hit;
        let scenario = plan.scenario;
        let (token_id, tref) = self.token(plan, i, step, st);
        st.last_token = Some(token_id.clone());
        if here && scenario == Scenario::ExpiredToken {
            // The kernel's queue stalls past the token's expiry.
            self.tick_ms(1200, 2500);
        } else {
            self.tick_ms(1, 3);
        }
        let untraced = here && scenario == Scenario::Unauthorized && plan.i02 == I02::Untraced;
        let deny = here
            && (scenario == Scenario::Deny
                || untraced
                || (scenario == Scenario::Unauthorized && plan.i02 == I02::AfterDeny));
        let pd_id = format!("pd-{}-{i}", self.prefix);
        let pd = PolicyDecision {
            decision_id: pd_id.clone(),
            decision: if deny { Verdict::Deny } else { Verdict::Allow },
            capability_id: step.capability.into(),
            principal: self.principal.clone(),
            token_id: Some(Some(token_id.clone())),
            reason: Some(if deny {
                format!("principal not allowed to invoke {}", step.capability)
            } else {
                "token scope includes the capability; token unexpired".into()
            }),
            timestamp: self.now(),
            metadata: Some(meta([
                ("policy_engine_version", json!("agent-kernel@0.12.0")),
                (
                    "evaluated_rules",
                    json!(["scope-check", "expiry-check", "principal-allowlist"]),
                ),
            ])),
            extra: Map::new(),
        };
        let pd_ref = self.emit(
            Kind::PolicyDecision,
            pd_id.clone(),
            &pd,
            vec![(tref.clone().into(), Via::TokenId)],
        );
        let to_pd = (pd_ref.clone().into(), Via::DecisionId);
        self.tick_us(100, 900);
        if untraced {
            // The deny is on record, but no TraceEvent names it (no `capability_denied`):
            // ChainWeaver stops the flow all the same.
            self.violation(
                Invariant::I02,
                vec![pd_ref],
                format!("PolicyDecision {pd_id} is named by no TraceEvent"),
            );
            st.failure = Some((
                "policy_denied",
                format!("{} was denied by policy", step.capability),
            ));
            return ControlFlow::Break(());
        }
        let mut denied_ref = None;
        if deny {
            let id = self.next_te_id();
            let mut ev = self.trace_event(id.clone(), TraceEventType::CapabilityDenied);
            ev.capability_id = Some(Some(step.capability.into()));
            ev.decision_id = Some(Some(pd_id.clone()));
            ev.outcome = Some(Outcome::Failure);
            ev.error_message = Some(Some("denied by policy".into()));
            denied_ref = Some(self.emit(Kind::TraceEvent, id, &ev, vec![to_pd.clone()]));
            if scenario == Scenario::Deny {
                st.failure = Some((
                    "policy_denied",
                    format!("{} was denied by policy", step.capability),
                ));
                return ControlFlow::Break(());
            }
        } else if !(here
            && scenario == Scenario::Unauthorized
            && plan.i02 == I02::NoAuthorizedEvent)
        {
            let id = self.next_te_id();
            let mut ev = self.trace_event(id.clone(), TraceEventType::CapabilityAuthorized);
            ev.capability_id = Some(Some(step.capability.into()));
            ev.decision_id = Some(Some(pd_id.clone()));
            ev.outcome = Some(Outcome::Success);
            self.emit(Kind::TraceEvent, id, &ev, vec![to_pd]);
        }
        ControlFlow::Continue(Auth {
            decision: Some((pd_id, pd_ref)),
            token_ref: Some(tref),
            denied_ref,
        })
    }

    /// The step's token: the previous step's when this step reuses it, else a new one
    /// (out of scope, expiring fast, scoped for the next step's reuse, or never emitted as
    /// the scenario wants).
    pub(super) fn token(
        &mut self,
        plan: &Plan,
        i: usize,
        step: &'static Step,
        st: &FlowState,
    ) -> (String, EventRef) {
        let here = i == plan.hit;
        let scenario = plan.scenario;
        if let (Some((tok, _, _)), true) = (&st.prev, here && scenario == Scenario::ReusedToken) {
            return (
                tok.clone(),
                EventRef::new(Kind::CapabilityToken, tok.clone()),
            );
        }
        let reused_next = scenario == Scenario::ReusedToken && i + 1 == plan.hit && !here;
        let out_of_scope = here && scenario == Scenario::OutOfScope;
        let expiring_fast = here && scenario == Scenario::ExpiredToken;
        self.tick_ms(1, 4);
        let mut scope: Vec<String> = if out_of_scope {
            UNRELATED_SCOPE.iter().map(|s| s.to_string()).collect()
        } else {
            vec![step.capability.into()]
        };
        if reused_next {
            scope.push(plan.tpl.steps[i + 1].capability.into());
        }
        let token_id = format!("tok-{}-{i}", self.prefix);
        let ttl_ms = if expiring_fast { 250 } else { 15 * 60 * 1000 };
        let single_use = reused_next || self.rng.random_bool(0.5);
        let tok = CapabilityToken {
            token_id: token_id.clone(),
            principal: self.principal.clone(),
            scope,
            issued_at: self.now(),
            expires_at: Some(Some(micros_to_rfc3339(self.t + ttl_ms * 1000))),
            single_use: Some(single_use),
            issuer: Some("agent-kernel-sim-1".into()),
            metadata: Some(meta([("session_id", json!(self.principal))])),
            extra: Map::new(),
        };
        if here && scenario == Scenario::UnknownToken {
            // Minted where nothing logs it (another kernel, a hand-made token): its
            // decision's link to it dangles, and nothing shows its scope or expiry.
            return (
                token_id.clone(),
                EventRef::new(Kind::CapabilityToken, token_id),
            );
        }
        let r = self.emit(Kind::CapabilityToken, token_id.clone(), &tok, vec![]);
        (token_id, r)
    }

    /// `capability_executed`. Breaks when the tool fails and ends the flow.
    pub(super) fn execute(
        &mut self,
        plan: &Plan,
        i: usize,
        step: &'static Step,
        auth: &Auth,
        st: &mut FlowState,
    ) -> ControlFlow<(), Exec> {
        let here = i == plan.hit;
        let p = self.prefix.clone();
        let (lo, hi) = step.latency_ms;
        let before = self.t;
        self.tick_ms(lo, hi);
        let duration_ms = (self.t - before) / 1000;
        let exec_id = self.next_te_id();
        let mut ev = self.trace_event(exec_id.clone(), TraceEventType::CapabilityExecuted);
        ev.capability_id = Some(Some(step.capability.into()));
        let mut links = Vec::new();
        if let Some((pd_id, pd_ref)) = &auth.decision {
            ev.decision_id = Some(Some(pd_id.clone()));
            links.push((pd_ref.clone().into(), Via::DecisionId));
        }
        if here && plan.scenario == Scenario::Failure {
            ev.outcome = Some(Outcome::Failure);
            ev.error_message = Some(Some(format!(
                "{} timed out after {duration_ms} ms",
                step.capability
            )));
            ev.metadata = Some(meta([("duration_ms", json!(duration_ms))]));
            self.emit(Kind::TraceEvent, exec_id, &ev, links);
            st.failure = Some((
                "tool_error",
                format!("step {} ({}) failed", i, step.capability),
            ));
            return ControlFlow::Break(());
        }
        let frame_id = format!("frame-{p}-{i}");
        let handle_id = format!("handle-{p}-{i}");
        let outcome = if here && plan.scenario == Scenario::Partial {
            st.partial = true;
            Outcome::Partial
        } else {
            Outcome::Success
        };
        ev.frame_id = Some(Some(frame_id.clone()));
        ev.handle_id = Some(Some(handle_id.clone()));
        ev.outcome = Some(outcome);
        ev.metadata = Some(meta([("duration_ms", json!(duration_ms))]));
        let frame_ref = EventRef::new(Kind::Frame, frame_id.clone());
        let handle_ref = EventRef::new(Kind::Handle, handle_id.clone());
        links.push((frame_ref.clone().into(), Via::FrameId));
        links.push((handle_ref.clone().into(), Via::HandleId));
        let exec_ref = self.emit(Kind::TraceEvent, exec_id.clone(), &ev, links);
        ControlFlow::Continue(Exec {
            exec_id,
            exec_ref,
            frame_id,
            frame_ref,
            handle_id,
            handle_ref,
            outcome,
            frames_before: st.frames.last().cloned(),
        })
    }

    /// The firewall's Frame, then the raw artifact's Handle (never sent for an orphan).
    /// Returns the Frame, for an id conflict's second version.
    pub(super) fn frame_and_handle(
        &mut self,
        plan: &Plan,
        i: usize,
        step: &'static Step,
        ex: &Exec,
    ) -> Frame {
        let here = i == plan.hit;
        self.tick_us(50, 400);
        let (summary, data) = self.summary(step, ex.outcome);
        let mut fmeta = meta([("flow_id", json!(self.flow_id)), ("step", json!(i))]);
        let mut flinks = vec![
            (ex.handle_ref.clone().into(), Via::HandleRefs),
            self.flow_link(),
        ];
        if let Some(prior) = &ex.frames_before {
            fmeta.insert("prior_frame_id".into(), json!(prior));
            flinks.push((
                EventRef::new(Kind::Frame, prior.clone()).into(),
                Via::PriorFrameId,
            ));
        }
        let mut frame = Frame {
            frame_id: ex.frame_id.clone(),
            capability_id: step.capability.into(),
            summary,
            structured_data: Some(Some(data)),
            handle_refs: Some(vec![ex.handle_id.clone()]),
            redaction_notes: Some("Raw tool output stored as a Handle.".into()),
            created_at: self.now(),
            metadata: Some(fmeta),
            extra: Map::new(),
        };
        let raw_output = here && plan.scenario == Scenario::RawOutput;
        if raw_output {
            frame.extra.insert(
                "raw_output".into(),
                json!(format!(
                    "<raw {} response for {}>",
                    step.capability, self.topic
                )),
            );
        }
        self.emit(Kind::Frame, ex.frame_id.clone(), &frame, flinks);
        if raw_output {
            self.violation(
                Invariant::I01,
                vec![ex.frame_ref.clone()],
                format!("Frame {} carries raw_output", ex.frame_id),
            );
        }
        self.tick_us(50, 400);
        if here && plan.scenario == Scenario::Orphan {
            self.violation(
                Invariant::Orphan,
                vec![ex.exec_ref.clone()],
                format!(
                    "capability_executed {} references handle {}, \
                     which is never emitted (so does Frame {}.handle_refs)",
                    ex.exec_id, ex.handle_id, ex.frame_id
                ),
            );
        } else {
            let handle = Handle {
                handle_id: ex.handle_id.clone(),
                capability_id: step.capability.into(),
                artifact_type: step.artifact_type.into(),
                created_at: self.now(),
                expires_at: Some(Some(micros_to_rfc3339(self.t + 24 * 3600 * 1_000_000))),
                access_policy: Some("policy://agent-kernel/handle-default".into()),
                byte_size: Some(Some(self.rng.random_range(512..262_144u64).into())),
                metadata: Some(meta([("storage_backend", json!("handlestore-sim"))])),
                extra: Map::new(),
            };
            self.emit(Kind::Handle, ex.handle_id.clone(), &handle, vec![]);
        }
        frame
    }

    /// The I-06 / I-02 finding the step that is hit injects, naming the token or the
    /// execution it concerns.
    pub(super) fn step_violation(
        &mut self,
        plan: &Plan,
        step: &'static Step,
        ex: &Exec,
        auth: &Auth,
        st: &FlowState,
    ) {
        let exec_id = &ex.exec_id;
        let exec_ref = ex.exec_ref.clone();
        let decision = auth.decision.clone();
        match plan.scenario {
            Scenario::ExpiredToken => {
                if let (Some(tok), Some((_, pd_ref))) = (auth.token_ref.clone(), decision) {
                    let detail = format!(
                        "token {} expired 250 ms after issue but authorized {} and was used by {exec_id} at {}",
                        tok.id, pd_ref.id, micros_to_rfc3339(self.t)
                    );
                    self.violation(Invariant::I06, vec![tok, pd_ref, exec_ref], detail);
                }
            }
            Scenario::ReusedToken => {
                if let (Some((tok, prev_pd, prev_exec)), Some((_, pd_ref))) =
                    (st.prev.clone(), decision)
                {
                    let detail = format!(
                        "single-use token {tok} used by {} and again by {}",
                        prev_pd.id, pd_ref.id
                    );
                    self.violation(
                        Invariant::I06,
                        vec![
                            EventRef::new(Kind::CapabilityToken, tok),
                            prev_pd,
                            prev_exec,
                            pd_ref,
                            exec_ref,
                        ],
                        detail,
                    );
                }
            }
            Scenario::OutOfScope => {
                if let (Some(tok), Some((_, pd_ref))) = (auth.token_ref.clone(), decision) {
                    let detail = format!(
                        "{} executed by {exec_id} is outside the scope of token {}",
                        step.capability, tok.id
                    );
                    self.violation(Invariant::I06, vec![tok, pd_ref, exec_ref], detail);
                }
            }
            Scenario::UnknownToken => {
                if let (Some(tok), Some((_, pd_ref))) = (auth.token_ref.clone(), decision) {
                    let detail = format!(
                        "token {} that {} allowed (and {exec_id} used) is never emitted",
                        tok.id, pd_ref.id
                    );
                    self.violation(Invariant::I06, vec![tok, pd_ref], detail);
                }
            }
            Scenario::Unauthorized => {
                let mut events = vec![exec_ref];
                let detail = match plan.i02 {
                    I02::NoDecision => format!(
                        "capability_executed {exec_id} has no PolicyDecision and no capability_authorized"
                    ),
                    I02::AfterDeny => {
                        events.extend(decision.map(|(_, r)| r));
                        events.extend(auth.denied_ref.clone());
                        format!("capability_executed {exec_id} follows a deny")
                    }
                    // Never reached: the flow stops at the untraced deny.
                    I02::Untraced => return,
                    I02::NoAuthorizedEvent => {
                        events.extend(decision.map(|(_, r)| r));
                        format!(
                            "capability_executed {exec_id} has an allow PolicyDecision but no capability_authorized"
                        )
                    }
                };
                self.violation(Invariant::I02, events, detail);
            }
            _ => {}
        }
    }

    /// `flow_step_completed`, and an id conflict's second version when the step is hit.
    pub(super) fn step_completed(
        &mut self,
        plan: &Plan,
        i: usize,
        step: &'static Step,
        ex: &Exec,
        mut frame: Frame,
        st: &mut FlowState,
    ) {
        self.tick_ms(1, 4);
        let id = self.next_te_id();
        let mut ev = self.trace_event(id.clone(), TraceEventType::FlowStepCompleted);
        ev.capability_id = Some(Some(step.capability.into()));
        ev.frame_id = Some(Some(ex.frame_id.clone()));
        ev.outcome = Some(ex.outcome);
        ev.metadata = Some(meta([
            ("flow_id", json!(self.flow_id)),
            ("step", json!(i)),
            ("step_name", json!(step.name)),
        ]));
        let step_links = vec![
            (ex.frame_ref.clone().into(), Via::FrameId),
            self.flow_link(),
        ];
        let step_ref = self.emit(Kind::TraceEvent, id.clone(), &ev, step_links);
        st.frames.push(ex.frame_id.clone());

        if i == plan.hit && plan.scenario == Scenario::IdConflict {
            // The same id again with different content: a retried emitter that changed
            // its mind about the summary, or about the step's metadata.
            self.tick_us(100, 900);
            let conflicted = if self.rng.random_bool(0.5) {
                frame.summary.push_str(" (revised)");
                frame.extra.remove("raw_output");
                self.emit(Kind::Frame, ex.frame_id.clone(), &frame, vec![]);
                ex.frame_ref.clone()
            } else {
                if let Some(m) = ev.metadata.as_mut() {
                    m.insert("attempt".into(), json!(2));
                }
                self.emit(Kind::TraceEvent, id, &ev, vec![]);
                step_ref
            };
            let detail = format!("{conflicted} emitted twice with different content");
            self.violation(Invariant::IdConflict, vec![conflicted], detail);
        }
    }
}

"""ChainWeaver adapter: a `FlowExecutorMiddleware` that publishes flow lifecycle events.

Why: ChainWeaver keeps its traces to itself (memory, JSONL, SQLite). `WeftFlowMiddleware`
turns each execution into TraceEvents weft can narrate — `flow_started`,
`flow_step_started`, `flow_step_completed` (outcome success or failure), `flow_completed`
or `flow_failed` — each with `metadata.flow_id` (one per execution) and
`metadata.step_index`. The request id is ChainWeaver's `trace_id`, which the middleware
also puts in the context for the duration of the flow, so kernel events made by a step
that delegates to weaver-kernel (see `KernelBridge`) join the same narrative and carry the
step's flow id and index.

When the flow was chosen by an ExecutionRoutingDecision (announce it with
`middleware.routed(decision)` around `execute_flow`), the middleware publishes that
decision (unless told the router already did) and, at the end, the ExecutionFeedback:
success, latency and `trace_ref` `chainweaver:trace_id:<id>`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import datetime
import functools
import threading
from collections.abc import Iterator
from typing import Any

from .context import FlowStep, reset_flow_step, reset_request_id, set_flow_step, set_request_id
from .publisher import Publisher, contract_to_dict, iso_timestamp

_routed: contextvars.ContextVar[tuple[Any, bool] | None] = contextvars.ContextVar("weft_routed", default=None)


def flow_id_for(trace_id: str) -> str:
    """The weft flow id of one ChainWeaver execution."""
    return f"chainweaver:{trace_id}"


def trace_ref_for(trace_id: str) -> str:
    """The ExecutionFeedback `trace_ref` of one ChainWeaver execution."""
    return f"chainweaver:trace_id:{trace_id}"


def _now() -> str:
    return datetime.datetime.now(tz=datetime.timezone.utc).isoformat()


class WeftFlowMiddleware:
    """A ChainWeaver `FlowExecutorMiddleware` publishing to weft (register it with
    `FlowExecutor(..., middleware=[WeftFlowMiddleware(publisher)])`)."""

    def __init__(self, publisher: Publisher, *, principal: str | None = None) -> None:
        self._publisher = publisher
        self._principal = principal
        self._lock = threading.Lock()
        # trace_id -> (routing decision or None, context tokens to undo at the end)
        self._runs: dict[str, dict[str, Any]] = {}

    @contextlib.contextmanager
    def routed(self, decision: Any, *, publish_decision: bool = True) -> Iterator[None]:
        """The flow(s) executed inside this block were chosen by `decision` (a
        weaver-contracts ExecutionRoutingDecision). Set `publish_decision=False` when the
        router publishes its decisions itself (e.g. `weft router`)."""
        token = _routed.set((decision, publish_decision))
        try:
            yield
        finally:
            _routed.reset(token)

    def bind(self, executor: Any) -> Any:
        """Register on `executor` (if not yet) and bind each capability step's index for
        the kernel events it causes. Needed because ChainWeaver 0.14 fires `on_step_start`
        for a `step_type="capability"` step only after the kernel call returned; without
        `bind`, those kernel events carry the flow id but no step index. Returns executor."""
        if self not in getattr(executor, "_middleware", []):
            executor.add_middleware(self)
        inner = getattr(executor, "_execute_capability_step", None)
        if inner is None:
            return executor

        @functools.wraps(inner)
        def execute_capability_step(step_index: int, step: Any, context: Any, flow_name: str,
                                    trace_id: str, *args: Any, **kwargs: Any) -> Any:
            token = set_flow_step(FlowStep(flow_id_for(trace_id), step_index))
            try:
                return inner(step_index, step, context, flow_name, trace_id, *args, **kwargs)
            finally:
                reset_flow_step(token)

        executor._execute_capability_step = execute_capability_step
        return executor

    # -- hooks ----------------------------------------------------------------------------
    def on_flow_start(self, ctx: Any) -> None:
        """flow_started; binds the request id (= trace_id) and flow for what follows."""
        tid = ctx.trace_id
        fid = flow_id_for(tid)
        routed = _routed.get()
        run: dict[str, Any] = {
            "decision": routed[0] if routed else None,
            "rid_token": set_request_id(tid),
            "step_token": set_flow_step(FlowStep(fid, None)),
        }
        with self._lock:
            self._runs[tid] = run
        if routed and routed[1]:
            self._publisher.publish(
                "execution_routing_decision", functools.partial(_decision, routed[0]), request_id=tid
            )
        meta = {
            "flow_id": fid,
            "flow_name": ctx.flow_name,
            "flow_version": ctx.flow_version,
            "total_steps": ctx.total_steps,
            "chainweaver_trace_id": tid,
        }
        if routed:
            meta["routing_decision_id"] = routed[0].decision_id
        self._event(tid, f"cw-{tid}-start", "flow_started", ctx.started_at, ctx.flow_name, meta)

    def on_step_start(self, ctx: Any) -> None:
        """flow_step_started; kernel calls inside the step carry its flow id and index."""
        fid = flow_id_for(ctx.trace_id)
        set_flow_step(FlowStep(fid, ctx.step_index))
        meta = {"flow_id": fid, "step_index": ctx.step_index, "tool_name": ctx.tool_name, "flow_name": ctx.flow_name}
        self._event(ctx.trace_id, f"cw-{ctx.trace_id}-s{ctx.step_index}-start", "flow_step_started",
                    ctx.started_at, ctx.tool_name, meta)

    def on_step_end(self, ctx: Any) -> None:
        """flow_step_completed, with outcome success or failure."""
        r = ctx.step_record
        fid = flow_id_for(ctx.trace_id)
        set_flow_step(FlowStep(fid, None))
        meta = {
            "flow_id": fid,
            "step_index": r.step_index,
            "tool_name": r.tool_name,
            "flow_name": ctx.flow_name,
            "duration_ms": r.duration_ms,
        }
        if getattr(r, "skipped", False):
            meta["skipped"] = True
        self._event(
            ctx.trace_id,
            f"cw-{ctx.trace_id}-s{r.step_index}-end",
            "flow_step_completed",
            r.ended_at,
            r.tool_name,
            meta,
            outcome="success" if r.success else "failure",
            error=None if r.success else f"{r.error_type}: {r.error_message}",
        )

    def on_flow_end(self, ctx: Any) -> None:
        """flow_completed or flow_failed; ExecutionFeedback for a routed flow."""
        res = ctx.result
        tid = ctx.trace_id
        with self._lock:
            run = self._runs.pop(tid, None) or {}
        meta = {
            "flow_id": flow_id_for(tid),
            "flow_name": ctx.flow_name,
            "steps_run": len(res.execution_log),
            "duration_ms": res.total_duration_ms,
        }
        failed = [s for s in res.execution_log if not s.success]
        self._event(
            tid,
            f"cw-{tid}-end",
            "flow_completed" if res.success else "flow_failed",
            res.ended_at,
            ctx.flow_name,
            meta,
            outcome="success" if res.success else "failure",
            error=None if res.success or not failed else f"step {failed[0].step_index}: {failed[0].error_message}",
        )
        decision = run.get("decision")
        if decision is not None:
            self._publisher.publish(
                "execution_feedback",
                functools.partial(
                    _feedback, decision, tid, bool(res.success), res.total_duration_ms, iso_timestamp(res.ended_at),
                    failed[0].error_type if failed else None, failed[0].error_message if failed else None,
                ),
                request_id=tid,
            )
        for key, reset in (("step_token", reset_flow_step), ("rid_token", reset_request_id)):
            tok = run.get(key)
            if tok is not None:
                try:
                    reset(tok)
                except ValueError:  # ended in another context (async): leave it
                    pass

    def _event(self, tid: str, event_id: str, event_type: str, ts: Any, capability: str,
               meta: dict[str, Any], outcome: str | None = None, error: str | None = None) -> None:
        # The payload is built on the publisher's thread: only references are taken here.
        self._publisher.publish(
            "trace_event",
            functools.partial(_flow_event, event_id, event_type, ts, capability, meta, outcome, error,
                              self._principal),
            request_id=tid,
        )


def _flow_event(event_id: str, event_type: str, ts: Any, capability: str, meta: dict[str, Any],
                outcome: str | None, error: str | None, principal: str | None) -> dict[str, Any]:
    if isinstance(ts, datetime.datetime):
        ts = iso_timestamp(ts)
    payload: dict[str, Any] = {
        "event_id": event_id,
        "event_type": event_type,
        "timestamp": ts,
        "capability_id": capability,
        "metadata": meta,
    }
    if principal:
        payload["principal"] = principal
    if outcome:
        payload["outcome"] = outcome
    if error:
        payload["error_message"] = error
    return payload


def _decision(decision: Any) -> dict[str, Any]:
    return contract_to_dict(decision)


def _feedback(decision: Any, tid: str, success: bool, duration_ms: float, ended: str,
              error_type: str | None, error_message: str | None) -> dict[str, Any]:
    d: dict[str, Any] = {
        "decision_id": decision.decision_id,
        "candidate_id": decision.candidate.candidate_id,
        "success": success,
        "timestamp": ended,
        "latency_ms": max(0, int(round(duration_ms))),
        "trace_ref": trace_ref_for(tid),
        "metadata": {"chainweaver_trace_id": tid},
    }
    if error_type:
        d["error_type"] = error_type
    if error_message:
        d["error_message"] = error_message[:500]
    return d


class KernelBridge:
    """ChainWeaver's `KernelProtocol` backed by a real weaver-kernel `Kernel`.

    ChainWeaver's `KernelBackedExecutor` delegates `step_type="capability"` steps to a
    `KernelProtocol` (sync `invoke(capability_id, token, inputs) -> dict`); weaver-kernel's
    `Kernel` grants (policy) and invokes (async). This bridge asks the kernel for a grant
    for `principal`, invokes with the step's inputs, and returns the Frame's LLM-safe
    facts and its handle id. A policy denial raises, which ChainWeaver records as a
    failed step.
    """

    def __init__(self, kernel: Any, principal: Any, *, justification: str = "chainweaver flow step") -> None:
        self._kernel = kernel
        self._principal = principal
        self._justification = justification

    def invoke(self, capability_id: str, token: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        from weaver_kernel.models import CapabilityRequest

        req = CapabilityRequest(capability_id=capability_id, goal=capability_id)
        grant = self._kernel.grant_capability(req, self._principal, justification=self._justification)
        frame = _run(self._kernel.invoke(grant.token, principal=self._principal, args=dict(inputs)))
        return {
            "facts": list(frame.facts),
            "handle_id": frame.handle.handle_id if frame.handle is not None else None,
            "frame_id": frame.action_id,
        }


def _run(coro: Any) -> Any:
    """Run a coroutine from sync code, also when an event loop is already running here."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    ctx = contextvars.copy_context()
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out["v"] = ctx.run(asyncio.run, coro)
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            out["e"] = exc

    t = threading.Thread(target=target)
    t.start()
    t.join()
    if "e" in out:
        raise out["e"]
    return out["v"]

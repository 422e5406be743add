"""weaver-kernel adapter: a `TraceStoreProtocol` that also publishes a complete audit trail.

Why: weaver-kernel 0.12 records one `ActionTrace` per invoke / expand / deny, but it never
emits a PolicyDecision and never sets `decision_id` on its TraceEvent, so its output does
not satisfy I-02 and does not chain. `WeftTraceStore` wraps any inner store (default: the
kernel's own `TraceStore`, so `Kernel.explain` keeps working) and, per recorded trace,
publishes:

- a **PolicyDecision** (`allow` for invoke/expand, `deny` for deny) whose `decision_id` is
  derived from the action (`kd-<action_id>`), so retries publish the same id;
- the **TraceEvent** from the kernel's own `conformance.trace_to_contract`, with that
  `decision_id` set (and `frame_id` cleared for failed runs, which have no Frame);
- the **Frame** (`conformance.frame_to_contract` when the real Frame is available, see
  `attach`) and its **Handle**;
- and, through `attach`, the **CapabilityToken** of every grant (`token_to_contract`),
  which the PolicyDecision's `token_id` points at.

So weft's narrative chains decision -> trace event -> frame -> handle, and token. The
request id comes from `weft_publish.request(...)` (a context variable) or the explicit
`request_id` argument. All mapping work runs on the publisher's thread: `record` only
enqueues.
"""

from __future__ import annotations

import contextvars
import datetime
import functools
from typing import Any

from .context import current_flow_step, current_request_id
from .publisher import Publisher, iso_timestamp

# Set while an attached Kernel.invoke/expand runs: the wrapper publishes the real Frame,
# so `record` must not publish its trace-derived stand-in.
_capturing: contextvars.ContextVar[bool] = contextvars.ContextVar("weft_kernel_capture", default=False)


def decision_id_for(action_id: str) -> str:
    """The PolicyDecision id of a kernel action: stable, so a replay publishes the same id."""
    return f"kd-{action_id}"


class WeftTraceStore:
    """A weaver-kernel `TraceStoreProtocol` that records into `inner` and publishes to weft.

    Args:
        publisher: the `weft_publish.Publisher` to enqueue events on.
        inner: the store that keeps the traces (default `weaver_kernel.TraceStore()`).
        request_id: a fixed request id; otherwise the context's (`weft_publish.request`).
        kernel_id: recorded in metadata (which kernel decided).
    """

    def __init__(
        self,
        publisher: Publisher,
        inner: Any = None,
        *,
        request_id: str | None = None,
        kernel_id: str = "weaver-kernel",
    ) -> None:
        if inner is None:
            from weaver_kernel import TraceStore

            inner = TraceStore()
        self._inner = inner
        self._publisher = publisher
        self._request_id = request_id
        self._kernel_id = kernel_id

    # -- TraceStoreProtocol ------------------------------------------------------------
    def record(self, trace: Any) -> None:
        """Record in the inner store first (its failure is the kernel's, nothing is
        published), then enqueue the audit events for `trace`."""
        self._inner.record(trace)
        rid = self._request_id or current_request_id()
        step = current_flow_step()
        flow = {"flow_id": step.flow_id, "step_index": step.step_index} if step else None
        did = decision_id_for(trace.action_id)
        events = [("policy_decision", functools.partial(_policy_decision, trace, did, self._kernel_id, flow), rid)]
        if trace.event_type == "invoke":
            # I-02 wants the authorization on record before the execution; the kernel's
            # trace has one event per action, so the adapter adds it.
            events.append(("trace_event", functools.partial(_authorized_event, trace, did, flow), rid))
        events.append(("trace_event", functools.partial(_trace_event, trace, did, flow), rid))
        if trace.event_type != "deny" and trace.error is None and not _capturing.get():
            events.append(("frame", functools.partial(_frame_from_trace, trace), rid))
            if trace.handle_id and trace.event_type == "invoke":
                events.append(("handle", functools.partial(_handle_from_trace, trace), rid))
        # All or nothing. A full queue raises Backpressure out of record(): the kernel
        # treats a failed audit write as a failed action (fail closed, I-02), except for
        # denials, whose audit write it makes best-effort.
        self._publisher.publish_many(events)

    def get(self, action_id: str) -> Any:
        """The inner store's trace."""
        return self._inner.get(action_id)

    def list_all(self) -> list[Any]:
        """The inner store's traces."""
        return self._inner.list_all()

    def query(self, query: Any) -> list[Any]:
        """The inner store's query."""
        return self._inner.query(query)

    def __getattr__(self, name: str) -> Any:
        # Anything else the inner store offers (evicted_count, ...) stays reachable.
        return getattr(self._inner, name)

    # -- richer capture ------------------------------------------------------------------
    def attach(self, kernel: Any) -> Any:
        """Wrap `kernel`'s grant_capability / invoke / expand (on the instance) so that the
        CapabilityToken of each grant and the real Frame and Handle of each invocation are
        published too, via the kernel's own `token_to_contract` / `frame_to_contract`.
        Returns the kernel."""
        store = self
        grant = kernel.grant_capability
        invoke = kernel.invoke
        expand = kernel.expand

        @functools.wraps(grant)
        def grant_capability(*args: Any, **kwargs: Any) -> Any:
            g = grant(*args, **kwargs)
            rid = store._request_id or current_request_id()
            store._publisher.publish("capability_token", functools.partial(_token, g.token), request_id=rid)
            return g

        @functools.wraps(invoke)
        async def invoke_(*args: Any, **kwargs: Any) -> Any:
            t = _capturing.set(True)
            try:
                out = await invoke(*args, **kwargs)
            finally:
                _capturing.reset(t)
            store._publish_frame(out)
            return out

        @functools.wraps(expand)
        def expand_(*args: Any, **kwargs: Any) -> Any:
            t = _capturing.set(True)
            try:
                out = expand(*args, **kwargs)
            finally:
                _capturing.reset(t)
            store._publish_frame(out, with_handle=False)
            return out

        kernel.grant_capability = grant_capability
        kernel.invoke = invoke_
        kernel.expand = expand_
        return kernel

    def _publish_frame(self, frame: Any, with_handle: bool = True) -> None:
        from weaver_kernel.models import Frame

        if not isinstance(frame, Frame):  # a DryRunResult: nothing ran, nothing to show
            return
        rid = self._request_id or current_request_id()
        created = datetime.datetime.now(tz=datetime.timezone.utc)
        self._publisher.publish("frame", functools.partial(_frame, frame, created), request_id=rid)
        if with_handle and frame.handle is not None:
            self._publisher.publish("handle", functools.partial(_handle, frame.handle), request_id=rid)


# -- mappings (run on the publisher's thread) ------------------------------------------------
def _policy_decision(trace: Any, did: str, kernel_id: str, flow: dict | None) -> dict[str, Any]:
    deny = trace.event_type == "deny"
    d: dict[str, Any] = {
        "decision_id": did,
        "decision": "deny" if deny else "allow",
        "capability_id": trace.capability_id,
        "principal": trace.principal_id or "anonymous",
        "timestamp": iso_timestamp(trace.invoked_at),
        "metadata": {"kernel_id": kernel_id, "action_id": trace.action_id, "kernel_event": trace.event_type},
    }
    if trace.token_id:
        d["token_id"] = trace.token_id
    if deny:
        d["reason"] = trace.error or (trace.reason_code or "denied")
        d["metadata"]["reason_code"] = trace.reason_code
    elif trace.event_type == "expand":
        d["reason"] = "handle expansion by its owner"
    else:
        d["reason"] = "token verified"
    if flow:
        d["metadata"].update(flow)
    return d


def _trace_event(trace: Any, did: str, flow: dict | None) -> dict[str, Any]:
    from weaver_kernel.conformance import trace_to_contract

    from .publisher import contract_to_dict

    ev = trace_to_contract(trace)
    ev.decision_id = did
    if trace.error is not None:
        ev.frame_id = None  # a failed run produced no Frame
    out = contract_to_dict(ev)
    out["metadata"] = {k: v for k, v in (out.get("metadata") or {}).items() if v is not None}
    out["metadata"]["kernel_event"] = trace.event_type
    if trace.token_id:
        out["metadata"]["token_id"] = trace.token_id
    if flow:
        out["metadata"].update(flow)
    return out


def authorized_event_id(action_id: str) -> str:
    """The id of the `capability_authorized` TraceEvent the adapter adds for an invoke."""
    return f"{action_id}:authorized"


def _authorized_event(trace: Any, did: str, flow: dict | None) -> dict[str, Any]:
    out = _trace_event(trace, did, flow)
    for key in ("frame_id", "handle_id", "duration_ms", "error"):
        out.pop(key, None)
    out["event_id"] = authorized_event_id(trace.action_id)
    out["event_type"] = "capability_authorized"
    out["outcome"] = "success"
    # The kernel verifies the token just before it executes, and its trace holds one time
    # (`invoked_at`, also the execution event's); the authorization is stamped 1 µs earlier so
    # that every reader orders it first. Same type as the execution event's timestamp.
    at = trace.invoked_at - datetime.timedelta(microseconds=1)
    out["timestamp"] = at if isinstance(out.get("timestamp"), datetime.datetime) else iso_timestamp(at)
    out["metadata"]["kernel_event"] = "authorize"
    return out


def _token(token: Any) -> dict[str, Any]:
    from weaver_kernel.conformance import token_to_contract

    from .publisher import contract_to_dict

    return contract_to_dict(token_to_contract(token))


def _frame(frame: Any, created: datetime.datetime) -> dict[str, Any]:
    from weaver_kernel.conformance import frame_to_contract

    from .publisher import contract_to_dict

    return contract_to_dict(frame_to_contract(frame, created_at=created))


def _handle_contract(
    handle_id: str, capability_id: str, created: Any, metadata: dict[str, Any], expires: Any = None
) -> dict[str, Any]:
    """A weaver-spec Handle of a JSON artifact (`expires_at` only when known)."""
    d: dict[str, Any] = {
        "handle_id": handle_id,
        "capability_id": capability_id,
        "artifact_type": "application/json",
        "created_at": iso_timestamp(created),
    }
    if expires is not None:
        d["expires_at"] = iso_timestamp(expires)
    d["metadata"] = metadata
    return d


def _handle(handle: Any) -> dict[str, Any]:
    return _handle_contract(
        handle.handle_id,
        handle.capability_id,
        handle.created_at,
        {"total_rows": handle.total_rows, "principal_id": handle.principal_id},
        expires=handle.expires_at,
    )


def _frame_from_trace(trace: Any) -> dict[str, Any]:
    """The Frame as far as the ActionTrace knows it (no `attach`): its id, its handle and
    the redaction-safe counts the kernel kept in `result_summary`."""
    s = trace.result_summary or {}
    summary = (
        f"{trace.event_type} {trace.capability_id}: {s.get('fact_count', 0)} facts, "
        f"{s.get('row_count', 0)} rows"
    )
    d: dict[str, Any] = {
        "frame_id": trace.action_id,
        "capability_id": trace.capability_id,
        "summary": summary,
        "created_at": iso_timestamp(trace.invoked_at),
        "handle_refs": [trace.handle_id] if trace.handle_id else [],
        "metadata": {"response_mode": trace.response_mode, "source": "action_trace"},
    }
    return d


def _handle_from_trace(trace: Any) -> dict[str, Any]:
    return _handle_contract(
        trace.handle_id, trace.capability_id, trace.invoked_at, {"source": "action_trace"}
    )


def instrument(kernel: Any, publisher: Publisher, **kwargs: Any) -> WeftTraceStore:
    """Make an existing Kernel publish: wrap its current trace store in a `WeftTraceStore`
    and `attach` it. (The kernel exposes no setter; this replaces its `_trace_store`.)"""
    store = WeftTraceStore(publisher, kernel._trace_store, **kwargs)
    kernel._trace_store = store
    store.attach(kernel)
    return store

"""The request (and flow step) an event belongs to, carried in context variables.

Why: weft groups events into one narrative per agent request by `request_id`. The kernel's
trace store is called deep inside `Kernel.invoke`, far from the code that knows which
request is running, so the request id travels in a `contextvars.ContextVar`: set it once
around a request (`with request("r-42"): ...`), and every adapter below picks it up —
also across `await` and `asyncio.run`, which copy the context.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass

_request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("weft_request_id", default=None)
_flow_step: contextvars.ContextVar["FlowStep | None"] = contextvars.ContextVar("weft_flow_step", default=None)


@dataclass(frozen=True)
class FlowStep:
    """The ChainWeaver flow step currently running: kernel events made inside it carry
    `metadata.flow_id` and `metadata.step_index`, which chain them to the flow."""

    flow_id: str
    step_index: int | None


def current_request_id() -> str | None:
    """The request id of the running request, if one was set."""
    return _request_id.get()


def current_flow_step() -> FlowStep | None:
    """The flow step running now, if any."""
    return _flow_step.get()


@contextlib.contextmanager
def request(request_id: str) -> Iterator[str]:
    """Run the block as request `request_id`: events published inside it join its narrative."""
    token = _request_id.set(request_id)
    try:
        yield request_id
    finally:
        _request_id.reset(token)


def set_request_id(request_id: str | None) -> contextvars.Token:
    """Set the request id without a `with` block; undo with `reset_request_id(token)`."""
    return _request_id.set(request_id)


def reset_request_id(token: contextvars.Token) -> None:
    """Undo `set_request_id`."""
    _request_id.reset(token)


def set_flow_step(step: FlowStep | None) -> contextvars.Token:
    """Mark the running flow step (used by the ChainWeaver middleware)."""
    return _flow_step.set(step)


def reset_flow_step(token: contextvars.Token) -> None:
    """Undo `set_flow_step`."""
    _flow_step.reset(token)

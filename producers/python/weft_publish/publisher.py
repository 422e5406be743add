"""The Publisher: envelopes in on the caller's thread, batches out to weft's gateway.

Why this shape: the Weaver siblings call into their trace stores and middlewares on the
hot path of an agent. `Publisher.publish` only appends to a bounded in-memory queue (no
serialization, no I/O); one background thread serializes, batches and POSTs to
`POST /v1/events`, retries with exponential backoff, and while the gateway is unreachable
spills to a bounded on-disk buffer (`DiskBuffer`) that is replayed in order when it comes
back. When both bounds are reached `publish` raises `Backpressure`: events are refused
loudly, never dropped silently. Items the gateway rejects (an invalid payload, another
tenant, an event Kafka refuses for good) are logged, counted and kept in
`Publisher.rejections`; only transient failures (network, 5xx, 429, a full gateway spool,
a body the gateway could not read) are retried.
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import datetime
import enum
import http.client
import json
import logging
import os
import random
import socket
import threading
import time
import urllib.parse
import weakref
from collections.abc import Callable
from typing import Any

from .buffer import BufferFull, DiskBuffer, Position

log = logging.getLogger("weft_publish")

#: Per-item error codes from the gateway that mean "try again later" (the event is fine):
#: the gateway's own retriable codes (`PublishError::RETRIABLE_CODES`). Any other code is a
#: rejection for good, among them `kafka_refused`, which the gateway gives only for errors
#: resending cannot fix (e.g. an event larger than the topic's max.message.bytes).
TRANSIENT_CODES = frozenset({"spool_full", "spool_failed", "closed"})

#: The eight kinds weft accepts.
KINDS = frozenset(
    {
        "trace_event",
        "policy_decision",
        "execution_feedback",
        "execution_routing_decision",
        "routing_decision",
        "frame",
        "handle",
        "capability_token",
    }
)


class PublishError(Exception):
    """The event was not accepted for publishing (closed publisher, unknown kind)."""


class SenderFailed(PublishError):
    """The sender thread stopped on an unexpected error: nothing is delivered any more.
    `publish`, `flush` and `close` raise it from then on; the events it held in memory are
    lost (those already in the on-disk buffer are sent by the next Publisher on it)."""


class Backpressure(PublishError):
    """The in-memory queue is full (and the on-disk buffer too, or the gateway is slow):
    the caller must slow down. The event was NOT enqueued."""


@dataclasses.dataclass(frozen=True)
class Rejection:
    """An event the gateway (or the local encoder) refused for good, with its reason."""

    kind: str
    request_id: str | None
    code: str
    message: str
    envelope: str


class _Transient(Exception):
    """A batch could not be delivered now; retry later."""


def _error_code(body: bytes) -> str | None:
    """The `code` of a whole-request refusal, `{"error": {"code", "message"}}`."""
    try:
        err = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return None
    return err.get("code") if isinstance(err, dict) else None


def _json_default(o: Any) -> Any:
    if isinstance(o, datetime.datetime):
        if o.tzinfo is None:
            o = o.replace(tzinfo=datetime.timezone.utc)
        return o.isoformat()
    if isinstance(o, datetime.date):
        return o.isoformat()
    if isinstance(o, enum.Enum):
        return o.value
    if dataclasses.is_dataclass(o) and not isinstance(o, type):
        return contract_to_dict(o)
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    raise TypeError(f"{type(o).__name__} is not JSON serializable")


def iso_timestamp(ts: datetime.datetime) -> str:
    """RFC 3339 text of a timestamp; a naive one is taken as UTC (the spec's times carry
    an offset)."""
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=datetime.timezone.utc)
    return ts.isoformat()


def contract_to_dict(obj: Any) -> dict[str, Any]:
    """A weaver-contracts dataclass as its JSON object: top-level `None` fields omitted
    (several spec fields, e.g. CapabilityToken.issuer, are optional but not nullable),
    nested dataclasses converted the same way, datetimes as RFC 3339."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if v is None:
            continue
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            v = contract_to_dict(v)
        elif isinstance(v, list):
            v = [contract_to_dict(x) if dataclasses.is_dataclass(x) else x for x in v]
        out[f.name] = v
    return out


def default_buffer_dir() -> str:
    """`$WEFT_PUBLISH_BUFFER_DIR`, else `~/.cache/weft-publish/buffer`."""
    return os.environ.get("WEFT_PUBLISH_BUFFER_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "weft-publish", "buffer"
    )


_LIVE: "weakref.WeakSet[Publisher]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for p in list(_LIVE):
        try:
            p.close(timeout=5.0)
        except Exception:  # pragma: no cover - best effort at exit
            log.exception("weft_publish: close at exit failed")


class Publisher:
    """Publishes envelopes `{kind, request_id, tenant, payload}` to a weft gateway.

    Args:
        url: the gateway's base URL, e.g. `http://127.0.0.1:8787`.
        api_key: a bearer key the gateway maps to a tenant.
        buffer_dir: folder of the on-disk buffer (one Publisher per folder).
        tenant: optional tenant written on every envelope (must be the key's tenant).
        max_queue: bound of the in-memory queue, in events.
        max_buffer_bytes: bound of the on-disk buffer.
        batch_size / max_batch_bytes: largest batch per POST.
        linger: seconds to wait for a batch to fill before sending it.
        timeout: HTTP timeout in seconds. The gateway answers only once every event is
            durable; with Kafka unreachable that takes its delivery timeout
            (`message_timeout_ms`, 10 s by default) before it spools them, and up to about
            twice that for a request under way when Kafka went. Keep `timeout` well above
            that (the default, 30 s, is): a client that gives up first sends the batch
            again (weft stores the copies once, but the gateway does the work twice).
        backoff_initial / backoff_max: retry delays (doubling, with jitter).
        on_rejected: called (on the sender thread) with each `Rejection`.
    """

    #: Seconds close() waits, after its `timeout`, for the sender to save what is left.
    close_grace = 5.0

    def __init__(
        self,
        url: str,
        api_key: str,
        *,
        buffer_dir: str | None = None,
        tenant: str | None = None,
        max_queue: int = 10_000,
        max_buffer_bytes: int = 256 << 20,
        batch_size: int = 500,
        max_batch_bytes: int = 1 << 20,
        linger: float = 0.05,
        timeout: float = 30.0,
        backoff_initial: float = 0.1,
        backoff_max: float = 5.0,
        on_rejected: Callable[[Rejection], None] | None = None,
    ) -> None:
        parsed = urllib.parse.urlsplit(url.rstrip("/"))
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"gateway url must be http(s)://host[:port], got {url!r}")
        self._parsed = parsed
        self._path = (parsed.path or "") + "/v1/events"
        self._auth = f"Bearer {api_key}"
        self._tenant = tenant
        self._max_queue = max_queue
        self._batch_size = batch_size
        self._max_batch_bytes = max_batch_bytes
        self._linger = linger
        self._timeout = timeout
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._on_rejected = on_rejected
        self._disk = DiskBuffer(buffer_dir or default_buffer_dir(), max_buffer_bytes)
        self._q: collections.deque[tuple[str, str | None, str | None, Any]] = collections.deque()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._cv = threading.Condition()
        self._busy = True
        self._closed = False  # read and set under self._cv (see publish and close)
        self._close_deadline = 0.0  # monotonic; set by close()
        self._held: list[bytes] = []  # taken from memory, not yet durable nor delivered
        self._conn: http.client.HTTPConnection | None = None
        self._disk_error: str | None = None  # the last spill's OSError, if it failed so
        self._disk_retry_at = 0.0  # after a disk error, no spill before this (monotonic)
        self._stats = collections.Counter()
        self.rejections: collections.deque[Rejection] = collections.deque(maxlen=1000)
        self.last_error: str | None = None
        self._failure: str | None = None  # set when the sender thread died
        self._thread = threading.Thread(target=self._run, name="weft-publish", daemon=True)
        self._thread.start()
        _LIVE.add(self)

    # -- caller side -----------------------------------------------------------------
    def publish(
        self,
        kind: str,
        payload: Any,
        *,
        request_id: str | None = None,
        tenant: str | None = None,
    ) -> None:
        """Enqueue one event. No I/O and no serialization here.

        `payload` is a dict, a weaver-contracts dataclass, or a zero-argument callable
        returning one of those (evaluated on the sender thread, so mapping work is off the
        caller's thread). The publisher owns it from now on: do not mutate it afterwards.
        Raises `Backpressure` when the queue is full, `SenderFailed` once the sender thread
        has died, `PublishError` when closed.
        """
        if self._failure is not None:
            raise SenderFailed(self._failure)
        # Under the lock close() takes to set `_closed`: an event appended once the sender
        # has drained the queue for the last time would be lost.
        with self._cv:
            if self._closed:
                raise PublishError("publisher is closed")
            if len(self._q) >= self._max_queue:
                raise self._pushback()
            self._q.append((kind, request_id, tenant, payload))
        self._wake.set()

    def publish_many(self, events: list[tuple[str, Any, str | None]]) -> None:
        """Enqueue `(kind, payload, request_id)` events all together or not at all, so a
        group that must stay whole (a PolicyDecision and its TraceEvent: I-02) is never
        half-published. Raises `Backpressure` (enqueuing nothing) when they do not fit."""
        if self._failure is not None:
            raise SenderFailed(self._failure)
        with self._cv:
            if self._closed:
                raise PublishError("publisher is closed")
            if len(self._q) + len(events) > self._max_queue:
                raise self._pushback()
            self._q.extend((kind, rid, None, payload) for kind, payload, rid in events)
        self._wake.set()

    def _pushback(self) -> Backpressure:
        self._stats["backpressure"] += 1
        disk = f"; on-disk buffer failing: {self._disk_error}" if self._disk_error else ""
        return Backpressure(
            f"weft publisher queue is full ({self._max_queue} events); "
            f"gateway unreachable and buffer full? last error: {self.last_error}{disk}"
        )

    @property
    def stats(self) -> dict[str, int]:
        """Counters: enqueued (taken by the sender), accepted, rejected, retries,
        spilled (events written to the on-disk buffer), replayed, backpressure."""
        s = dict(self._stats)
        s["queued"] = len(self._q)
        s["buffered_bytes"] = self._disk.size_bytes
        return s

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every event published so far is delivered or rejected (the queue
        and the on-disk buffer are empty). True if that happened within `timeout`.
        Raises `SenderFailed` once the sender thread has died."""
        deadline = time.monotonic() + timeout
        self._wake.set()
        with self._cv:
            while True:
                if self._failure is not None:
                    raise SenderFailed(self._failure)
                if not self._q and not self._busy:
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(min(left, 0.1))

    def close(self, timeout: float = 10.0) -> None:
        """Stop accepting events, try to deliver for up to `timeout`, then move whatever is
        left to the on-disk buffer (replayed by the next Publisher on the same folder).
        A request still unanswered at `timeout` (a gateway holding it while Kafka is down,
        or a stalled one) is cut off, and its events go to the buffer too.
        Raises `SenderFailed` if the sender thread has died (then nothing was saved), and
        `PublishError`, naming how many events were not saved, if the sender has not
        saved them `close_grace` (5) s after `timeout` (e.g. it is still connecting, or
        the disk hangs); it saves them should it get unstuck before the process exits."""
        with self._cv:
            first, self._closed = not self._closed, True
            if first:
                self._close_deadline = time.monotonic() + timeout
        if first:
            self._stop.set()
            self._wake.set()
            self._thread.join(timeout)
            # Past the deadline the sender stops delivering, unless it is waiting for an
            # answer: cut that connection, so the request fails like any outage and its
            # batch is spilled with the rest.
            give_up = time.monotonic() + self.close_grace
            while self._thread.is_alive() and time.monotonic() < give_up:
                self._abort_request()
                self._thread.join(0.05)
            _LIVE.discard(self)
            if self._thread.is_alive() and self._failure is None:
                unsaved = len(self._q) + len(self._held)
                raise PublishError(
                    f"weft publisher closed with at least {unsaved} events not saved: its "
                    f"sender did not stop within {timeout} + {self.close_grace} s (last "
                    f"error: {self.last_error}); they are lost if the process exits before "
                    f"it writes them to {self._disk.directory}"
                )
        if self._failure is not None:
            raise SenderFailed(self._failure)

    def _abort_request(self) -> None:
        """close()'s thread: make the request the sender is waiting on fail now."""
        conn = self._conn
        sock = getattr(conn, "sock", None)
        if sock is None:
            return
        try:
            # socket.socket's own shutdown, also for TLS: SSLSocket.shutdown would drop its
            # SSL object under the sender's feet.
            socket.socket.shutdown(sock, socket.SHUT_RDWR)
        except OSError:
            pass  # closed meanwhile: the sender is done with it

    def _close_deadline_passed(self) -> bool:
        return self._stop.is_set() and time.monotonic() >= self._close_deadline

    # -- sender thread -------------------------------------------------------------------
    def _encode(self, item: tuple[str, str | None, str | None, Any]) -> bytes | None:
        kind, request_id, tenant, payload = item
        try:
            if callable(payload):
                payload = payload()
            if dataclasses.is_dataclass(payload) and not isinstance(payload, type):
                payload = contract_to_dict(payload)
            env: dict[str, Any] = {"kind": kind}
            if request_id is not None:
                env["request_id"] = request_id
            t = tenant or self._tenant
            if t is not None:
                env["tenant"] = t
            env["payload"] = payload
            return json.dumps(
                env, default=_json_default, allow_nan=False, separators=(",", ":")
            ).encode()
        except Exception as exc:  # a bad payload is that event's problem only
            self._reject(kind, request_id, "unserializable", f"{type(exc).__name__}: {exc}", repr(payload)[:500])
            return None

    def _reject(self, kind: str, request_id: str | None, code: str, message: str, envelope: str) -> None:
        r = Rejection(kind, request_id, code, message, envelope)
        self._stats["rejected"] += 1
        self.rejections.append(r)
        log.error("weft_publish: event rejected (%s, kind=%s, request=%s): %s", code, kind, request_id, message)
        if self._on_rejected is not None:
            try:
                self._on_rejected(r)
            except Exception:
                log.exception("weft_publish: on_rejected callback failed")

    def _take(self, wait: bool) -> list[bytes]:
        """Up to one batch of encoded events from the queue (waiting `linger` to fill)."""
        out: list[bytes] = []
        size = 0
        deadline = time.monotonic() + (self._linger if wait else 0.0)
        while len(out) < self._batch_size and size < self._max_batch_bytes:
            try:
                item = self._q.popleft()
            except IndexError:
                left = deadline - time.monotonic()
                if left <= 0 or self._stop.is_set():
                    break
                self._wake.clear()
                if self._q:
                    continue
                self._wake.wait(left)
                continue
            self._stats["enqueued"] += 1
            line = self._encode(item)
            if line is not None:
                out.append(line)
                size += len(line)
        return out

    def _spill(self, lines: list[bytes]) -> bool:
        """Append to the disk buffer; False (nothing written) when it is full or failing.

        A disk error (ENOSPC, EIO, EACCES) is handled like a full buffer: the events stay
        in memory, so the queue fills and `publish` pushes back. After one, the disk is
        not tried again for `backoff_max` seconds (each try may create a segment file)."""
        if time.monotonic() < self._disk_retry_at:
            return False
        try:
            self._disk.append(lines)
        except BufferFull as exc:
            self.last_error = str(exc)
            self._disk_error = None
            return False
        except OSError as exc:
            self._disk_error = f"{self._disk.directory}: {exc}"
            self._disk_retry_at = time.monotonic() + self._backoff_max
            log.error(
                "weft_publish: cannot write the on-disk buffer %s; events stay in memory "
                "(publish() pushes back when the queue is full)", self._disk_error
            )
            return False
        self._disk_error = None
        self._stats["spilled"] += len(lines)
        return True

    def _set_busy(self, busy: bool) -> None:
        with self._cv:
            self._busy = busy
            self._cv.notify_all()

    def _run(self) -> None:
        try:
            self._send()
        except BaseException as exc:
            # A bug, not an outage (those are retried in _send): say so wherever the
            # caller looks next, rather than accept events nobody will send.
            self._failure = (
                f"weft publisher's sender thread failed ({type(exc).__name__}: {exc}); "
                f"nothing is delivered any more and the events it held are lost"
            )
            log.exception("weft_publish: %s", self._failure)
        finally:
            self._set_busy(False)

    def _send(self) -> None:
        inflight: tuple[list[bytes], Position] | None = None  # from disk, not yet committed
        attempt = 0
        next_try = 0.0
        while True:
            stopping = self._stop.is_set()
            if self._close_deadline_passed():
                break
            self._set_busy(True)
            # OSError: the on-disk buffer could not be read, cleaned or its cursor written;
            # retried like an unreachable gateway (events taken from memory stay in `_held`).
            try:
                degraded = (
                    bool(self._held)
                    or inflight is not None
                    or time.monotonic() < next_try  # backing off: the disk is not touched
                    or not self._disk.is_empty()
                )
                if not degraded:
                    lines = self._take(wait=not stopping)
                    if not lines:
                        if stopping:
                            break
                        self._set_busy(False)
                        self._wake.wait(0.5)
                        self._wake.clear()
                        continue
                    self._held = lines
                else:
                    # Keep callers flowing while the gateway is away: move memory to disk.
                    if self._held and self._spill(self._held):
                        self._held = []
                    while not self._held and self._q:
                        more = self._take(wait=False)
                        if more and not self._spill(more):
                            self._held = more
                            break
                now = time.monotonic()
                if now < next_try:
                    time.sleep(min(next_try - now, 0.05))
                    continue
                if self._held:
                    self._held = self._deliver(self._held)
                    if self._held:
                        raise _Transient("some items were refused for now")
                else:
                    if inflight is None:
                        lines, pos = self._disk.read(self._batch_size, self._max_batch_bytes)
                        inflight = (lines, pos) if lines else None
                        if inflight:
                            self._stats["replayed"] += len(lines)
                    if inflight is not None:
                        rest = self._deliver(inflight[0])
                        if rest:
                            inflight = (rest, inflight[1])
                            raise _Transient("some items were refused for now")
                        # Delivered: should the cursor not be written, the buffer's own
                        # position has moved on all the same (a restart sends them again).
                        pos, inflight = inflight[1], None
                        self._disk.commit(pos)
                if attempt:
                    log.warning("weft_publish: gateway reachable again after %d failed attempts", attempt)
                attempt = 0
                next_try = 0.0
            except (_Transient, OSError) as exc:
                attempt += 1
                self._stats["retries"] += 1
                self.last_error = str(exc) if isinstance(exc, _Transient) else f"on-disk buffer: {exc}"
                if attempt == 1 or attempt % 20 == 0:
                    log.warning("weft_publish: delivery failed (attempt %d), buffering: %s", attempt, self.last_error)
                delay = min(self._backoff_max, self._backoff_initial * (2 ** min(attempt - 1, 16)))
                next_try = time.monotonic() + delay * (0.5 + random.random() / 2)
                if self._held and self._spill(self._held):
                    self._held = []
        # Closing: nothing in memory may be lost; what could not be delivered goes to disk.
        self._disk_retry_at = 0.0
        self._held = self._held + [line for line in (self._encode(i) for i in self._drain_queue()) if line]
        if self._held and not self._spill(self._held):
            code, why = ("buffer_failed_at_close", self._disk_error) if self._disk_error else ("buffer_full_at_close", self.last_error)
            for line in self._held:
                self._reject("unknown", None, code, why or "buffer full", line.decode(errors="replace")[:500])
        self._held = []
        self._disk.close()
        if self._conn is not None:
            self._conn.close()

    def _drain_queue(self) -> list[tuple[str, str | None, str | None, Any]]:
        out = []
        while True:
            try:
                out.append(self._q.popleft())
            except IndexError:
                return out

    # -- HTTP ------------------------------------------------------------------------------
    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            cls = http.client.HTTPSConnection if self._parsed.scheme == "https" else http.client.HTTPConnection
            self._conn = cls(self._parsed.hostname, self._parsed.port, timeout=self._timeout)
        return self._conn

    def _post(self, body: bytes) -> tuple[int, bytes]:
        # A kept-alive connection the server has since closed fails on first use: that one
        # failure is retried at once on a fresh connection before counting as an outage.
        for fresh in ((False, True) if self._conn is not None else (True,)):
            if self._close_deadline_passed():
                # close() has cut the request off (or is about to): no new one.
                raise _Transient("publisher closing: no time left to deliver")
            try:
                conn = self._connection()
                conn.request(
                    "POST",
                    self._path,
                    body=body,
                    headers={"Content-Type": "application/json", "Authorization": self._auth},
                )
                resp = conn.getresponse()
                return resp.status, resp.read()
            except (OSError, http.client.HTTPException) as exc:
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None
                if fresh:
                    raise _Transient(f"gateway unreachable: {type(exc).__name__}: {exc}") from exc
        raise AssertionError("unreachable")

    def _deliver(self, lines: list[bytes]) -> list[bytes]:
        """POST `lines`; returns the lines still to retry (empty when all were resolved).
        Raises `_Transient` when the whole batch must be retried."""
        status, body = self._post(b"[" + b",".join(lines) + b"]")
        if len(lines) > 1 and (status == 413 or (status == 422 and _error_code(body) == "too_many_items")):
            # Too big for the gateway (over its body size, or its --max-items): halves may
            # pass, and the events in them are fine.
            half = len(lines) // 2
            return self._deliver(lines[:half]) + self._deliver(lines[half:])
        if status in (401, 408, 429) or status >= 500 or (status == 400 and _error_code(body) == "body_unreadable"):
            # 401: a wrong or revoked key is a configuration error; keeping the events
            # buffered (and saying so loudly) beats dropping them. 400 body_unreadable: the
            # gateway could not read the body (a reset, a bad chunk), which says nothing
            # about the events in it.
            raise _Transient(f"gateway answered {status}: {body[:300]!r}")
        try:
            answer = json.loads(body)
        except ValueError as exc:
            raise _Transient(f"gateway answered {status} with a non-JSON body") from exc
        results = answer.get("results") if isinstance(answer, dict) else None
        if not isinstance(results, list) or len(results) != len(lines):
            # A request-level refusal (e.g. 413 for one oversize event, 400 malformed):
            # retrying cannot help, so each event is rejected with that reason.
            err = (answer.get("error") or {}) if isinstance(answer, dict) else {}
            for line in lines:
                self._reject_line(line, err.get("code", f"http_{status}"), err.get("message", str(body[:300])))
            return []
        retry: list[bytes] = []
        for line, r in zip(lines, results):
            if r.get("status") == "accepted":
                self._stats["accepted"] += 1
                continue
            err = r.get("error") or {}
            code = err.get("code", "unknown")
            if code in TRANSIENT_CODES:
                retry.append(line)
            else:
                self._reject_line(line, code, err.get("message", ""))
        return retry

    def _reject_line(self, line: bytes, code: str, message: str) -> None:
        try:
            env = json.loads(line)
            kind, rid = env.get("kind", "unknown"), env.get("request_id")
        except ValueError:
            kind, rid = "unknown", None
        self._reject(kind, rid, code, message, line.decode(errors="replace")[:2000])

"""Per-event cost of weft_publish on the caller's thread (target: < 50 µs).

    python producers/python/bench/bench_publish.py [--n 5000] [--repeat 5]

Runs a sink gateway in a separate process (so its work does not share this process's GIL
with the caller, as a real weft gateway would not), then times, on the calling thread:

1. `Publisher.publish` of a small dict;
2. the weaver-kernel adapter: `WeftTraceStore.record` of a real ActionTrace (an invoke with
   a handle: 4 events) minus the same record into the kernel's plain `TraceStore`, per event;
3. the ChainWeaver middleware: `on_step_start` + `on_step_end` with real ChainWeaver
   contexts (2 events), per event.

The publisher's background thread runs meanwhile (serializing and POSTing to the sink), so
the figures include its GIL contention. Best of `--repeat` runs, in microseconds.
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid

SINK = textwrap.dedent(
    """
    import http.server, json, sys
    class H(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        def log_message(self, *a): pass
        def do_POST(self):
            items = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            body = json.dumps({"accepted": len(items), "rejected": 0, "results": [
                {"index": i, "status": "accepted", "id": str(i)} for i in range(len(items))]}).encode()
            self.send_response(200); self.send_header("Content-Length", str(len(body)))
            self.send_header("Content-Type", "application/json"); self.end_headers(); self.wfile.write(body)
    s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    print(s.server_address[1], flush=True)
    s.serve_forever()
    """
)


def best(fn, n: int, repeat: int) -> float:
    """Best mean seconds per call of fn() over `repeat` runs of `n` calls."""
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        out.append((time.perf_counter() - t0) / n)
    return min(out)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()

    from weft_publish import Publisher

    sink = subprocess.Popen([sys.executable, "-c", SINK], stdout=subprocess.PIPE, text=True)
    spool = tempfile.TemporaryDirectory(prefix="weft-bench-")
    try:
        port = int(sink.stdout.readline())
        pub = Publisher(
            f"http://127.0.0.1:{port}", "bench",
            buffer_dir=os.path.join(spool.name, "buf"),
            max_queue=10_000_000,
        )
        results = {}

        payload = {"event_id": "e", "event_type": "capability_executed", "timestamp": "2026-01-01T00:00:00Z"}
        results["Publisher.publish (1 event)"] = best(
            lambda: pub.publish("trace_event", payload, request_id="r"), a.n, a.repeat
        )

        try:
            from weaver_kernel import TraceStore
            from weaver_kernel.models import ActionTrace

            from weft_publish.kernel import WeftTraceStore
        except ImportError:
            print("weaver-kernel not installed: kernel adapter skipped", file=sys.stderr)
        else:
            now = datetime.datetime.now(tz=datetime.timezone.utc)

            def trace() -> ActionTrace:
                return ActionTrace(
                    action_id=str(uuid.uuid4()), capability_id="codegen.generate", principal_id="agent",
                    token_id="tok", invoked_at=now, args={"notes": "x"}, response_mode="summary",
                    driver_id="d", handle_id="h-1",
                    result_summary={"fact_count": 2, "row_count": 0, "warning_count": 0, "has_handle": True},
                )

            traces = [trace() for _ in range(a.n * a.repeat)]
            it = iter(traces)
            plain = TraceStore(max_entries=10**9)
            base = best(lambda: plain.record(next(it)), a.n, a.repeat)
            it = iter(traces)
            store = WeftTraceStore(pub, TraceStore(max_entries=10**9))
            full = best(lambda: store.record(next(it)), a.n, a.repeat)
            results["WeftTraceStore.record, added per event (4 events/trace)"] = (full - base) / 4

        try:
            from chainweaver.executor import StepRecord
            from chainweaver.middleware import StepEndContext, StepStartContext

            from weft_publish.chainweaver import WeftFlowMiddleware
        except ImportError:
            print("chainweaver not installed: middleware skipped", file=sys.stderr)
        else:
            mw = WeftFlowMiddleware(pub)
            now = datetime.datetime.now(tz=datetime.timezone.utc)
            start = StepStartContext(trace_id="t", flow_name="f", step_index=0, tool_name="research",
                                     inputs={}, started_at=now)
            end = StepEndContext(trace_id="t", flow_name="f", step_record=StepRecord(
                step_index=0, tool_name="research", inputs={}, outputs={}, success=True,
                started_at=now, ended_at=now, duration_ms=1.0))

            def hooks() -> None:
                mw.on_step_start(start)
                mw.on_step_end(end)

            results["WeftFlowMiddleware step hooks, per event (2 events)"] = best(hooks, a.n, a.repeat) / 2

        flushed = pub.flush(120)
        stats = pub.stats
        pub.close()
    finally:
        sink.terminate()
        sink.wait()
        spool.cleanup()
    print(f"python {sys.version.split()[0]}, n={a.n}, best of {a.repeat}; delivered: {flushed}, "
          f"accepted {stats.get('accepted', 0)}, rejected {stats.get('rejected', 0)}")
    for k, v in results.items():
        print(f"{v * 1e6:8.2f} µs  {k}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

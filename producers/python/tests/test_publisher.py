"""Unit tests of weft_publish's transport: the on-disk buffer and the Publisher.

The gateway here is a stand-in (a local http.server speaking the same protocol as
`producers/src/gateway.rs`); the integration tests in `tests/python_siblings.rs` use the
real `weft gateway`. Stdlib only: `python -m unittest discover -s producers/python/tests`.
"""

from __future__ import annotations

import errno
import http.server
import inspect
import json
import os
import re
import shutil
import socket
import tempfile
import threading
import time
import unittest

from weft_publish import (
    Backpressure,
    BufferFull,
    BufferLocked,
    DiskBuffer,
    Publisher,
    PublishError,
    SenderFailed,
)


def wait_until(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


class FakeGateway:
    """POST /v1/events: records every item it accepts; `self.mode` decides the answer."""

    def __init__(self, port: int = 0):
        self.received: list[dict] = []  # accepted items, in arrival order
        self.posts = 0
        self.mode = "ok"  # ok | down503 | unreadable (400 body_unreadable) | max10 (422 too_many_items over 10 items)
        self.reject_payload_ids: set = set()  # payload["id"] values to reject (schema_invalid)
        self.transient_once: set = set()  # payload["id"] values to answer spool_full once
        self.kafka_refused_ids: set = set()  # payload["id"] values Kafka refuses for good
        self.lock = threading.Lock()
        gw = self

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):  # quiet
                pass

            def do_POST(self):
                n = int(self.headers.get("Content-Length", 0))
                body = self.rfile.read(n)
                assert self.headers["Authorization"] == "Bearer k-test"
                with gw.lock:
                    gw.posts += 1
                    if gw.mode == "down503":
                        return self._send(503, {"error": {"code": "unavailable", "message": "down"}})
                    if gw.mode == "unreadable":
                        return self._send(400, {"error": {"code": "body_unreadable",
                                                          "message": "could not read the request body"}})
                    items = json.loads(body)
                    if gw.mode == "max10" and len(items) > 10:
                        return self._send(422, {"error": {"code": "too_many_items",
                                                          "message": "more than 10 items in one request; split the batch"}})
                    results = []
                    for i, it in enumerate(items):
                        pid = it["payload"].get("id")
                        if pid in gw.reject_payload_ids:
                            results.append({"index": i, "status": "rejected",
                                            "error": {"code": "schema_invalid", "message": "bad"}})
                        elif pid in gw.kafka_refused_ids:
                            results.append({"index": i, "status": "rejected",
                                            "error": {"code": "kafka_refused", "message": "too large"}})
                        elif pid in gw.transient_once:
                            gw.transient_once.discard(pid)
                            results.append({"index": i, "status": "rejected",
                                            "error": {"code": "spool_full", "message": "full"}})
                        else:
                            gw.received.append(it)
                            results.append({"index": i, "status": "accepted", "id": str(pid)})
                acc = sum(r["status"] == "accepted" for r in results)
                status = 200 if acc == len(results) else (207 if acc else 400)
                self._send(status, {"accepted": acc, "rejected": len(results) - acc, "results": results})

            def _send(self, status, obj):
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), H)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()

    def ids(self):
        with self.lock:
            return [it["payload"]["id"] for it in self.received]


class StallingGateway:
    """Accepts connections and reads the requests, but answers none for 60 s (a gateway
    holding a POST while Kafka is down, or a stalled one)."""

    def __init__(self):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.requests = 0
        self.conns: list[socket.socket] = []
        self.release = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._hold, args=(conn,), daemon=True).start()

    def _hold(self, conn):
        try:
            if conn.recv(65536):
                self.requests += 1
        except OSError:
            pass
        self.release.wait(60)

    def stop(self):
        self.release.set()
        self.listener.close()
        for c in self.conns:
            c.close()


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class DiskBufferTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="weft-buf-")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)

    def test_reads_in_order_across_segments_and_reopen(self):
        b = DiskBuffer(self.dir, max_bytes=1 << 20, segment_bytes=64)
        for i in range(50):
            b.append([json.dumps({"i": i}).encode()])
        got = []
        lines, pos = b.read(7, 1 << 20)
        got += [json.loads(x)["i"] for x in lines]
        b.commit(pos)
        b.close()
        # A new process resumes after the committed position, still in order.
        b = DiskBuffer(self.dir, max_bytes=1 << 20, segment_bytes=64)
        while not b.is_empty():
            lines, pos = b.read(5, 1 << 20)
            got += [json.loads(x)["i"] for x in lines]
            b.commit(pos)
        self.assertEqual(got, list(range(50)))
        self.assertEqual(b.size_bytes, 0, "delivered segments are deleted")
        b.close()

    def test_uncommitted_lines_are_read_again_after_reopen(self):
        b = DiskBuffer(self.dir, max_bytes=1 << 20)
        b.append([b'{"i":0}', b'{"i":1}'])
        lines, _ = b.read(10, 1 << 20)
        self.assertEqual(len(lines), 2)
        b.close()  # crash before commit
        b = DiskBuffer(self.dir, max_bytes=1 << 20)
        lines, _ = b.read(10, 1 << 20)
        self.assertEqual(lines, [b'{"i":0}', b'{"i":1}'])
        b.close()

    def test_bound_refuses_whole_append(self):
        b = DiskBuffer(self.dir, max_bytes=100)
        b.append([b"x" * 40])
        with self.assertRaises(BufferFull):
            b.append([b"y" * 30, b"z" * 30])
        lines, _ = b.read(10, 1 << 20)
        self.assertEqual(lines, [b"x" * 40], "a refused append writes nothing")
        b.close()

    def test_failed_append_leaves_nothing_in_the_way_of_the_next(self):
        b = DiskBuffer(self.dir, max_bytes=1 << 20)
        b.append([b'{"i":0}'])
        real = b._write_file

        class HalfThenENOSPC:  # the disk fills up halfway through one write
            failed = False

            def write(self, data):
                if self.failed:
                    return real.write(data)
                self.failed = True
                real.write(data[: len(data) // 2 + 3])
                real.flush()
                raise OSError(errno.ENOSPC, "No space left on device")

            def __getattr__(self, name):
                return getattr(real, name)

        b._write_file = HalfThenENOSPC()
        with self.assertRaises(OSError):
            b.append([b'{"i":1}', b'{"i":2222222}'])
        b.append([b'{"i":1}', b'{"i":2222222}'])  # space again: the caller retries
        lines, pos = b.read(10, 1 << 20)
        self.assertEqual(lines, [b'{"i":0}'], "the torn segment ends where its last whole append did")
        b.commit(pos)
        lines, pos = b.read(10, 1 << 20)
        self.assertEqual(lines, [b'{"i":1}', b'{"i":2222222}'])
        b.close()
        # A later process sees the failed write's bytes: at worst a copy of an event, never garbage.
        b = DiskBuffer(self.dir, max_bytes=1 << 20)
        got = []
        while not b.is_empty():
            lines, pos = b.read(10, 1 << 20)
            got += [json.loads(x)["i"] for x in lines]
            b.commit(pos)
        self.assertEqual(list(dict.fromkeys(got)), [1, 2222222], "the uncommitted events, whole")
        b.close()

    def test_one_user_per_folder(self):
        b = DiskBuffer(self.dir, max_bytes=100)
        with self.assertRaises(BufferLocked):
            DiskBuffer(self.dir, max_bytes=100)
        b.close()
        DiskBuffer(self.dir, max_bytes=100).close()


class PublisherTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="weft-pub-")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        self.gw = None

    def tearDown(self):
        if self.gw:
            self.gw.stop()

    def publisher(self, url, **kw):
        kw.setdefault("backoff_initial", 0.02)
        kw.setdefault("backoff_max", 0.1)
        kw.setdefault("linger", 0.01)
        return Publisher(url, "k-test", buffer_dir=os.path.join(self.dir, "buf"), **kw)

    def test_delivers_everything_in_order_in_batches(self):
        self.gw = FakeGateway()
        p = self.publisher(self.gw.url, batch_size=50)
        for i in range(1000):
            p.publish("trace_event", {"id": i}, request_id="r1")
        self.assertTrue(p.flush(10))
        self.assertEqual(self.gw.ids(), list(range(1000)))
        self.assertEqual(self.gw.received[0]["request_id"], "r1")
        self.assertLessEqual(self.gw.posts, 1000 // 50 + 5, "batched, not one POST per event")
        self.assertEqual(p.stats["accepted"], 1000)
        p.close()

    def test_payload_mapping_runs_on_the_sender_thread(self):
        self.gw = FakeGateway()
        p = self.publisher(self.gw.url)
        seen = []

        def lazy():
            seen.append(threading.current_thread().name)
            return {"id": "lazy"}

        p.publish("frame", lazy)
        self.assertTrue(p.flush(10))
        self.assertEqual(seen, ["weft-publish"])
        self.assertEqual(self.gw.ids(), ["lazy"])
        p.close()

    def test_batches_over_the_gateways_max_items_are_split_not_rejected(self):
        # The gateway answers 422 too_many_items to a batch over its --max-items.
        self.gw = FakeGateway()
        self.gw.mode = "max10"
        p = self.publisher(self.gw.url, batch_size=50)
        for i in range(50):
            p.publish("trace_event", {"id": i})
        self.assertTrue(p.flush(10), p.stats)
        self.assertEqual(self.gw.ids(), list(range(50)), "all delivered, in order")
        self.assertEqual(p.stats.get("rejected", 0), 0, [r.code for r in p.rejections])
        p.close()

    def test_rejected_items_are_surfaced_once_and_not_retried(self):
        self.gw = FakeGateway()
        self.gw.reject_payload_ids = {3}
        seen = []
        p = self.publisher(self.gw.url, on_rejected=seen.append)
        for i in range(6):
            p.publish("trace_event", {"id": i})
        self.assertTrue(p.flush(10))
        self.assertEqual(self.gw.ids(), [0, 1, 2, 4, 5])
        self.assertEqual(p.stats["rejected"], 1)
        self.assertEqual([r.code for r in p.rejections], ["schema_invalid"])
        self.assertEqual(len(seen), 1)
        self.assertIn('"id":3', seen[0].envelope)
        p.close()

    def test_kafka_refused_items_are_rejected_not_retried(self):
        # The gateway answers kafka_refused only for errors that never go away (e.g. an
        # event larger than the topic's max.message.bytes); 400 when no item was accepted.
        self.gw = FakeGateway()
        self.gw.kafka_refused_ids = {"poison1", "poison2"}
        seen = []
        p = self.publisher(self.gw.url, on_rejected=seen.append)
        p.publish("trace_event", {"id": "poison1"})  # a batch of its own: 400
        self.assertTrue(p.flush(5), p.stats)
        for i in ["poison2", 0, 1, 2]:  # the good ones behind a poison one: 207
            p.publish("trace_event", {"id": i})
        self.assertTrue(p.flush(5), p.stats)
        self.assertEqual(self.gw.ids(), [0, 1, 2])
        self.assertEqual([r.code for r in p.rejections], ["kafka_refused", "kafka_refused"])
        self.assertEqual([r.envelope.count('"poison') for r in seen], [1, 1])
        self.assertEqual(p.stats.get("retries", 0), 0)
        p.close()

    def test_unserializable_payload_is_rejected_locally(self):
        self.gw = FakeGateway()
        p = self.publisher(self.gw.url)
        p.publish("trace_event", {"id": 1, "x": float("nan")})
        p.publish("trace_event", {"id": 2})
        self.assertTrue(p.flush(10))
        self.assertEqual(self.gw.ids(), [2])
        self.assertEqual(p.rejections[0].code, "unserializable")
        p.close()

    def test_transiently_refused_items_are_retried(self):
        self.gw = FakeGateway()
        self.gw.transient_once = {1}
        p = self.publisher(self.gw.url)
        for i in range(3):
            p.publish("trace_event", {"id": i})
        self.assertTrue(p.flush(10))
        self.assertEqual(sorted(self.gw.ids()), [0, 1, 2])
        self.assertEqual(p.stats.get("rejected", 0), 0)
        self.assertGreaterEqual(p.stats["retries"], 1)
        p.close()

    def test_outage_spills_to_disk_and_replays_in_order(self):
        port = free_port()
        p = self.publisher(f"http://127.0.0.1:{port}")  # nothing listens yet
        for i in range(300):
            p.publish("trace_event", {"id": i})
        self.assertTrue(wait_until(lambda: p.stats.get("spilled", 0) == 300), p.stats)
        self.assertFalse(p.flush(0.2), "not delivered while the gateway is down")
        self.gw = FakeGateway(port)
        for i in range(300, 400):
            p.publish("trace_event", {"id": i})
        self.assertTrue(p.flush(15), p.stats)
        self.assertEqual(self.gw.ids(), list(range(400)), "in order, nothing lost, no copies")
        self.assertEqual(p.stats["buffered_bytes"], 0)
        p.close()

    def _retried_after(self, mode):
        """The gateway refuses whole requests (`mode`), then accepts: every event arrives,
        once, in order, and none is rejected."""
        self.gw = FakeGateway()
        self.gw.mode = mode
        p = self.publisher(self.gw.url)
        for i in range(20):
            p.publish("trace_event", {"id": i})
        self.assertTrue(wait_until(lambda: self.gw.posts >= 2))
        self.gw.mode = "ok"
        self.assertTrue(p.flush(10))
        self.assertEqual(self.gw.ids(), list(range(20)))
        self.assertEqual(list(p.rejections), [])
        p.close()

    def test_gateway_503_is_retried(self):
        self._retried_after("down503")

    def test_an_unreadable_body_is_retried_not_rejected(self):
        # 400 body_unreadable: the gateway could not read the body (a reset, a bad chunk),
        # which says nothing about the events in it.
        self._retried_after("unreadable")

    def test_bounds_give_backpressure_not_silent_loss(self):
        port = free_port()
        p = self.publisher(f"http://127.0.0.1:{port}", max_queue=50, max_buffer_bytes=2000)
        accepted = 0
        refused = 0
        for i in range(2000):
            try:
                p.publish("trace_event", {"id": i, "pad": "x" * 20})
                accepted += 1
            except Backpressure:
                refused += 1
                time.sleep(0.001)
        self.assertGreater(refused, 0, "a full queue and buffer must push back")
        self.assertGreater(p.stats["backpressure"], 0)
        self.gw = FakeGateway(port)
        self.assertTrue(p.flush(15), p.stats)
        ids = self.gw.ids()
        self.assertEqual(len(ids), accepted, "every event publish() took is delivered")
        self.assertEqual(ids, sorted(ids), "in order")
        p.close()

    def test_disk_errors_keep_events_in_memory_and_push_back(self):
        port = free_port()
        p = self.publisher(f"http://127.0.0.1:{port}", max_queue=20)  # nothing listens yet
        real_append = p._disk.append
        disk_full = True

        def append(lines):
            if disk_full:
                raise OSError(errno.ENOSPC, "No space left on device")
            return real_append(lines)

        p._disk.append = append
        took = []
        pushed_back = None
        with self.assertLogs("weft_publish", "ERROR") as logs:
            for i in range(300):
                try:
                    p.publish("trace_event", {"id": i})
                    took.append(i)
                except Backpressure as exc:
                    pushed_back = exc
                    time.sleep(0.002)
        self.assertIsNotNone(pushed_back, "a failing disk and a full queue must push back")
        self.assertIn("No space left on device", str(pushed_back))
        self.assertIn("No space left on device", "\n".join(logs.output))
        self.assertEqual(p.stats.get("spilled", 0), 0)
        disk_full = False
        self.gw = FakeGateway(port)
        self.assertTrue(p.flush(15), p.stats)
        self.assertEqual(self.gw.ids(), took, "every event publish() took, in order")
        p.close()

    def test_buffer_cursor_errors_are_retried(self):
        port = free_port()
        p = self.publisher(f"http://127.0.0.1:{port}", batch_size=10)  # nothing listens yet
        for i in range(30):
            p.publish("trace_event", {"id": i})
        self.assertTrue(wait_until(lambda: p.stats.get("spilled", 0) == 30), p.stats)
        real_write_cursor = p._disk._write_cursor
        failures = [OSError(errno.EIO, "Input/output error")] * 2

        def write_cursor(pos):
            if failures:
                raise failures.pop()
            real_write_cursor(pos)

        p._disk._write_cursor = write_cursor
        self.gw = FakeGateway(port)
        self.assertTrue(p.flush(15), p.stats)
        self.assertEqual(failures, [], "the cursor write failed twice")
        self.assertEqual(list(dict.fromkeys(self.gw.ids())), list(range(30)), "all delivered, in order")
        for i in range(30, 40):
            p.publish("trace_event", {"id": i})
        self.assertTrue(p.flush(15), p.stats)
        self.assertEqual(self.gw.ids()[-10:], list(range(30, 40)))
        p.close()

    def test_a_dead_sender_thread_is_reported_not_hidden(self):
        self.gw = FakeGateway()
        p = self.publisher(self.gw.url)

        def bug(lines):
            raise RuntimeError("boom")

        p._deliver = bug  # an unexpected error on the sender thread
        with self.assertLogs("weft_publish", "ERROR") as logs:
            p.publish("trace_event", {"id": 0})
            self.assertTrue(wait_until(lambda: not p._thread.is_alive()))
        self.assertIn("boom", "\n".join(logs.output))
        with self.assertRaisesRegex(SenderFailed, "RuntimeError: boom"):
            p.publish("trace_event", {"id": 1})
        with self.assertRaises(SenderFailed):
            p.publish_many([("trace_event", {"id": 2}, None)])
        with self.assertRaises(SenderFailed):
            p.flush(1)
        with self.assertRaises(SenderFailed):
            p.close()

    def test_default_timeout_outlasts_the_gateways_kafka_timeout(self):
        # The gateway answers once every item is durable: with Kafka unreachable, after its
        # message_timeout_ms (then it spools), up to about twice that for a request under
        # way when Kafka went. A client that gives up first sends the batch again.
        config = os.path.join(os.path.dirname(__file__), "..", "..", "src", "config.rs")
        if not os.path.exists(config):
            self.skipTest("not in the weft repository")
        with open(config, encoding="utf-8") as f:
            m = re.search(r"\bmessage_timeout_ms: ([0-9_]+),", f.read())
        gateway = int(m.group(1).replace("_", "")) / 1000
        client = inspect.signature(Publisher).parameters["timeout"].default
        self.assertGreaterEqual(client, 2 * gateway + 5, f"gateway waits up to ~{2 * gateway} s")

    def test_publish_many_is_all_or_nothing(self):
        port = free_port()
        p = self.publisher(f"http://127.0.0.1:{port}", max_queue=5, max_buffer_bytes=10)
        # The buffer holds 10 bytes: the sender holds its first batch and takes no more.
        p.publish("trace_event", {"id": 0, "pad": "x" * 20})
        self.assertTrue(wait_until(lambda: p.stats.get("enqueued", 0) == 1 and p.stats["queued"] == 0))
        for i in (1, 2):
            p.publish("trace_event", {"id": i})
        self.assertEqual(p.stats["queued"], 2)
        group = [("policy_decision", {"id": "pd"}, "r"), ("trace_event", {"id": "te"}, "r"),
                 ("frame", {"id": "f"}, "r"), ("handle", {"id": "h"}, "r")]
        with self.assertRaises(Backpressure):
            p.publish_many(group)  # 3 of the 4 would fit one by one
        self.assertEqual(p.stats["queued"], 2, "nothing of the refused group was enqueued")
        p.close(timeout=0.2)

    def test_close_keeps_undelivered_events_for_the_next_publisher(self):
        port = free_port()
        p = self.publisher(f"http://127.0.0.1:{port}")
        for i in range(25):
            p.publish("trace_event", {"id": i})
        p.close(timeout=0.3)
        self.gw = FakeGateway(port)
        q = self.publisher(self.gw.url)
        self.assertTrue(q.flush(10), q.stats)
        self.assertEqual(self.gw.ids(), list(range(25)))
        q.close()

    def test_close_saves_a_batch_the_gateway_holds_and_the_queue_behind_it(self):
        stall = StallingGateway()
        self.addCleanup(stall.stop)
        p = self.publisher(stall.url)  # HTTP timeout 30 s: the POST outlasts close()
        p.publish("trace_event", {"id": 0})
        self.assertTrue(wait_until(lambda: stall.requests == 1 and p.stats["queued"] == 0), p.stats)
        for i in range(1, 26):
            p.publish("trace_event", {"id": i})
        started = time.monotonic()
        p.close(timeout=0.3)
        self.assertEqual(p.stats["queued"], 0, p.stats)
        self.assertEqual(p.stats.get("spilled", 0), 26, "the held batch and the queue are on disk")
        self.assertFalse(p._thread.is_alive())
        self.assertLess(time.monotonic() - started, 3.0, "close() does not wait for the held POST")
        self.gw = FakeGateway()
        q = self.publisher(self.gw.url)
        self.assertTrue(q.flush(10), q.stats)
        self.assertEqual(self.gw.ids(), list(range(26)), "the next publisher sends them, in order")
        q.close()

    def test_close_says_so_when_the_sender_cannot_save_in_time(self):
        self.gw = FakeGateway()
        p = self.publisher(self.gw.url)
        p.close_grace = 0.3
        stuck = threading.Event()
        self.addCleanup(stuck.set)

        def blocking():  # a payload callable that hangs the sender thread
            stuck.wait(30)
            return {"id": 0}

        p.publish("trace_event", blocking)
        self.assertTrue(wait_until(lambda: p.stats.get("enqueued", 0) == 1), p.stats)
        for i in range(1, 4):
            p.publish("trace_event", {"id": i})
        with self.assertRaisesRegex(PublishError, "at least 3 events not saved"):
            p.close(timeout=0.1)
        with self.assertRaisesRegex(PublishError, "closed"):
            p.publish("trace_event", {"id": 4})
        stuck.set()  # unstuck before exit: it saves them all after all
        p._thread.join(5)
        self.assertFalse(p._thread.is_alive())
        self.assertEqual(p.stats.get("spilled", 0), 4, p.stats)
        self.assertEqual(self.gw.ids(), [], "nothing is sent once close() gave up")


if __name__ == "__main__":
    unittest.main()

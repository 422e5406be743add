"""Unit tests of the adapters against the real weaver-kernel and ChainWeaver packages, with
a recording stand-in for the Publisher (no network). Skipped when the siblings are not
installed (`deploy/local/python_siblings.sh` installs them)."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import unittest

try:
    from weaver_kernel import Capability, CapabilityRegistry, Kernel, PolicyDenied, Principal, SafetyClass, StaticRouter
    from weaver_kernel.models import CapabilityRequest, RawResult

    HAVE_SIBLINGS = True
except ImportError:  # pragma: no cover
    HAVE_SIBLINGS = False

import weft_publish
from weft_publish.publisher import contract_to_dict


class Recorder:
    """Records what would be published, resolving lazy payloads as the sender would."""

    def __init__(self):
        self.events = []
        self.thread = threading.current_thread()

    def _add(self, kind, payload, rid):
        if callable(payload):
            payload = payload()
        if dataclasses.is_dataclass(payload):
            payload = contract_to_dict(payload)
        self.events.append((kind, rid, payload))

    def publish(self, kind, payload, *, request_id=None, tenant=None):
        self._add(kind, payload, request_id)

    def publish_many(self, events):
        for kind, payload, rid in events:
            self._add(kind, payload, rid)

    def of(self, kind):
        return [p for k, _, p in self.events if k == kind]


class Driver:
    driver_id = "local"

    async def execute(self, ctx):
        return RawResult(capability_id=ctx.capability_id, data=[{"a": 1}, {"a": 2}])


@unittest.skipUnless(HAVE_SIBLINGS, "weaver-kernel not installed")
class KernelAdapterTest(unittest.TestCase):
    def kernel(self, attach=True):
        from weft_publish.kernel import WeftTraceStore

        reg = CapabilityRegistry()
        reg.register(Capability(capability_id="read.x", name="x", description="read x", safety_class=SafetyClass.READ))
        reg.register(Capability(capability_id="write.x", name="w", description="write x", safety_class=SafetyClass.WRITE))
        rec = Recorder()
        store = WeftTraceStore(rec)
        k = Kernel(reg, router=StaticRouter(fallback=["local"]), trace_store=store)
        k.register_driver(Driver())
        if attach:
            store.attach(k)
        return k, rec, store

    def test_invoke_publishes_a_chained_allow(self):
        k, rec, store = self.kernel()
        who = Principal(principal_id="p1", roles=["reader"])
        with weft_publish.request("r-1"):
            g = k.grant_capability(CapabilityRequest(capability_id="read.x", goal="x"), who, justification="j")
            frame = asyncio.run(k.invoke(g.token, principal=who, args={}))
        self.assertEqual({rid for _, rid, _ in rec.events}, {"r-1"})
        (pd,), (auth, te), (fr,), (h,), (tok,) = (rec.of(x) for x in ("policy_decision", "trace_event", "frame", "handle", "capability_token"))
        self.assertEqual(pd["decision"], "allow")
        self.assertEqual(te["decision_id"], pd["decision_id"])
        self.assertEqual((auth["event_type"], te["event_type"]), ("capability_authorized", "capability_executed"))
        self.assertEqual(auth["decision_id"], pd["decision_id"])
        self.assertLess(auth["timestamp"], te["timestamp"], "authorized before executed (I-02)")
        self.assertNotIn("frame_id", auth)
        self.assertEqual(pd["token_id"], tok["token_id"])
        self.assertEqual(te["frame_id"], fr["frame_id"])
        self.assertEqual(fr["handle_refs"], [h["handle_id"]])
        self.assertEqual(h["handle_id"], frame.handle.handle_id)
        self.assertNotIn("issuer", tok, "None fields the spec does not allow as null are omitted")
        self.assertEqual(store.get(te["event_id"]).action_id, te["event_id"], "the inner store still answers")

    def test_denial_is_a_deny_decision_with_its_trace_event(self):
        k, rec, _ = self.kernel()
        with weft_publish.request("r-2"):
            with self.assertRaises(PolicyDenied):
                k.grant_capability(CapabilityRequest(capability_id="write.x", goal="w"),
                                   Principal(principal_id="p1", roles=["reader"]), justification="j")
        (pd,), (te,) = rec.of("policy_decision"), rec.of("trace_event")
        self.assertEqual((pd["decision"], te["event_type"], te["outcome"]), ("deny", "capability_denied", "failure"))
        self.assertEqual(te["decision_id"], pd["decision_id"])
        self.assertNotIn("frame_id", te)
        self.assertEqual(rec.of("frame"), [])

    def test_decision_id_is_stable_per_action(self):
        from weft_publish.kernel import decision_id_for

        self.assertEqual(decision_id_for("a-1"), decision_id_for("a-1"))
        self.assertNotEqual(decision_id_for("a-1"), decision_id_for("a-2"))

    def test_without_attach_the_frame_comes_from_the_trace(self):
        k, rec, _ = self.kernel(attach=False)
        who = Principal(principal_id="p1", roles=["reader"])
        g = k.grant_capability(CapabilityRequest(capability_id="read.x", goal="x"), who, justification="j")
        asyncio.run(k.invoke(g.token, principal=who, args={}))
        (_auth, te), (fr,), (h,) = rec.of("trace_event"), rec.of("frame"), rec.of("handle")
        self.assertEqual(te["frame_id"], fr["frame_id"])
        self.assertEqual(fr["handle_refs"], [h["handle_id"]])
        self.assertEqual(rec.of("capability_token"), [], "tokens need attach")


if __name__ == "__main__":
    unittest.main()

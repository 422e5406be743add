"""A real Weaver stack publishing to weft: weaver-kernel 0.12 + ChainWeaver 0.14.

The seed scenario of weft's issue 7, run against the real PyPI packages:

1. a ChainWeaver DAG flow of two steps, `research` (a local tool) then `codegen` (a
   capability step that ChainWeaver's `KernelBackedExecutor` delegates to a real weaver
   `Kernel` with a capability driver of its own), chosen by an ExecutionRoutingDecision;
2. the same flow shape where the kernel step needs a WRITE capability the principal may
   not use: the kernel denies it, the step and the flow fail;
3. a direct kernel request: grant, invoke, then expand the result's handle;
4. a direct denial.

It writes a manifest of what the packages themselves recorded (ChainWeaver's
ExecutionResult, the kernel's own TraceStore) for the test to compare with weft.

    python weaver_stack.py --url URL --key KEY --buffer-dir DIR --manifest OUT.json
        [--rounds N] [--loop-until STOPFILE --progress FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from typing import Any

from pydantic import BaseModel

from chainweaver import FlowRegistry, Tool
from chainweaver.flow import DAGFlow, DAGFlowStep
from chainweaver.integrations.agent_kernel import KernelBackedExecutor
from weaver_contracts.extended import ExecutionCandidate, ExecutionRoutingDecision
from weaver_kernel import (
    Capability,
    CapabilityRegistry,
    DefaultPolicyEngine,
    Kernel,
    PolicyDenied,
    Principal,
    SafetyClass,
    StaticRouter,
)
from weaver_kernel.models import CapabilityRequest, RawResult

import weft_publish
from weft_publish.chainweaver import KernelBridge, WeftFlowMiddleware
from weft_publish.kernel import WeftTraceStore


class CodegenDriver:
    """A local capability driver: "generates" code from research notes (deterministic)."""

    driver_id = "codegen-local"

    async def execute(self, ctx: Any) -> RawResult:
        notes = str(ctx.args.get("notes", ""))
        if ctx.capability_id == "repo.write":
            data = [{"path": "src/app.py", "bytes": len(notes)}]
        else:
            data = [
                {"file": "parser.py", "lines": 10 + len(notes) % 7, "topic": notes[:40]},
                {"file": "test_parser.py", "lines": 6, "topic": notes[:40]},
            ]
        return RawResult(capability_id=ctx.capability_id, data=data)


class ResearchIn(BaseModel):
    topic: str


class ResearchOut(BaseModel):
    notes: str


def research(inp: ResearchIn) -> dict[str, Any]:
    return {"notes": f"notes on {inp.topic}: use a recursive-descent parser"}


def build(publisher: weft_publish.Publisher) -> dict[str, Any]:
    reg = CapabilityRegistry()
    reg.register(Capability(capability_id="codegen.generate", name="Generate code",
                            description="generate code from research notes", safety_class=SafetyClass.READ))
    reg.register(Capability(capability_id="repo.write", name="Write repository",
                            description="write files to the repository", safety_class=SafetyClass.WRITE))
    store = WeftTraceStore(publisher)  # wraps the kernel's own TraceStore
    # The kernel's default rate limit (60 READ grants a minute per principal) would deny the
    # long outage run; the policy is otherwise the kernel's own.
    policy = DefaultPolicyEngine(rate_limits={SafetyClass.READ: (1_000_000, 60.0)})
    kernel = Kernel(reg, policy=policy, router=StaticRouter(fallback=["codegen-local"]), trace_store=store)
    kernel.register_driver(CodegenDriver())
    store.attach(kernel)  # tokens and real Frames too
    agent = Principal(principal_id="agent-7", roles=["reader"])

    flows = FlowRegistry()
    for name, cap in (("research_then_code", "codegen.generate"), ("research_then_commit", "repo.write")):
        flows.register_flow(DAGFlow(
            name=name, description=f"research, then {cap}", version="1.0.0",
            steps=[
                DAGFlowStep(tool_name="research", step_id="research", input_mapping={"topic": "topic"}),
                DAGFlowStep(tool_name=cap, step_id="kernel_step", depends_on=["research"],
                            step_type="capability", capability_id=cap, input_mapping={"notes": "notes"}),
            ],
        ))
    mw = WeftFlowMiddleware(publisher, principal=agent.principal_id)
    executor = KernelBackedExecutor(registry=flows, kernel=KernelBridge(kernel, agent), middleware=[mw])
    mw.bind(executor)  # kernel events of a capability step carry its step index
    executor.register_tool(Tool(name="research", description="research a topic",
                                input_schema=ResearchIn, output_schema=ResearchOut, fn=research))
    return {"kernel": kernel, "agent": agent, "executor": executor, "mw": mw}


def trace_view(t: Any) -> dict[str, Any]:
    return {"action_id": t.action_id, "event_type": t.event_type, "capability_id": t.capability_id,
            "handle_id": t.handle_id, "token_id": t.token_id or None, "error": t.error}


def one_round(w: dict[str, Any], i: int, manifest: dict[str, Any]) -> None:
    kernel, agent, executor, mw = w["kernel"], w["agent"], w["executor"], w["mw"]

    def new_traces(before: int) -> list[dict[str, Any]]:
        return [trace_view(t) for t in kernel.list_traces()[before:]]

    # 1. a routed flow: research, then codegen through the kernel.
    decision = ExecutionRoutingDecision(
        decision_id=f"erd-{uuid.uuid4().hex[:12]}",
        candidate=ExecutionCandidate(candidate_id="research_then_code", candidate_type="flow",
                                     name="research_then_code", version="1.0.0"),
        confidence=0.8, reason_codes=["capability_match"],
        created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
    # 2. a flow whose kernel step is denied (WRITE capability, reader principal).
    for name, routed in (("research_then_code", decision), ("research_then_commit", None)):
        before = len(kernel.list_traces())
        if routed is not None:
            with mw.routed(routed):
                res = executor.execute_flow(name, {"topic": f"parsers #{i}"})
        else:
            res = executor.execute_flow(name, {"topic": f"commits #{i}"})
        manifest["flows"].append({
            "trace_id": res.trace_id, "flow_name": name, "success": res.success,
            "routing_decision_id": routed.decision_id if routed else None,
            "steps": [{"step_index": s.step_index, "tool_name": s.tool_name, "success": s.success}
                      for s in res.execution_log],
            "kernel": new_traces(before),
        })

    # 3. a direct kernel request: grant, invoke, expand the handle.
    rid = f"direct-{uuid.uuid4().hex[:12]}"
    before = len(kernel.list_traces())
    with weft_publish.request(rid):
        grant = kernel.grant_capability(CapabilityRequest(capability_id="codegen.generate", goal="code"),
                                        agent, justification="direct use")
        import asyncio

        frame = asyncio.run(kernel.invoke(grant.token, principal=agent, args={"notes": f"direct {i}"}))
        kernel.expand(frame.handle, query={"limit": 1}, principal=agent)
    manifest["requests"].append({"request_id": rid, "kernel": new_traces(before)})

    # 4. a direct denial.
    rid = f"deny-{uuid.uuid4().hex[:12]}"
    before = len(kernel.list_traces())
    with weft_publish.request(rid):
        try:
            kernel.grant_capability(CapabilityRequest(capability_id="repo.write", goal="write"),
                                    agent, justification="try to write")
            raise SystemExit("the kernel granted a WRITE capability to a reader")
        except PolicyDenied:
            pass
    manifest["requests"].append({"request_id": rid, "kernel": new_traces(before)})


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--buffer-dir", required=True)
    ap.add_argument("--manifest", required=True)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--loop-until", help="keep running rounds until this file exists")
    ap.add_argument("--progress", help="file to write the number of finished rounds to")
    ap.add_argument("--pause", type=float, default=0.05, help="seconds between rounds in loop mode")
    ap.add_argument("--flush-timeout", type=float, default=120.0)
    a = ap.parse_args()

    publisher = weft_publish.Publisher(a.url, a.key, buffer_dir=a.buffer_dir, backoff_max=1.0)
    w = build(publisher)
    manifest: dict[str, Any] = {"flows": [], "requests": []}
    rounds = 0
    while True:
        one_round(w, rounds, manifest)
        rounds += 1
        if a.progress:
            tmp = a.progress + ".tmp"
            with open(tmp, "w") as f:
                json.dump({"rounds": rounds, "stats": publisher.stats}, f)
            os.replace(tmp, a.progress)
        if a.loop_until:
            if os.path.exists(a.loop_until):
                break
            time.sleep(a.pause)
        elif rounds >= a.rounds:
            break
    flushed = publisher.flush(timeout=a.flush_timeout)
    manifest["rounds"] = rounds
    manifest["flushed"] = flushed
    manifest["stats"] = publisher.stats
    manifest["rejections"] = [r.__dict__ for r in publisher.rejections]
    publisher.close()
    with open(a.manifest, "w") as f:
        json.dump(manifest, f, indent=1)
    return 0 if flushed and not manifest["rejections"] else 1


if __name__ == "__main__":
    sys.exit(main())

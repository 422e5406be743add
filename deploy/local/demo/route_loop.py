#!/usr/bin/env python3
"""The demo's feedback loop: ask `weft router` for decisions, play the chosen candidate
against hidden success rates, and post the outcome back as ExecutionFeedback.

Standard library only. Prints one summary line per quarter of the run, so the demo shows
the router shifting its choices towards the best candidate as feedback reaches ClickHouse.
"""

import argparse
import collections
import datetime
import json
import random
import urllib.request

# Hidden truth the router must discover: (success rate, latency ms, cost usd).
ARMS = {
    "fast-cheap": (0.60, 120, 0.001),
    "solid": (0.90, 400, 0.010),
    "middling": (0.75, 250, 0.004),
}
CANDIDATES = [
    {"candidate_id": "fast-cheap", "candidate_type": "tool"},
    {"candidate_id": "solid", "candidate_type": "tool"},
    {"candidate_id": "middling", "candidate_type": "flow"},
    # Its prior latency breaks the constraint below, so it must never be chosen.
    {"candidate_id": "slow-batch", "candidate_type": "workflow", "metadata": {"x_weft_latency_ms": 5000}},
]


def post(url, key, body):
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read() or b"null")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--router", default="http://127.0.0.1:8790")
    p.add_argument("--key", required=True)
    p.add_argument("--cycles", type=int, default=400)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    rng = random.Random(a.seed)
    quarter = max(1, a.cycles // 4)
    chosen = collections.Counter()
    for i in range(a.cycles):
        d = post(f"{a.router}/v1/route", a.key, {
            "context": {"intent": "summarize", "request_id": f"demo-route-{a.seed}-{i}"},
            "candidates": CANDIDATES,
            "constraints": {"max_latency_ms": 2000},
        })
        cid = d["candidate"]["candidate_id"]
        rate, latency, cost = ARMS[cid]
        chosen[cid] += 1
        post(f"{a.router}/v1/feedback", a.key, {
            "decision_id": d["decision_id"],
            "candidate_id": cid,
            "success": rng.random() < rate,
            "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat().replace("+00:00", "Z"),
            "latency_ms": int(latency * (0.8 + 0.4 * rng.random())),
            "cost": {"usd": cost},
        })
        if (i + 1) % quarter == 0:
            share = ", ".join(f"{k} {v}" for k, v in sorted(chosen.items()))
            print(f"  decisions {i + 1 - quarter + 1:>4}-{i + 1:<4}: {share}", flush=True)
            chosen.clear()


if __name__ == "__main__":
    main()

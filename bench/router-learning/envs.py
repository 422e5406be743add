"""The two benchmark environments, seeded, with every random draw made up front so that
weft and Vowpal Wabbit see identical contexts and identical outcomes.

(a) `plain`: 4 candidates with hidden success rates; one of them (the best on success
    alone) is too slow for the request's max_latency_ms, which nothing declares.
(b) `contextual`: 5 candidates (LLM-like: small, mid, large, long-context, code); the
    success probability of each depends on the customer tier, the language, the task type,
    the document size and an urgency flag through a hidden logistic model drawn per seed.
    3 x 5 x 8 x 2 categorical combinations times a continuous size: far more contexts than
    3000 cycles could learn one by one.
"""

import math
import random

MAX_LATENCY_MS = 1000.0


def squash(x):
    """weft's numeric feature rule: sign(x) ln(1 + |x|)."""
    return math.copysign(math.log1p(abs(x)), x)


class Plain:
    name = "plain"
    candidates = [
        {"candidate_id": "fast-cheap", "candidate_type": "tool"},
        {"candidate_id": "solid", "candidate_type": "tool"},
        {"candidate_id": "middling", "candidate_type": "flow"},
        {"candidate_id": "slow-batch", "candidate_type": "workflow"},
    ]
    # (success rate, mean latency ms): slow-batch breaks max_latency_ms.
    truth = {
        "fast-cheap": (0.52, 150.0),
        "solid": (0.73, 420.0),
        "middling": (0.64, 260.0),
        "slow-batch": (0.85, 2400.0),
    }

    def __init__(self, seed, cycles):
        rng = random.Random(seed)
        self.draws = []
        for t in range(cycles):
            ctx = {"intent": "summarize"}
            u = {c["candidate_id"]: rng.random() for c in self.candidates}
            lat = {c["candidate_id"]: 0.8 + 0.4 * rng.random() for c in self.candidates}
            self.draws.append((ctx, u, lat))

    def rate(self, ctx, cand):
        return self.truth[cand][0]

    def latency(self, t, cand):
        return self.truth[cand][1] * self.draws[t][2][cand]

    def feasible(self, cand):
        return self.truth[cand][1] * 1.2 <= MAX_LATENCY_MS

    constraints = {"max_latency_ms": MAX_LATENCY_MS}


class Contextual:
    name = "contextual"
    candidates = [
        {"candidate_id": "small-fast", "candidate_type": "tool"},
        {"candidate_id": "mid", "candidate_type": "tool"},
        {"candidate_id": "large", "candidate_type": "tool"},
        {"candidate_id": "long-context", "candidate_type": "tool"},
        {"candidate_id": "code-special", "candidate_type": "agent"},
    ]
    tiers = ["free", "pro", "enterprise"]
    langs = ["en", "de", "fr", "ja", "es"]
    tasks = ["summarize", "extract", "classify", "translate", "code", "qa", "chat", "search"]

    def __init__(self, seed, cycles):
        rng = random.Random(seed)
        ids = [c["candidate_id"] for c in self.candidates]
        # The hidden model: a logit per candidate, additive in the context fields, with some
        # structure (large is good but not everywhere, long-context wins on big documents,
        # code-special on code) plus per-seed random effects.
        self.coef = {}
        for a in ids:
            self.coef[a] = {
                "bias": rng.gauss(0.0, 0.3),
                "tier": {v: rng.gauss(0.0, 0.5) for v in self.tiers},
                "lang": {v: rng.gauss(0.0, 0.5) for v in self.langs},
                "task": {v: rng.gauss(0.0, 0.7) for v in self.tasks},
                "size": rng.gauss(0.0, 0.15),
                "urgent": rng.gauss(0.0, 0.4),
            }
        self.coef["long-context"]["size"] += 0.35
        self.coef["long-context"]["bias"] -= 2.6
        self.coef["code-special"]["task"]["code"] += 1.5
        self.coef["large"]["bias"] += 0.3
        self.coef["small-fast"]["urgent"] += 0.6
        self.draws = []
        for t in range(cycles):
            ctx = {
                "tier": rng.choice(self.tiers),
                "lang": rng.choice(self.langs),
                "task": rng.choice(self.tasks),
                "doc_tokens": int(math.exp(rng.uniform(math.log(200), math.log(60000)))),
                "urgent": rng.random() < 0.3,
            }
            u = {a: rng.random() for a in ids}
            lat = {a: 0.8 + 0.4 * rng.random() for a in ids}
            self.draws.append((ctx, u, lat))

    def rate(self, ctx, cand):
        c = self.coef[cand]
        z = (
            c["bias"]
            + c["tier"][ctx["tier"]]
            + c["lang"][ctx["lang"]]
            + c["task"][ctx["task"]]
            + c["size"] * (squash(ctx["doc_tokens"]) - 8.0)
            + (c["urgent"] if ctx["urgent"] else 0.0)
        )
        return 1.0 / (1.0 + math.exp(-z))

    def latency(self, t, cand):
        return 300.0 * self.draws[t][2][cand]

    def feasible(self, cand):
        return True

    constraints = {}


ENVS = {"plain": Plain, "contextual": Contextual}


def vw_features(ctx):
    """The same features weft uses (docs/ROUTER.md, Features), in VW's text format."""
    out = []
    for k, v in sorted(ctx.items()):
        if k == "request_id" or k == "tenant" or k.endswith("_id"):
            continue
        if isinstance(v, bool):
            out.append(f"{k}={'true' if v else 'false'}")
        elif isinstance(v, (int, float)):
            out.append(f"{k}:{squash(float(v))}")
        else:
            out.append(f"{k}={v}")
    return " ".join(out)

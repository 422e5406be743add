"""Drive a running `weft router` over HTTP through the two environments (feedback through
POST /v1/feedback, hence Kafka, ingest and ClickHouse), and Vowpal Wabbit
`--cb_explore_adf --squarecb` in process on the identical draws; print and write the figures.

Each seed is its own tenant (its own model), so the seeds of an environment run in parallel
threads against one router; within a seed the cycles are sequential (route -> outcome ->
feedback answered 202 -> next route), so every outcome is known before the next decision,
as for VW.
"""

import argparse
import http.client
import json
import random
import statistics
import threading
import time
import urllib.parse

from envs import ENVS, vw_features


def key_of(env, seed):
    return f"k-bench-{env}-{seed}-0123456789"


def tenant_of(env, seed):
    return f"{env}-{seed}"


class Client:
    def __init__(self, base, key):
        u = urllib.parse.urlparse(base)
        self.conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
        self.key = key

    def post(self, path, body):
        data = json.dumps(body)
        self.conn.request(
            "POST",
            path,
            body=data,
            headers={"authorization": f"Bearer {self.key}", "content-type": "application/json"},
        )
        r = self.conn.getresponse()
        text = r.read()
        return r.status, dict(r.getheaders()), json.loads(text) if text else None


def score(env, chosen):
    """Per-cycle expected reward (0 when infeasible), the oracle's, and whether chosen is best."""
    out = []
    for t, c in enumerate(chosen):
        ctx = env.draws[t][0]
        feas = [x["candidate_id"] for x in env.candidates if env.feasible(x["candidate_id"])]
        rates = {a: env.rate(ctx, a) for a in feas}
        best = max(feas, key=lambda a: rates[a])
        got = rates.get(c, 0.0)
        out.append((got, rates[best], c == best, not env.feasible(c)))
    return out


def summary(rows, realized):
    n = len(rows)
    last = rows[-500:]
    regret = sum(o - g for g, o, _, _ in rows)
    return {
        "regret": regret,
        "best_share_last500": sum(1 for r in last if r[2]) / len(last),
        "violations": sum(1 for r in rows if r[3]),
        "last500_mean": statistics.fmean(r[0] for r in last),
        "last500_oracle": statistics.fmean(r[1] for r in last),
        "last500_realized": statistics.fmean(realized[-500:]),
        "cycles": n,
    }


def run_weft(base, env_cls, seed, cycles, out, lat_us):
    env = env_cls(seed, cycles)
    cl = Client(base, key_of(env.name, seed))
    chosen, realized = [], []
    for t in range(cycles):
        ctx, u, _ = env.draws[t]
        body = {
            "context": dict(ctx, request_id=f"{env.name}-{seed}-{t}"),
            "candidates": env.candidates,
            "constraints": env.constraints,
        }
        st, hdr, d = cl.post("/v1/route", body)
        assert st == 200, (st, d)
        lat_us.append(int(hdr.get("x-weft-decision-us", "0")))
        c = d["candidate"]["candidate_id"]
        chosen.append(c)
        ok = u[c] < env.rate(ctx, c)
        realized.append(1.0 if ok and env.feasible(c) else 0.0)
        fb = {
            "decision_id": d["decision_id"],
            "candidate_id": c,
            "success": bool(ok),
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "latency_ms": int(env.latency(t, c)),
        }
        st, _, r = cl.post("/v1/feedback", fb)
        assert st == 202, (st, r)
    out[seed] = summary(score(env, chosen), realized)


def run_vw(env_cls, seed, cycles, args):
    import vowpalwabbit

    env = env_cls(seed, cycles)
    vw = vowpalwabbit.Workspace(args + f" --quiet --random_seed {seed}")
    rng = random.Random(seed * 7919 + 1)
    chosen, realized = [], []
    ids = [c["candidate_id"] for c in env.candidates]
    types = {c["candidate_id"]: c["candidate_type"] for c in env.candidates}

    def lines(ctx, label=None):
        ls = [f"shared |c {vw_features(ctx)}"]
        for a in ids:
            pre = f"0:{label[1]}:{label[2]} " if label and label[0] == a else ""
            ls.append(f"{pre}|a a={a} t={types[a]}")
        return ls

    for t in range(cycles):
        ctx, u, _ = env.draws[t]
        pmf = vw.predict(lines(ctx))
        x, acc, k = rng.random(), 0.0, len(pmf) - 1
        for i, p in enumerate(pmf):
            acc += p
            if x < acc:
                k = i
                break
        c = ids[k]
        chosen.append(c)
        ok = u[c] < env.rate(ctx, c) and env.feasible(c)
        realized.append(1.0 if ok else 0.0)
        vw.learn(lines(ctx, (c, -1.0 if ok else 0.0, pmf[k])))
    vw.finish()
    return summary(score(env, chosen), realized)


def mean_of(runs):
    keys = runs[0].keys()
    return {k: statistics.fmean(r[k] for r in runs) for k in keys}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--router", required=True)
    ap.add_argument("--envs", default="plain,contextual")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--cycles", type=int, default=3000)
    ap.add_argument("--vw", default="--cb_explore_adf --squarecb -q ca")
    ap.add_argument("--out", default="results.json")
    a = ap.parse_args()
    results = {}
    for name in a.envs.split(","):
        env_cls = ENVS[name]
        out, lat_us, threads = {}, [], []
        started = time.time()
        for s in range(a.seeds):
            th = threading.Thread(target=run_weft, args=(a.router, env_cls, s, a.cycles, out, lat_us))
            th.start()
            threads.append(th)
        for th in threads:
            th.join()
        wall = time.time() - started
        assert len(out) == a.seeds, f"only {len(out)} of {a.seeds} seeds finished"
        weft = [out[s] for s in range(a.seeds)]
        vw = [run_vw(env_cls, s, a.cycles, a.vw) for s in range(a.seeds)]
        lat_us.sort()
        results[name] = {
            "weft": mean_of(weft),
            "vw": mean_of(vw),
            "weft_per_seed": weft,
            "vw_per_seed": vw,
            "weft_decision_us_p50": lat_us[len(lat_us) // 2],
            "weft_decision_us_p99": lat_us[int(len(lat_us) * 0.99)],
            "wall_s": wall,
        }
        r = results[name]
        print(f"== {name}: {a.seeds} seeds x {a.cycles} cycles, weft over HTTP in {wall:.0f} s")
        for who in ("weft", "vw"):
            m = r[who]
            print(
                f"  {who:4}: regret {m['regret']:.1f}, best share (last 500) {m['best_share_last500']:.3f}, "
                f"violations {m['violations']:.1f}, last-500 mean {m['last500_mean']:.4f} vs oracle "
                f"{m['last500_oracle']:.4f} ({100 * m['last500_mean'] / m['last500_oracle']:.1f}%), "
                f"realized {m['last500_realized']:.4f}"
            )
        print(f"  weft server-side decision time p50 {r['weft_decision_us_p50']} us, p99 {r['weft_decision_us_p99']} us")
    with open(a.out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()

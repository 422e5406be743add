"""Write an environment's draws (contexts, outcome uniforms, true rates, feasibility) as
JSON, for the router's in-process simulation (`cargo test -p weft-router sim_env -- --ignored`),
which replays the contextual policy on them without HTTP: a quick way to tune."""
import json, sys
from envs import ENVS

name, seeds, cycles, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
runs = []
for s in range(seeds):
    env = ENVS[name](s, cycles)
    ids = [c["candidate_id"] for c in env.candidates]
    runs.append({
        "candidates": env.candidates,
        "feasible": [env.feasible(a) for a in ids],
        "latency": [env.latency(0, a) / env.draws[0][2][a] for a in ids],
        "max_latency_ms": env.constraints.get("max_latency_ms"),
        "cycles": [{"context": ctx, "u": [u[a] for a in ids], "rate": [env.rate(ctx, a) for a in ids]}
                   for ctx, u, _ in env.draws],
    })
json.dump(runs, open(out, "w"))

#!/usr/bin/env bash
# The README's main command: the whole pipeline on the local stack, with a short report.
#
#   bash deploy/local/demo.sh            # FLOWS=300 by default
#
# It starts the stack (installing what is missing), builds weft, migrates ClickHouse, starts
# `weft ingest`, publishes simulated kernel + orchestrator traffic (shuffled, 20% without a
# request id, duplicates), waits until every event is stored, and prints what happened.
# The stack and ingest keep running afterwards so you can explore; the last lines say how
# to stop them.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO"
FLOWS=${FLOWS:-300}
SEED=${SEED:-$RANDOM}
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "local stack"
bash deploy/local/stack.sh up
# shellcheck disable=SC1091
source "${WEFT_RUN_DIR:-$REPO/.weft/run}/env"
RUN=$WEFT_RUN_DIR/demo
mkdir -p "$RUN"

say "build (release)"
cargo build --release --quiet --bin weft
WEFT=$REPO/target/release/weft
export RUST_LOG=${RUST_LOG:-warn}

say "migrate ClickHouse"
$WEFT migrate

say "start weft ingest (status server on 127.0.0.1:8788)"
if [ -f "$RUN/ingest.pid" ] && kill -0 "$(cat "$RUN/ingest.pid")" 2>/dev/null; then
  echo "already running (pid $(cat "$RUN/ingest.pid"))"
else
  # A demo key, so the narrative API can be tried with curl below.
  WEFT_API_KEYS="demo-key-0123456789abcdef=default" setsid "$WEFT" ingest >"$RUN/ingest.log" 2>&1 &
  echo $! >"$RUN/ingest.pid"
  for _ in $(seq 1 100); do curl -sf http://127.0.0.1:8788/healthz >/dev/null && break; sleep 0.1; done
fi

say "simulate $FLOWS flows (seed $SEED) and publish them"
$WEFT simulate --flows "$FLOWS" --seed "$SEED" --shuffle --no-request-id 0.2 --duplicates 0.05 \
  --truth "$RUN/truth.json" --out "$RUN/events.jsonl"
$WEFT publish "$RUN/events.jsonl" --spool-dir "$RUN/spool"

ch() { curl -sf "$WEFT_CLICKHOUSE_URL/?database=weft" --data-binary "$1"; }
want=$(python3 -c "import json;print(json.load(open('$RUN/truth.json'))['totals']['distinct_ids'])")
say "waiting until all $want events of this run are stored and in their narratives"
t0=$EPOCHREALTIME
got=0
for _ in $(seq 1 900); do
  # A failed query counts as none stored yet; the last error is kept for the message below.
  if got=$(ch "SELECT count() FROM (SELECT narrative_id, kind, id, argMax(is_deleted, version) AS gone
            FROM weft_narratives WHERE narrative_id LIKE 'req-$SEED-%' GROUP BY narrative_id, kind, id) WHERE gone = 0" 2>"$RUN/wait.err"); then
    [ "$got" -ge "$want" ] && break
  else
    got=0
  fi
  sleep 0.2
done
if [ "$got" -lt "$want" ]; then
  echo "demo: FAILED: only $got of $want events of this run are in their narratives after 180 s" >&2
  if [ -s "$RUN/wait.err" ]; then echo "demo: last ClickHouse error: $(cat "$RUN/wait.err")" >&2; fi
  echo "demo: logs: $RUN/ingest.log (weft ingest), $WEFT_RUN_DIR/*.log (the stack)" >&2
  exit 1
fi
printf '%s of %s events in %s narratives, %.1f s after publishing\n' "$got" "$want" "$FLOWS" \
  "$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN{print b-a}')"

say "what weft stored (all runs)"
ch "SELECT kind, count() AS facts, uniqExact(request_id) AS requests, sum(conflict) AS id_conflicts FROM weft_events GROUP BY kind ORDER BY kind FORMAT PrettyCompactMonoBlock"
curl -sf http://127.0.0.1:8788/metrics | grep -E '^weft_ingest_(consumed|inserted|deduplicated|dead_lettered|replay)' | awk '{s[$1]+=$2} END {for (k in s) printf "  %-60s %d\n", k, s[k]}' | sort
ch "SELECT count() AS narratives FROM (SELECT DISTINCT narrative_id FROM weft_narratives WHERE narrative_id LIKE 'req-$SEED-%') FORMAT PrettyCompactMonoBlock"

say "one narrative, rebuilt from events that arrived shuffled (some without a request id)"
$WEFT narrative "req-$SEED-1" >"$RUN/narrative.txt"
head -40 "$RUN/narrative.txt"
say "the same through the API"
echo "curl -s -H 'Authorization: Bearer demo-key-0123456789abcdef' http://127.0.0.1:8788/v1/narratives/req-$SEED-1"
curl -s -H 'Authorization: Bearer demo-key-0123456789abcdef' "http://127.0.0.1:8788/v1/narratives/req-$SEED-1" >"$RUN/narrative.json"
head -c 400 "$RUN/narrative.json"; echo ' ...'

say "compliance audit: invariant checks, then the tamper-evident hash chain"
echo "this run injected (simulator ground truth): $(python3 -c "import json;print(json.load(open('$RUN/truth.json'))['totals']['violations'])")"
# Simulated time starts at 2026-11-01 in every run, so earlier demo runs are counted too.
$WEFT audit check --from 2026-10-01T00:00:00Z --to 2027-01-01T00:00:00Z --grace-secs 0 --summary
# The sealing key (ed25519, made once, kept in the run directory with mode 0600, never in
# ClickHouse; keyring.json is its public half for verifiers). The audit service below seals
# every minute from now on; this first seal is done by hand so the verify shows the chain.
[ -s "$RUN/seal.key" ] || $WEFT audit keygen --kid demo-seal --out "$RUN/seal.key" >"$RUN/keyring.json"
$WEFT audit seal --sign-key "$RUN/seal.key" >/dev/null && $WEFT audit verify | tail -3
if ! { [ -f "$RUN/audit.pid" ] && kill -0 "$(cat "$RUN/audit.pid")" 2>/dev/null; }; then
  WEFT_AUDIT_KEYS="demo-audit-key-0123456789abcdef=default" setsid "$WEFT" audit serve \
    --seal-every-secs 60 --sign-key "$RUN/seal.key" >"$RUN/audit.log" 2>&1 &
  echo $! >"$RUN/audit.pid"
fi

say "the feedback loop: weft router learns from ExecutionFeedback aggregated in ClickHouse"
ROUTER_KEY=demo-router-key-0123456789abcdef
if [ -f "$RUN/router.pid" ] && kill -0 "$(cat "$RUN/router.pid")" 2>/dev/null; then
  echo "router already running (pid $(cat "$RUN/router.pid"))"
else
  WEFT_ROUTER_KEYS="$ROUTER_KEY=default" setsid "$WEFT" router --policy thompson --refresh-ms 500 \
    --spool-dir "$RUN/router-spool" >"$RUN/router.log" 2>&1 &
  echo $! >"$RUN/router.pid"
  for _ in $(seq 1 100); do curl -sf http://127.0.0.1:8790/healthz >/dev/null && break; sleep 0.1; done
fi
echo "400 decisions among 3 candidates with hidden success rates 0.60 / 0.90 / 0.75 (and one"
echo "that breaks the latency constraint); each outcome is posted back as feedback:"
python3 deploy/local/demo/route_loop.py --key "$ROUTER_KEY" --cycles 400 --seed "$SEED"

say "offline evaluation of the greedy policy on the logged decisions (IPS, SNIPS, DR)"
# The decisions and feedback travel through Kafka and ingest first: wait until they are stored.
n=0
for _ in $(seq 1 900); do
  # A feedback's decision_id is in its payload and links (the decision_id column means an
  # authorization decision).
  if n=$(ch "SELECT count() FROM weft_events WHERE kind = 'execution_feedback' AND JSONExtractString(payload, 'decision_id') IN
          (SELECT id FROM weft_events WHERE kind = 'execution_routing_decision' AND request_id LIKE 'demo-route-$SEED-%')" 2>"$RUN/wait.err"); then
    [ "$n" -ge 400 ] && break
  else
    n=0
  fi
  sleep 0.2
done
if [ "$n" -lt 400 ]; then
  echo "demo: FAILED: only $n of 400 feedback events of the loop are stored after 180 s" >&2
  if [ -s "$RUN/wait.err" ]; then echo "demo: last ClickHouse error: $(cat "$RUN/wait.err")" >&2; fi
  echo "demo: logs: $RUN/router.log (weft router), $RUN/ingest.log (weft ingest)" >&2
  exit 1
fi
# No --gate, so eval exits non-zero only on an error, which ends the demo; the artifact of
# an earlier run is removed first so it is never shown as this run's.
rm -f "$RUN/eval.json"
$WEFT eval --tenant default --since-s 3600 --policy greedy --bootstrap 200 --out "$RUN/eval.json"
python3 - "$RUN/eval.json" <<'PY'
import json, sys
a = json.load(open(sys.argv[1]))
for k in ("candidate_policy", "baseline_policy", "support_state", "recommendation_kind"):
    print(f"  {k:<22} {a.get(k)}")
for k, v in a.items():
    if isinstance(v, dict) and any(x in k for x in ("estimate", "metric", "result")):
        print(f"  {k:<22} {json.dumps(v)[:300]}")
PY

say "done"
cat <<MSG
weft ingest (pid $(cat "$RUN/ingest.pid"), log $RUN/ingest.log) and weft router
(pid $(cat "$RUN/router.pid"), log $RUN/router.log) keep running, and so does weft audit serve
(pid $(cat "$RUN/audit.pid"), log $RUN/audit.log), sealing the hash chain every 60 s.
Explore:   $WEFT narrative req-$SEED-2 --format json
           $WEFT audit timeline --request req-$SEED-2
           $WEFT audit search --decision deny --format csv
           the evaluation artifact: $RUN/eval.json
Stop all:  kill \$(cat $RUN/ingest.pid) \$(cat $RUN/router.pid) \$(cat $RUN/audit.pid); bash deploy/local/stack.sh down
MSG

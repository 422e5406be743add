#!/usr/bin/env bash
# The router learning benchmark (issue 17): weft's defaults vs Vowpal Wabbit
# `--cb_explore_adf --squarecb` on identical draws, both environments, 10 seeds x 3000 cycles.
#
#   WEFT_KAFKA_PORT=... bash deploy/local/stack.sh up && source .weft/run/env
#   cargo build --release --bin weft
#   bash bench/router-learning/run.sh            # SEEDS=10 CYCLES=3000 ENVS=plain,contextual
#
# weft runs as a real `weft router` (its defaults; the producer's linger lowered to 5 ms so a
# feedback's ack does not wait 50 ms) beside a real `weft ingest`, on a fresh database and
# topic prefix: every decision and feedback goes through Kafka, ingest and ClickHouse, and
# the router's refresh (default 5 s) reconciles its model with the stored rows while the
# benchmark runs. VW runs in process (its feedback is immediate). Results: results.json.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
VENV="${VENV:-$HOME/.cache/weft/bench-router-venv}"
WEFT="${WEFT_BIN:-$ROOT/target/release/weft}"
SEEDS="${SEEDS:-10}"
CYCLES="${CYCLES:-3000}"
ENVS="${ENVS:-plain,contextual}"
: "${WEFT_KAFKA_BROKERS:?source .weft/run/env first (deploy/local/stack.sh up)}"
: "${WEFT_CLICKHOUSE_URL:?source .weft/run/env first}"

if [ ! -x "$VENV/bin/python" ]; then python3 -m venv "$VENV"; fi
"$VENV/bin/pip" install -q 'vowpalwabbit>=9.10,<10'
"$VENV/bin/python" -c 'import vowpalwabbit; print("vowpalwabbit", vowpalwabbit.__version__)'

NAME="bench_router_$(date +%s)_$$"
WORK="$(mktemp -d)"
export WEFT_CLICKHOUSE_DATABASE="$NAME" WEFT_TOPIC_PREFIX="$NAME." RUST_LOG=warn
KEYS=""
for env in ${ENVS//,/ }; do
  for ((s = 0; s < SEEDS; s++)); do KEYS+="k-bench-$env-$s-0123456789=$env-$s,"; done
done
export WEFT_ROUTER_KEYS="${KEYS%,}"
"$WEFT" migrate >/dev/null
RUST_LOG=info "$WEFT" ingest --listen "" --group "$NAME" 2>"$WORK/ingest.log" &
INGEST=$!
ROUTER=""
cleanup() { [ -n "$ROUTER" ] && kill "$ROUTER" 2>/dev/null; kill "$INGEST" 2>/dev/null; wait 2>/dev/null || true; }
trap cleanup EXIT
for _ in $(seq 600); do grep -q "narrative projector loaded" "$WORK/ingest.log" && break; sleep 0.1; done
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$WEFT" router --listen "127.0.0.1:$PORT" --publish-linger-ms 5 --no-create-topics \
  --spool-dir "$WORK/spool" 2>"$WORK/router.log" &
ROUTER=$!
for _ in $(seq 300); do (echo >"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break; sleep 0.1; done
cd "$HERE"
"$VENV/bin/python" bench.py --router "http://127.0.0.1:$PORT" --envs "$ENVS" --seeds "$SEEDS" \
  --cycles "$CYCLES" --out "${OUT:-$HERE/results.json}"
curl -s "http://127.0.0.1:$PORT/metrics" | grep -E '^weft_router_(decisions|feedback|model_learned_now|model_refresh_rows|snapshot_refresh)_total'
Q="SELECT kind, count() FROM $NAME.weft_events GROUP BY kind ORDER BY kind FORMAT TSV"
echo "stored in ClickHouse:"; curl -s "$WEFT_CLICKHOUSE_URL" --data-binary "$Q"

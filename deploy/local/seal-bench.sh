#!/usr/bin/env bash
# The CPU cost of sealing (docs/AUDIT.md, "Cost of sealing"), apart from ingest's: FLOWS
# simulated flows (about 24 events each) through Kafka and ingest into a database of their
# own, then `weft audit seal` over all of it (one seal from genesis, the loop's worst case:
# every row is new), then `weft audit verify`. Prints the rows and the CPU seconds of weft and
# of the ClickHouse server (/proc/PID/stat) for each step, ingest's included.
# Needs the local stack (deploy/local/stack.sh up); not part of test.sh.
#   WEFT=target/release/weft FLOWS=4200 bash deploy/local/seal-bench.sh
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
WEFT=${WEFT:-target/release/weft}
FLOWS=${FLOWS:-4200}
RUN=${WEFT_RUN_DIR:-$REPO/.weft/run}
source "$RUN/env"
DB=${SEAL_BENCH_DB:-weft_seal_bench}
export WEFT_CLICKHOUSE_DATABASE=$DB WEFT_TOPIC_PREFIX=$DB. RUST_LOG=warn
D=$RUN/$DB; mkdir -p "$D"
ch() { curl -sfS "$WEFT_CLICKHOUSE_URL/?database=$DB" --data-binary "$1"; }
srv_cpu() {
  local pid
  pid=$(cat "$RUN/clickhouse.pid" 2>/dev/null || true)
  if [ -n "$pid" ] && [ -r "/proc/$pid/stat" ]; then awk '{print ($14+$15)/100}' "/proc/$pid/stat"; else echo 0; fi
}
pid_cpu() { awk '{print ($14+$15)/100}' "/proc/$1/stat"; }
report() { # step, rows, weft cpu, clickhouse cpu, wall
  python3 -c "
rows, w, c, wall = $2, $3, $4, $5
print('%-7s rows %d  wall %.2f s  weft cpu %.2f s  clickhouse cpu %.2f s  total %.2f s = %.2f CPU-s per 100k rows  (load %s)' % (
    '$1', rows, wall, w, c, w + c, (w + c) * 1e5 / max(rows, 1), open('/proc/loadavg').read().split()[0]))"
}
curl -sfS "$WEFT_CLICKHOUSE_URL/" --data-binary "DROP DATABASE IF EXISTS $DB"
"$WEFT" migrate
"$WEFT" simulate --flows "$FLOWS" --seed 4242 --shuffle --no-request-id 0.1 --duplicates 0.05 \
  --out "$D/events.jsonl" --truth "$D/truth.json"
want=$(python3 -c "import json;print(json.load(open('$D/truth.json'))['totals']['distinct_events'])")
"$WEFT" publish "$D/events.jsonl" --drain-spool --message-timeout-ms 300000 \
  --topic-prefix "$DB." --spool-dir "$D/spool"
s0=$(srv_cpu); t0=$(date +%s.%N)
"$WEFT" ingest --listen '' --group "$DB-$(date +%s)" >"$D/ingest.log" 2>&1 &
ing=$!
for _ in $(seq 1 1200); do
  [ "$(ch 'SELECT count() FROM weft_events')" -ge "$want" ] && break
  sleep 0.5
done
w=$(pid_cpu "$ing"); t1=$(date +%s.%N); s1=$(srv_cpu)
kill "$ing"; wait "$ing" || true
n=$(ch 'SELECT count() FROM weft_events')
# (ingest's figures include up to 0.5 s of polling after the last insert)
report ingest "$n" "$w" "$(echo "$s1 - $s0" | bc)" "$(echo "$t1 - $t0" | bc)"
for step in seal verify; do
  s0=$(srv_cpu); t0=$(date +%s.%N)
  /usr/bin/time -o "$D/time.txt" -f "%U %S" "$WEFT" audit "$step" >"$D/$step.txt" || true
  t1=$(date +%s.%N); s1=$(srv_cpu)
  read -r u s <"$D/time.txt"
  report "$step" "$n" "$(echo "$u + $s" | bc)" "$(echo "$s1 - $s0" | bc)" "$(echo "$t1 - $t0" | bc)"
done
cat "$D/seal.txt"; tail -2 "$D/verify.txt"

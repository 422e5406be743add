#!/usr/bin/env bash
# Soak: publish N simulated events (weft simulate --publish) into a fresh database at RATE
# events/s (0: as fast as the publisher goes) while `weft ingest` runs with its defaults,
# sample its resident memory every 3 s, and print the narrative graph's and the dedup
# state's counters once ingest has caught up, with the peak RSS of the first and the second
# half of the run (a flat curve has them within 10%). Then measure a restart: the time from
# `weft ingest` start until a newly published request's narrative is queryable (new topics,
# same database, so every narrative table is full).
#
#   cargo build --release --bin weft && bash deploy/local/stack.sh up &&
#     N=10000000 RATE=10000 bash bench/soak/run.sh
#
# Figures of a run are in docs/NARRATIVES.md ("Measured"). The RSS curve is written to
# $OUT/rss.txt as "unix-seconds kB".
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO"
source "${WEFT_RUN_DIR:-$REPO/.weft/run}/env"
W=${WEFT:-$REPO/target/release/weft}
N=${N:-2000000}
RATE=${RATE:-0}
INGEST_ARGS=${INGEST_ARGS:-}   # extra `weft ingest` flags, to compare settings
DB=${DB:-soak_$(date +%s)}
OUT=${OUT:-$REPO/.weft/run/soak/$DB}
LISTEN=${LISTEN:-127.0.0.1:18790}
mkdir -p "$OUT"
export WEFT_CLICKHOUSE_DATABASE=$DB RUST_LOG=${RUST_LOG:-info}
q() { curl -s "$WEFT_CLICKHOUSE_URL/?database=$DB" --data-binary "$1"; }

WEFT_TOPIC_PREFIX=$DB. "$W" migrate >/dev/null
# shellcheck disable=SC2086
WEFT_TOPIC_PREFIX=$DB. "$W" ingest --listen "$LISTEN" --group "$DB" $INGEST_ARGS >"$OUT/ingest.log" 2>&1 &
IP=$!
(while kill -0 $IP 2>/dev/null; do
  echo "$(date +%s) $(awk '/VmRSS/{print $2}' /proc/$IP/status 2>/dev/null)"
  sleep 3
done) >"$OUT/rss.txt" &
T_PUB=$(date +%s)
WEFT_TOPIC_PREFIX=$DB. "$W" simulate --events "$N" --seed 8 --shuffle --no-request-id 0.2 \
  --publish --rate "$RATE" --out "$OUT/events.jsonl" >"$OUT/simulate.log" 2>&1
echo "published $N events in $(($(date +%s) - T_PUB)) s (rate asked: $RATE/s; 0 = unpaced)"
prev=-1
while true; do
  c=$(q "SELECT count() FROM weft_events")
  [ "$c" = "$prev" ] && break
  prev=$c
  sleep 10
done
echo "stored $c facts"
curl -s "http://$LISTEN/metrics" | grep -E "^weft_narrative_(graph_nodes|evicted_nodes_total|loaded_nodes_total|ids_spared_total)|^weft_ingest_dedup_checked_total"
kill -TERM $IP && wait $IP || true
python3 - "$OUT/rss.txt" <<'PY'
import sys
rows = [l.split() for l in open(sys.argv[1])]
kb = [int(r[1]) for r in rows if len(r) == 2]
half = len(kb) // 2
first, second = max(kb[:half]), max(kb[half:])
print(f"RSS samples {len(kb)} (every 3 s): peak {max(kb) / 1024:.0f} MB, "
      f"first half {first / 1024:.0f} MB, second half {second / 1024:.0f} MB "
      f"({(second - first) / first * 100:+.1f}%), at the end {kb[-1] / 1024:.0f} MB")
PY

# Restart: a new request on new topics of the same database.
export WEFT_TOPIC_PREFIX=$DB.restart.
"$W" simulate --events 30 --seed 99 --out "$OUT/new.jsonl" >/dev/null 2>&1
REQ=$(head -1 "$OUT/new.jsonl" | python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["request_id"])')
T0=$(date +%s.%N)
# shellcheck disable=SC2086
"$W" ingest --listen "$LISTEN" --group "$DB.restart" $INGEST_ARGS >"$OUT/ingest-restart.log" 2>&1 &
IP=$!
"$W" publish "$OUT/new.jsonl" >/dev/null 2>&1
until [ "$(q "SELECT count() FROM weft_narrative_nodes WHERE narrative_id = '$REQ'")" -gt 0 ]; do
  sleep 0.2
done
T1=$(date +%s.%N)
python3 -c "print(f'restart: $REQ queryable {$T1-$T0:.1f} s after weft ingest started')"
# The id filter is rebuilt in the background; say how long that took.
for _ in $(seq 600); do grep -q 'narrative id filter loaded' "$OUT/ingest-restart.log" && break; sleep 0.5; done
grep -m1 'narrative id filter loaded' "$OUT/ingest-restart.log" | sed 's/\x1b\[[0-9;]*m//g' || echo "id filter not loaded after 300 s"
kill -TERM $IP && wait $IP || true

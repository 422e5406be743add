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
# "Caught up" means every distinct event the simulator made (its `distinct_events`) is stored
# in weft_events. The run fails (non-zero, naming the logs in $OUT) when ingest exits, when
# the stored count stops growing for STALL_SECS before that, when the restarted ingest does
# not make the new request queryable within RESTART_TIMEOUT seconds, when a ClickHouse query
# fails, or when a weft command fails; ingest and the RSS sampler are stopped on every exit.
#
# Figures of a run are in docs/NARRATIVES.md ("Measured"). The RSS curve is written to
# $OUT/rss.txt as "unix-seconds kB".
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO"
# shellcheck disable=SC1091
source "${WEFT_RUN_DIR:-$REPO/.weft/run}/env"
W=${WEFT:-$REPO/target/release/weft}
N=${N:-2000000}
RATE=${RATE:-0}
INGEST_ARGS=${INGEST_ARGS:-}   # extra `weft ingest` flags, to compare settings
DB=${DB:-soak_$(date +%s)}
OUT=${OUT:-$REPO/.weft/run/soak/$DB}
LISTEN=${LISTEN:-127.0.0.1:18790}
STALL_SECS=${STALL_SECS:-300}           # catching up fails when the count is flat this long
RESTART_TIMEOUT=${RESTART_TIMEOUT:-300} # seconds for the restart's request to be queryable
for v in N STALL_SECS RESTART_TIMEOUT; do
  [[ ${!v} =~ ^[0-9]+$ ]] || { echo "soak: $v must be a whole number, got '${!v}'" >&2; exit 2; }
done
mkdir -p "$OUT"
export WEFT_CLICKHOUSE_DATABASE=$DB RUST_LOG=${RUST_LOG:-info}

INGEST_PID='' SAMPLER_PID=''
die() {
  echo "soak: FAILED: $*" >&2
  echo "soak: logs in $OUT" >&2
  exit 1
}
# Stop what this script started, however it ends: ingest gets SIGTERM, and the sampler
# ends on its own within 3 s of ingest (so its `sleep` is not left behind).
cleanup() {
  local rc=$?
  if [ -n "$INGEST_PID" ] && kill -0 "$INGEST_PID" 2>/dev/null; then
    kill -TERM "$INGEST_PID" || echo "soak: could not signal weft ingest ($INGEST_PID)" >&2
  fi
  # Their exit statuses are checked where the run ends normally (stop_ingest); here the run
  # has already failed, and only the processes must not outlive it.
  for p in $INGEST_PID $SAMPLER_PID; do
    wait "$p" 2>/dev/null || echo "soak: pid $p exited with status $? while stopping" >&2
  done
  if [ "$rc" -ne 0 ]; then
    echo "soak: exit $rc; logs in $OUT" >&2
  fi
}
trap cleanup EXIT

# A ClickHouse query; fails (and so ends the run) on an HTTP error instead of reading the
# error body as a result.
q() { curl -fsS "$WEFT_CLICKHOUSE_URL/?database=$DB" --data-binary "$1"; }
# A count from ClickHouse, checked to be one.
count() {
  local c
  c=$(q "$1") || die "ClickHouse query failed: $1"
  [[ $c =~ ^[0-9]+$ ]] || die "ClickHouse answered '$c' to: $1"
  echo "$c"
}
# Stop ingest with SIGTERM and require a clean exit.
stop_ingest() {
  local log=$1 rc=0
  kill -0 "$INGEST_PID" 2>/dev/null || { wait "$INGEST_PID" || rc=$?; INGEST_PID=''; die "weft ingest had already exited (status $rc); see $log"; }
  kill -TERM "$INGEST_PID"
  wait "$INGEST_PID" || rc=$?
  INGEST_PID=''
  [ "$rc" -eq 0 ] || die "weft ingest exited with status $rc after SIGTERM; see $log"
}

WEFT_TOPIC_PREFIX=$DB. "$W" migrate >"$OUT/migrate.log" 2>&1 || die "weft migrate failed; see $OUT/migrate.log"
# shellcheck disable=SC2086
WEFT_TOPIC_PREFIX=$DB. "$W" ingest --listen "$LISTEN" --group "$DB" $INGEST_ARGS >"$OUT/ingest.log" 2>&1 &
INGEST_PID=$!
(while kill -0 "$INGEST_PID" 2>/dev/null; do
  echo "$(date +%s) $(awk '/VmRSS/{print $2}' "/proc/$INGEST_PID/status" 2>/dev/null)"
  sleep 3
done) >"$OUT/rss.txt" &
SAMPLER_PID=$!
T_PUB=$(date +%s)
# JSON logs, so the simulator's totals ("simulation done") can be read back exactly.
WEFT_TOPIC_PREFIX=$DB. RUST_LOG=info "$W" --log-format json simulate --events "$N" --seed 8 \
  --shuffle --no-request-id 0.2 --publish --rate "$RATE" --spool-dir "$OUT/spool" \
  --out "$OUT/events.jsonl" >"$OUT/simulate.log" 2>&1 ||
  die "weft simulate --publish failed; see $OUT/simulate.log"
echo "published $N events in $(($(date +%s) - T_PUB)) s (rate asked: $RATE/s; 0 = unpaced)"
# Distinct facts to store, and how the envelopes fared, from the simulator's own report.
totals=$(python3 - "$OUT/simulate.log" <<'PY'
import json, re, sys
distinct = spooled = None
for line in open(sys.argv[1]):
    m = re.match(r"\d+ envelopes: \d+ published to Kafka, (\d+) spooled, \d+ rejected", line)
    if m:
        spooled = int(m.group(1))
        continue
    try:
        rec = json.loads(line)
    except ValueError:
        continue
    f = rec.get("fields", {})
    if f.get("message") == "simulation done":
        distinct = f["distinct_events"]
if distinct is None or spooled is None:
    sys.exit("no 'simulation done' totals or publish summary in " + sys.argv[1])
print(distinct, spooled)
PY
) || die "could not read the simulator's totals from $OUT/simulate.log"
read -r DISTINCT SPOOLED <<<"$totals"
[[ ${DISTINCT:-} =~ ^[0-9]+$ && ${SPOOLED:-} =~ ^[0-9]+$ ]] ||
  die "could not read the simulator's totals from $OUT/simulate.log"
[ "$SPOOLED" -eq 0 ] ||
  die "$SPOOLED events were spooled, not delivered (was Kafka reachable?); they wait in $OUT/spool"

# Caught up: every distinct event stored, while ingest runs and the count keeps moving.
c=0 prev=-1 moved=$SECONDS
while true; do
  kill -0 "$INGEST_PID" 2>/dev/null || die "weft ingest exited while catching up ($c of $DISTINCT stored); see $OUT/ingest.log"
  c=$(count "SELECT count() FROM weft_events")
  [ "$c" -ge "$DISTINCT" ] && break
  if [ "$c" != "$prev" ]; then
    prev=$c moved=$SECONDS
  elif [ $((SECONDS - moved)) -ge "$STALL_SECS" ]; then
    die "ingest stalled: $c of $DISTINCT distinct events stored, no progress for $STALL_SECS s; see $OUT/ingest.log"
  fi
  sleep 2
done
echo "stored $c facts ($DISTINCT distinct events simulated)"
curl -fsS "http://$LISTEN/metrics" | grep -E "^weft_narrative_(graph_nodes|evicted_nodes_total|loaded_nodes_total|ids_spared_total)|^weft_ingest_dedup_checked_total" ||
  die "could not read the counters from http://$LISTEN/metrics"
stop_ingest "$OUT/ingest.log"
wait "$SAMPLER_PID" || die "the RSS sampler failed"
SAMPLER_PID=''
python3 - "$OUT/rss.txt" <<'PY'
import sys
rows = [l.split() for l in open(sys.argv[1])]
kb = [int(r[1]) for r in rows if len(r) == 2]
if len(kb) < 2:
    print(f"RSS samples {len(kb)} (every 3 s): too few for two halves; the run was too short")
    sys.exit(0)
half = len(kb) // 2
first, second = max(kb[:half]), max(kb[half:])
print(f"RSS samples {len(kb)} (every 3 s): peak {max(kb) / 1024:.0f} MB, "
      f"first half {first / 1024:.0f} MB, second half {second / 1024:.0f} MB "
      f"({(second - first) / first * 100:+.1f}%), at the end {kb[-1] / 1024:.0f} MB")
PY

# Restart: a new request on new topics of the same database.
export WEFT_TOPIC_PREFIX=$DB.restart.
"$W" simulate --events 30 --seed 99 --out "$OUT/new.jsonl" >"$OUT/simulate-restart.log" 2>&1 ||
  die "weft simulate (restart request) failed; see $OUT/simulate-restart.log"
REQ=$(head -1 "$OUT/new.jsonl" | python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["request_id"])')
T0=$(date +%s.%N)
# shellcheck disable=SC2086
"$W" ingest --listen "$LISTEN" --group "$DB.restart" $INGEST_ARGS >"$OUT/ingest-restart.log" 2>&1 &
INGEST_PID=$!
"$W" publish "$OUT/new.jsonl" --spool-dir "$OUT/spool" >"$OUT/publish-restart.log" 2>&1 ||
  die "weft publish (restart request) failed; see $OUT/publish-restart.log"
deadline=$((SECONDS + RESTART_TIMEOUT))
while true; do
  n=$(count "SELECT count() FROM weft_narrative_nodes WHERE narrative_id = '$REQ'")
  [ "$n" -gt 0 ] && break
  kill -0 "$INGEST_PID" 2>/dev/null || die "the restarted weft ingest exited before $REQ was queryable; see $OUT/ingest-restart.log"
  [ "$SECONDS" -lt "$deadline" ] || die "$REQ not queryable $RESTART_TIMEOUT s after the restart; see $OUT/ingest-restart.log"
  sleep 0.2
done
T1=$(date +%s.%N)
python3 -c "print(f'restart: $REQ queryable {$T1-$T0:.1f} s after weft ingest started')"
# The id filter is rebuilt in the background; say how long that took.
for _ in $(seq 600); do grep -q 'narrative id filter loaded' "$OUT/ingest-restart.log" && break; sleep 0.5; done
if line=$(grep -m1 'narrative id filter loaded' "$OUT/ingest-restart.log"); then
  sed 's/\x1b\[[0-9;]*m//g' <<<"$line"
else
  echo "id filter not loaded after 300 s"
fi
stop_ingest "$OUT/ingest-restart.log"

#!/usr/bin/env bash
# Build the 10M-event set of docs/AUDIT.md ("Speed") and time `weft audit check` over it.
# 400 simulated flows with every violation injected (through Kafka and ingest), I-06
# `token_unknown` included, then copied COPIES times inside ClickHouse with every id and
# reference suffixed `~n`. Prints the findings per rule, and fails unless the check finds
# every injected unknown token in every copy.
# Needs the local stack (deploy/local/stack.sh up); not part of test.sh (minutes, not seconds).
#   WEFT=target/debug/weft COPIES=1142 REPS=3 bash deploy/local/audit-bench.sh
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
WEFT=${WEFT:-target/debug/weft}
COPIES=${COPIES:-1142}
RUN=${WEFT_RUN_DIR:-$REPO/.weft/run} # the stack's run folder, as in stack.sh
source "$RUN/env"
DB=${AUDIT_BENCH_DB:-weft_audit_bench}
export WEFT_CLICKHOUSE_DATABASE=$DB WEFT_TOPIC_PREFIX=$DB. RUST_LOG=warn
D=$RUN/$DB; mkdir -p "$D"
ch() { curl -sfS "$WEFT_CLICKHOUSE_URL/?database=$DB" --data-binary "$1"; }
curl -sfS "$WEFT_CLICKHOUSE_URL/" --data-binary "CREATE DATABASE IF NOT EXISTS $DB"
if [ "$(ch 'SELECT count() FROM weft_events' 2>/dev/null || echo 0)" = 0 ]; then
  "$WEFT" migrate
  "$WEFT" simulate --flows 400 --seed 606 --shuffle --no-request-id 0.1 --duplicates 0.05 --deny 0.05 \
    --partial 0.05 --failure 0.05 --expired-token 0.06 --reused-token 0.06 --out-of-scope 0.06 \
    --unauthorized 0.1 --raw-output 0.06 --orphan 0.06 --id-conflict 0.06 --unknown-token 0.06 \
    --out "$D/events.jsonl" --truth "$D/truth.json"
  "$WEFT" publish "$D/events.jsonl" --drain-spool --message-timeout-ms 300000 \
    --topic-prefix "$DB." --spool-dir "$D/spool"
  "$WEFT" ingest --listen '' --group "$DB" >"$D/ingest.log" 2>&1 &
  ing=$!
  want=$(python3 -c "import json;print(json.load(open('$D/truth.json'))['totals']['distinct_events'])")
  for _ in $(seq 1 600); do
    n=$(ch "SELECT count() FROM weft_events")
    [ "$n" -ge "$want" ] && break
    sleep 0.5
  done
  kill "$ing"; wait "$ing" || true
  ch "DROP TABLE IF EXISTS tpl"
  ch "CREATE TABLE tpl ENGINE = Memory AS SELECT * FROM weft_events"
  sfx() { echo "if($1 = '', '', concat($1, '~', toString(number)))"; }
  ch "INSERT INTO weft_events SELECT tpl.* REPLACE (
    $(sfx id) AS id, $(sfx request_id) AS request_id, $(sfx token_id) AS token_id,
    $(sfx decision_id) AS decision_id, $(sfx frame_id) AS frame_id, $(sfx handle_id) AS handle_id,
    arrayMap(x -> $(sfx x), handle_refs) AS handle_refs, $(sfx flow_id) AS flow_id,
    arrayMap(l -> (l.1, l.2, $(sfx l.3)), links) AS links)
  FROM tpl CROSS JOIN numbers(1, $COPIES) AS n"
  ch "DROP TABLE tpl"
fi
events=$(ch 'SELECT count() FROM weft_events')
echo "events: $events"
# A set built before the bench injected unknown tokens has none: it must be built again.
unknown=$(python3 -c "import json;print(json.load(open('$D/truth.json'))['totals']['scenarios'].get('unknown_token', 0))")
if [ "$unknown" = 0 ]; then
  echo "the set in $DB has no unknown token (built before --unknown-token): DROP DATABASE $DB and run again" >&2
  exit 1
fi
# CPU seconds of the ClickHouse server (our stack's pid file) and of weft: on a shared machine
# they say more than wall times. REPS runs of the same command.
srv_cpu() {
  local pid
  pid=$(cat "$RUN/clickhouse.pid" 2>/dev/null || true)
  if [ -n "$pid" ] && [ -r "/proc/$pid/stat" ]; then awk '{print ($14+$15)/100}' "/proc/$pid/stat"; else echo 0; fi
}
for _ in $(seq 1 "${REPS:-1}"); do
  s0=$(srv_cpu)
  t0=$(date +%s.%N)
  /usr/bin/time -o "$D/time.txt" -f "%U %S" "$WEFT" audit check --tenant default \
    --from 2026-10-01T00:00:00Z --to 2026-12-31T00:00:00Z --grace-secs 0 --format json >"$D/check.json"
  t1=$(date +%s.%N)
  s1=$(srv_cpu)
  python3 -c "
import json; r = json.load(open('$D/check.json')); u, s = open('$D/time.txt').read().split()
import collections, sys
rules = collections.Counter(f['rule'] for f in r['findings'])
print('wall %.2f s; elapsed_ms %d; weft cpu %.2f s; clickhouse cpu %.2f s; load %s; timings_ms %s; findings %d' % (
    $t1 - $t0, r['elapsed_ms'], float(u) + float(s), $s1 - $s0, open('/proc/loadavg').read().split()[0],
    r['timings_ms'], len(r['findings'])))
print('findings per rule: %s' % dict(sorted(rules.items())))
# Each injected unknown token is one finding, in the template and in every copy (its id is
# suffixed like every other); the set holds the template's facts (1 + COPIES) times.
t = json.load(open('$D/truth.json'))['totals']
copies = $events // t['distinct_events']
want = $unknown * copies
print('token_unknown: %d found, %d injected x %d copies = %d' % (rules['token_unknown'], $unknown, copies, want))
if rules['token_unknown'] != want:
    sys.exit('token_unknown: found %d, want %d' % (rules['token_unknown'], want))"
done

#!/usr/bin/env bash
# Merge width: what a MergeTree setting does to the merges of one of weft's tables.
#
# Copies the rows of TABLE from a kept bench database into fresh copies of the table (one
# per VARIANT, each with its own settings), ROUNDS times over, in 20k-row inserts 0.3 s apart
# (ingest's flush size), waits until no merge has run for 5 s, and prints the merge CPU, the
# rows merged and the active parts of each copy. Needs `system.part_log` and
# `system.query_log`: start the stack with WEFT_CH_PROFILE=1.
#
#   weft bench ingest --events 1000000 --kafka-engine none --keep --json   # note "database"
#   bash bench/merge-width/run.sh DATABASE weft_events 3 \
#        default:default base10:merge_selector_base=10 base20:merge_selector_base=20
#
# A VARIANT is NAME:SETTING (`ALTER TABLE ... MODIFY SETTING SETTING`), or NAME:default.
# Figures of a run: docs/BENCHMARKS.md, "Merge width". The copies go to database `mx`.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
source "${WEFT_RUN_DIR:-$REPO/.weft/run}/env"
[ $# -ge 4 ] || { sed -n '2,16p' "$0"; exit 2; }
DB=$1 T=$2 ROUNDS=$3
shift 3
q() { curl -fsS "$WEFT_CLICKHOUSE_URL" --data-binary "$1"; }
q "CREATE DATABASE IF NOT EXISTS mx"
q "DROP TABLE IF EXISTS mx.src_$T"
q "CREATE TABLE mx.src_$T ENGINE = MergeTree ORDER BY n AS SELECT rowNumberInAllBlocks() AS n, * FROM $DB.$T"
N=$(q "SELECT count() FROM mx.src_$T")
for V in "$@"; do
  name=${V%%:*} setting=${V#*:} copy="${T}_$name"
  q "DROP TABLE IF EXISTS mx.$copy"
  q "CREATE TABLE mx.$copy AS $DB.$T"
  [ "$setting" = default ] || q "ALTER TABLE mx.$copy MODIFY SETTING $setting"
  start=$(q "SELECT now()")
  for _ in $(seq 1 "$ROUNDS"); do
    for ((k = 0; k < N; k += 20000)); do
      q "INSERT INTO mx.$copy SELECT * EXCEPT n FROM mx.src_$T WHERE n >= $k AND n < $((k + 20000))"
      sleep 0.3
    done
  done
  quiet=0
  while [ $quiet -lt 5 ]; do
    if [ "$(q "SELECT count() FROM system.merges WHERE database = 'mx' AND table = '$copy'")" = 0 ]; then
      quiet=$((quiet + 1))
    else
      quiet=0
    fi
    sleep 1
  done
  q "SYSTEM FLUSH LOGS"
  merges=$(q "SELECT round(sum(ProfileEvents['UserTimeMicroseconds'] + ProfileEvents['SystemTimeMicroseconds']) / 1e6, 2), sum(read_rows), count() FROM system.part_log WHERE database = 'mx' AND table = '$copy' AND event_type = 'MergeParts' AND event_time >= '$start' FORMAT CSV")
  inserts=$(q "SELECT round(sum(ProfileEvents['UserTimeMicroseconds'] + ProfileEvents['SystemTimeMicroseconds']) / 1e6, 2) FROM system.query_log WHERE type = 'QueryFinish' AND query_kind = 'Insert' AND has(tables, 'mx.$copy') AND event_time >= '$start'")
  parts=$(q "SELECT count() FROM system.parts WHERE database = 'mx' AND table = '$copy' AND active")
  echo "$T $name: rows $((N * ROUNDS)); merges (CPU-s, rows merged, merges) $merges; insert CPU-s $inserts; active parts $parts"
done
q "DROP DATABASE mx"

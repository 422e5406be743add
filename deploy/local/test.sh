#!/usr/bin/env bash
# The README's test command: every check weft has, on the real local stack.
#
#   bash deploy/local/test.sh
#
# It installs what a fresh machine lacks and starts the stack (deploy/local/stack.sh), runs
# the format and lint gates, the unit and integration tests (which talk to the real broker
# and ClickHouse), then the fault-injection tests that stop and start services, one at a time.
# A stack it started is stopped again on exit; one that was already running is left alone.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO"
STACK="bash deploy/local/stack.sh"
t0=$EPOCHREALTIME
step() { printf '\n==> %s (t+%.0fs)\n' "$*" "$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN{print b-a}')"; }

# The debug build, the stack's data and the tests' temp folders need disk space; CI machines
# share their disk, so a shortage is named here rather than by a failing compiler or cp.
# A fresh CI run (no incremental build state: it would only be written, never reused) took
# 6.3 GB in all: target 4.4, fuzz/target 1.4, the stack's data 0.5.
if [ "${CI:-}" = true ]; then export CARGO_INCREMENTAL=0; fi
need_gib=8
free_gib=$(df -Pk "$REPO" | awk 'NR==2 { printf "%d", $4 / 1048576 }')
if [ "$free_gib" -lt "$need_gib" ]; then
  echo "[disk] warning: $free_gib GiB free under $REPO; a full run needs about $need_gib GiB" >&2
fi

started_here=0
if ! $STACK status >/dev/null 2>&1; then
  started_here=1
fi
cleanup() { if [ "$started_here" = 1 ]; then $STACK down || true; fi; }
trap cleanup EXIT

step "local stack"
# The main suite runs on the broker's in-memory log: it is fast, and those tests read each
# partition once, from offset 0. Tests that resume a consumer (restarts) run on the sqlite
# log below, because tansu's memory engine skips records when a fetch starts
# inside a record batch (deploy/local/README.md, Known limits).
WEFT_KAFKA_STORAGE=memory $STACK up
# shellcheck disable=SC1091
source "${WEFT_RUN_DIR:-$REPO/.weft/run}/env"

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

step "unit and integration tests"
# Fault tests stop shared services, so they run afterwards, alone (see below).
cargo test --workspace --no-fail-fast -- --skip fault_

step "SIGKILL of ingest on the memory log (100k events; its seeks back and copies)"
# tansu's memory engine answers a fetch that starts inside a record batch from the next batch,
# and after seeks back it delivers some records again: ingest seeks back and drops the copies
# (consumers/src/ingest/resume.rs), and stays exact through 11 SIGKILLs on it too.
WEFT_FAULT_EVENTS=100000 cargo test --test fault_ingest repeated_sigkill -- --test-threads=1

step "fault-injection and consumer-resume tests (sqlite log; services stopped and restarted; one at a time)"
$STACK stop kafka
WEFT_KAFKA_STORAGE=sqlite $STACK start kafka
# SIGKILL of ingest (11 times) during a large ingest, and a 30 s ClickHouse outage. The
# SIGKILL run uses 200k events here to fit CI's time on 2 cores in a debug build (each restart
# starts a narrative graph of at most 2,000 nodes that loads on demand); WEFT_FAULT_EVENTS=1000000
# runs the issue's full size.
WEFT_FAULT_EVENTS=${WEFT_FAULT_EVENTS:-200000} cargo test --test fault_ingest -- --test-threads=1
cargo test --test fault_broker -- --test-threads=1
# A proxy in front of ClickHouse spoils one facts insert: its reply lost after it landed (it
# is not sent again), or its body cut (it is sent again whole); stored exactly once.
cargo test --test fault_lost_reply -- --test-threads=1
# A restart after dead letters sends none of them again (it resumes caught up: sqlite log).
cargo test --test ingest_poison fault_ -- --test-threads=1
# The stack's supervisor restarts a SIGKILLed broker; the spool drains; stored exactly once.
cargo test --test fault_supervisor -- --test-threads=1
# Scale-out: two facts members share the partitions; one leaves, the other takes over.
cargo test --test ingest_scale_out -- --test-threads=1
# Two narrative shards (--narrative-shard 0/2, 1/2) share the tenants; one is SIGKILLed
# half-way and restarted (it resumes mid-partition, hence the sqlite log); exact.
cargo test --test narrative_shards -- --test-threads=1

step "fuzz targets, 30 s each (docs/FUZZING.md)"
# The fuzz build (its own flags, its own target folder) needs about 1.5 GB more. In CI
# nothing uses the debug build after this point, so it goes first: a CI run once failed
# here with "No space left on device" on a machine whose shared disk had filled up.
if [ "${CI:-}" = true ]; then
  rm -rf target/debug
  echo "[disk] $(df -Pk "$REPO" | awk 'NR==2 { printf "%.1f", $4 / 1048576 }') GiB free for the fuzz build"
fi
# cargo-fuzz's -s none mode needs no nightly toolchain; install it when missing.
command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked
(
  cd fuzz
  for t in wire_decode envelope_validate gateway_request; do
    cargo fuzz run -s none -O "$t" -- -max_total_time=30
  done
)

step "done"

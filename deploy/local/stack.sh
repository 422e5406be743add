#!/usr/bin/env bash
# The local stack of real services for weft: a Kafka-protocol broker (tansu)
# and ClickHouse (chdb-core served by chdb_server.py, or a `clickhouse`
# binary if one is on PATH), both on 127.0.0.1 only.
#
#   stack.sh up                        install (if needed) and start both, wait until ready
#   stack.sh down                      stop everything this script started
#   stack.sh start kafka|clickhouse    start one service and wait until it is ready
#   stack.sh stop  kafka|clickhouse    stop one service; returns once its ports are free
#   stack.sh restart kafka|clickhouse
#   stack.sh status                    one line per service: each must answer a real request
#                                      (a Kafka metadata request, a ClickHouse query); exit 3
#                                      if any is stopped or not answering
#   stack.sh env                       the export lines to `source` (also in $WEFT_RUN_DIR/env)
#   stack.sh delete-topic ...          refused, with the reason (see below)
#
# Supervisor: `up` / `start kafka` also start a supervisor (supervisor.log) that probes the
# broker every WEFT_SUPERVISE_INTERVAL seconds with a metadata request and restarts it when
# its process died or it stopped answering (tansu's storage task can panic while the process
# keeps listening), up to WEFT_SUPERVISE_MAX_RESTARTS times in a row with doubling backoff;
# `stop kafka` / `down` stop the supervisor first. WEFT_SUPERVISE=0 turns it off.
#
# Topics are never deleted: on tansu 0.6 deleting one topic deletes every topic (and a
# deletion under a fetching consumer has wiped the sqlite store), so weft's scripts and tests
# refuse it; use a fresh topic prefix (WEFT_TOPIC_PREFIX) instead.
#
# Environment (defaults in brackets):
#   WEFT_RUN_DIR        [<repo>/.weft/run]  pid files, logs, data/
#   WEFT_KAFKA_PORT     [19092]
#   WEFT_CH_HTTP_PORT   [18123]
#   WEFT_CH_TCP_PORT    [19000]
#   WEFT_KAFKA_STORAGE  [sqlite]  sqlite (durable) | memory (throughput runs; lost on stop)
#   WEFT_STACK_TIMEOUT  [60]      seconds to wait for a service to answer
#   WEFT_CLICKHOUSE_URL           if set (to another URL than ours) and answering
#                                 /ping, that ClickHouse is used and none is started
#   WEFT_TOOLS_DIR, WEFT_VENV     where install.sh put tansu and chdb-core
#   WEFT_SUPERVISE      [1]       0: no broker supervisor
#   WEFT_SUPERVISE_INTERVAL [2]   seconds between probes
#   WEFT_SUPERVISE_FAILS    [3]   failed probes in a row before a restart
#   WEFT_SUPERVISE_MAX_RESTARTS [5] restarts in a row (without 60 s healthy between) before
#                                 the supervisor gives up and says so
#   WEFT_CH_PROFILE     [0]       1: ClickHouse keeps system.query_log and system.part_log, to
#                                 attribute its CPU to queries, inserts and merges
#                                 (docs/BENCHMARKS.md; for benchmark stacks, not tests)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)

WEFT_RUN_DIR="${WEFT_RUN_DIR:-$REPO/.weft/run}"
WEFT_TOOLS_DIR="${WEFT_TOOLS_DIR:-$HOME/.cache/weft/tools}"
WEFT_VENV="${WEFT_VENV:-$HOME/.cache/weft/venv}"
WEFT_KAFKA_PORT="${WEFT_KAFKA_PORT:-19092}"
WEFT_CH_HTTP_PORT="${WEFT_CH_HTTP_PORT:-18123}"
WEFT_CH_TCP_PORT="${WEFT_CH_TCP_PORT:-19000}"
WEFT_KAFKA_STORAGE="${WEFT_KAFKA_STORAGE:-sqlite}"
WEFT_STACK_TIMEOUT="${WEFT_STACK_TIMEOUT:-60}"
WEFT_SUPERVISE="${WEFT_SUPERVISE:-1}"
WEFT_SUPERVISE_INTERVAL="${WEFT_SUPERVISE_INTERVAL:-2}"
WEFT_SUPERVISE_FAILS="${WEFT_SUPERVISE_FAILS:-3}"
WEFT_SUPERVISE_MAX_RESTARTS="${WEFT_SUPERVISE_MAX_RESTARTS:-5}"
export WEFT_TOOLS_DIR WEFT_VENV # install.sh reads them

TANSU="$WEFT_TOOLS_DIR/bin/tansu"
OUR_CH_URL="http://127.0.0.1:$WEFT_CH_HTTP_PORT"
# How long a stopping service gets after SIGTERM before SIGKILL.
STOP_GRACE=15

log() { printf '[stack] %s\n' "$*" >&2; }
die() { printf '[stack] ERROR: %s\n' "$*" >&2; exit 1; }
elapsed() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }'; }

for v in WEFT_KAFKA_PORT WEFT_CH_HTTP_PORT WEFT_CH_TCP_PORT WEFT_STACK_TIMEOUT \
  WEFT_SUPERVISE_INTERVAL WEFT_SUPERVISE_FAILS WEFT_SUPERVISE_MAX_RESTARTS; do
  [[ ${!v} =~ ^[0-9]+$ ]] || die "$v must be a number, got '${!v}'"
done
case $WEFT_KAFKA_STORAGE in
  # The sqlite path must be RELATIVE: tansu joins it to its cwd (the run
  # folder); an absolute sqlite:///path fails with "Unable to open ...: 14".
  sqlite) KAFKA_STORAGE_URL="sqlite://data/kafka/tansu.db" ;;
  # tansu's own default engine URL; the host part names the in-memory store.
  memory) KAFKA_STORAGE_URL="memory://tansu/" ;;
  *) die "WEFT_KAFKA_STORAGE must be sqlite or memory, got '$WEFT_KAFKA_STORAGE'" ;;
esac

mkdir -p "$WEFT_RUN_DIR"
WEFT_RUN_DIR=$(cd "$WEFT_RUN_DIR" && pwd) # absolute, for the env file

# --- helpers ----------------------------------------------------------------

pidfile() { printf '%s/%s.pid\n' "$WEFT_RUN_DIR" "$1"; }
logfile() { printf '%s/%s.log\n' "$WEFT_RUN_DIR" "$1"; }

# What a live process of ours has in its command line: guards against a
# stale pid file whose pid now belongs to something else.
cmd_marker() {
  case $1 in
    kafka) printf '%s\n' 'tansu broker' ;;
    clickhouse) printf '%s\n' 'chdb_server\.py|clickhouse server' ;;
    supervisor) printf '%s\n' 'stack\.sh __supervise' ;;
  esac
}

# Prints the pid of our running service, or fails.
service_pid() {
  local f pid cmd
  f=$(pidfile "$1")
  [[ -f $f ]] || return 1
  pid=$(<"$f")
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  cmd=$({ tr '\0' ' ' <"/proc/$pid/cmdline"; } 2>/dev/null) || return 1
  [[ -n $cmd ]] || return 1 # a zombie has an empty cmdline
  grep -Eq "$(cmd_marker "$1")" <<<"$cmd" || return 1
  printf '%s\n' "$pid"
}

service_ports() {
  case $1 in
    kafka) printf '%s\n' "$WEFT_KAFKA_PORT" ;;
    clickhouse) printf '%s %s\n' "$WEFT_CH_HTTP_PORT" "$WEFT_CH_TCP_PORT" ;;
    supervisor) ;;
  esac
}

# Does anything accept TCP connections on 127.0.0.1:$1?
port_accepts() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Who listens on port $1, on any address (a 0.0.0.0 listener blocks a
# 127.0.0.1 bind too). Empty when nobody does.
port_listeners() {
  if command -v ss >/dev/null 2>&1; then
    ss -Hltnp "sport = :$1" 2>/dev/null || true
  elif port_accepts "$1"; then
    printf 'something accepts connections on 127.0.0.1:%s\n' "$1"
  fi
}

# Does the process $2 itself listen on port $1? Without ss, accept a connect.
port_owned_by() {
  if command -v ss >/dev/null 2>&1; then
    ss -Hltnp "sport = :$1" 2>/dev/null | grep -q "pid=$2,"
  else
    port_accepts "$1"
  fi
}

# A ClickHouse given by the user (WEFT_CLICKHOUSE_URL naming another server
# than the one this script runs) is used as is and never started or stopped.
ch_external() {
  [[ -n ${WEFT_CLICKHOUSE_URL:-} ]] || return 1
  case ${WEFT_CLICKHOUSE_URL%/} in
    "$OUR_CH_URL" | "http://localhost:$WEFT_CH_HTTP_PORT") return 1 ;;
  esac
  return 0
}
ch_url() { if ch_external; then printf '%s\n' "${WEFT_CLICKHOUSE_URL%/}"; else printf '%s\n' "$OUR_CH_URL"; fi; }

ch_answers() {
  local url=$1 pong one
  pong=$(curl -sf --max-time 2 "$url/ping" 2>/dev/null) || return 1
  [[ $pong == "Ok." ]] || return 1
  one=$(curl -sf --max-time 5 "$url/" --data-binary 'SELECT 1' 2>/dev/null) || return 1
  [[ $one == "1" ]]
}

# Does the broker answer a real Kafka request (a metadata request), not just a connect?
kafka_answers() { python3 "$HERE/kafka_probe.py" "$WEFT_KAFKA_PORT" "${1:-5}" >/dev/null 2>&1; }

# Is service $1 (whose pid is $2) answering?
ready() {
  case $1 in
    kafka) port_owned_by "$WEFT_KAFKA_PORT" "$2" && kafka_answers ;;
    clickhouse)
      port_owned_by "$WEFT_CH_HTTP_PORT" "$2" && port_owned_by "$WEFT_CH_TCP_PORT" "$2" \
        && port_accepts "$WEFT_CH_TCP_PORT" && ch_answers "$OUR_CH_URL"
      ;;
  esac
}

# The failure that the service logged since byte offset $2, if any.
logged_failure() {
  local out
  out=$(tail -c +"$(($2 + 1))" "$(logfile "$1")" 2>/dev/null) || return 1
  case $1 in
    clickhouse)
      # The engine reports these on stderr only, and a listener error does
      # not always end the process at once.
      if grep -q 'Code: 210' <<<"$out"; then
        printf 'ClickHouse could not listen (Code 210, address in use): %s\n' \
          "$(grep -m1 -o 'Listen \[[^]]*\]:[0-9]*' <<<"$out" || echo "port $WEFT_CH_HTTP_PORT/$WEFT_CH_TCP_PORT")"
        return 0
      fi
      if grep -q 'Code: 76' <<<"$out"; then
        printf 'ClickHouse data folder is locked by another server (Code 76): %s\n' "$WEFT_RUN_DIR/data/clickhouse"
        return 0
      fi
      ;;
    kafka)
      if grep -qi 'address already in use\|AddrInUse' <<<"$out"; then
        printf 'tansu could not listen: 127.0.0.1:%s is in use\n' "$WEFT_KAFKA_PORT"
        return 0
      fi
      ;;
  esac
  return 1
}

show_log_tail() {
  log "last 20 lines of $(logfile "$1"):"
  tail -n 20 "$(logfile "$1")" >&2 || true
}

# SIGTERM, wait for the pid to go (tansu takes ~2 s), SIGKILL after
# STOP_GRACE seconds; then wait until its ports are free, so a restart on
# the same port cannot race the old listener.
stop_pid() {
  local name=$1 pid=$2 deadline port
  kill -TERM "$pid" 2>/dev/null || true
  deadline=$((SECONDS + STOP_GRACE))
  while kill -0 "$pid" 2>/dev/null; do
    if ((SECONDS >= deadline)); then
      log "$name (pid $pid) still alive ${STOP_GRACE} s after SIGTERM: SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      deadline=$((SECONDS + 10))
      while kill -0 "$pid" 2>/dev/null; do
        ((SECONDS < deadline)) || die "$name (pid $pid) survived SIGKILL"
        sleep 0.1
      done
      break
    fi
    sleep 0.1
  done
  for port in $(service_ports "$name"); do
    deadline=$((SECONDS + 10))
    while [[ -n $(port_listeners "$port") ]]; do
      ((SECONDS < deadline)) || die "$name stopped but port $port is still taken: $(port_listeners "$port")"
      sleep 0.1
    done
  done
}

# --- per-service start/stop -------------------------------------------------------

launch_kafka() {
  mkdir -p "$WEFT_RUN_DIR/data/kafka"
  [[ -x $TANSU ]] || die "no tansu at $TANSU: run deploy/local/install.sh"
  # cwd = run folder, because the sqlite path is resolved against it. The
  # unset variables would otherwise switch on tansu features from the
  # caller's environment (OTLP export, schema registry, data lake);
  # NO_COLOR keeps ANSI colour codes out of the log file.
  (
    cd "$WEFT_RUN_DIR"
    exec env -u OTEL_EXPORTER_OTLP_ENDPOINT -u SCHEMA_REGISTRY -u DATA_LAKE NO_COLOR=1 \
      setsid "$TANSU" broker \
      --listener-url "tcp://127.0.0.1:$WEFT_KAFKA_PORT" \
      --advertised-listener-url "tcp://127.0.0.1:$WEFT_KAFKA_PORT" \
      --storage-engine "$KAFKA_STORAGE_URL" \
      </dev/null >>"$(logfile kafka)" 2>&1
  ) &
  LAUNCHED_PID=$!
}

launch_clickhouse() {
  local data="$WEFT_RUN_DIR/data/clickhouse" cwd="$WEFT_RUN_DIR/clickhouse"
  mkdir -p "$data" "$cwd"
  if command -v clickhouse >/dev/null 2>&1; then
    # A real server: its own config, same ports and data folder layout.
    # Users are declared inline (as in ClickHouse's embedded config), and
    # only loopback may log in since the default user has no password.
    cat >"$cwd/server-config.xml" <<EOF
<clickhouse>
  <logger><level>warning</level><console>true</console></logger>
  <listen_host>127.0.0.1</listen_host>
  <http_port>$WEFT_CH_HTTP_PORT</http_port>
  <tcp_port>$WEFT_CH_TCP_PORT</tcp_port>
  <path>$data/</path>
  <send_crash_reports><enabled>false</enabled></send_crash_reports>
  <users>
    <default>
      <password></password>
      <networks><ip>127.0.0.1</ip><ip>::1</ip></networks>
      <profile>default</profile>
      <quota>default</quota>
      <access_management>1</access_management>
    </default>
  </users>
  <profiles><default/></profiles>
  <quotas><default/></quotas>
</clickhouse>
EOF
    (
      cd "$cwd"
      # No watchdog: the pid we record must be the server itself.
      exec env CLICKHOUSE_WATCHDOG_ENABLE=0 setsid clickhouse server \
        --config-file="$cwd/server-config.xml" </dev/null >>"$(logfile clickhouse)" 2>&1
    ) &
  else
    local py="$WEFT_VENV/bin/python"
    [[ -x $py ]] || die "no venv at $WEFT_VENV: run deploy/local/install.sh"
    (
      exec setsid "$py" "$HERE/chdb_server.py" \
        --http-port "$WEFT_CH_HTTP_PORT" --tcp-port "$WEFT_CH_TCP_PORT" \
        --data-dir "$data" --run-dir "$cwd" --venv "$WEFT_VENV" \
        </dev/null >>"$(logfile clickhouse)" 2>&1
    ) &
  fi
  LAUNCHED_PID=$!
}

start_service() {
  local name=$1 pid port owner offset t0 deadline why
  if [[ $name == clickhouse ]] && ch_external; then
    ch_answers "${WEFT_CLICKHOUSE_URL%/}" \
      || die "WEFT_CLICKHOUSE_URL=$WEFT_CLICKHOUSE_URL does not answer /ping and SELECT 1 (unset it to run the local ClickHouse)"
    log "clickhouse: using WEFT_CLICKHOUSE_URL=$WEFT_CLICKHOUSE_URL (not started by stack.sh)"
    return 0
  fi

  t0=$EPOCHREALTIME
  if pid=$(service_pid "$name"); then
    # Already ours: leave it alone, but make sure it does answer.
    log "$name: already running (pid $pid)"
    if [[ $name == kafka ]] && [[ $(kafka_running_url "$pid") != "$KAFKA_STORAGE_URL" ]]; then
      log "WARNING: kafka runs with $(kafka_running_url "$pid"), not $KAFKA_STORAGE_URL (WEFT_KAFKA_STORAGE=$WEFT_KAFKA_STORAGE): 'stack.sh restart kafka' to switch"
    fi
  else
    rm -f "$(pidfile "$name")"
    for port in $(service_ports "$name"); do
      owner=$(port_listeners "$port")
      [[ -z $owner ]] || die "$name: port $port is already taken by another process: $(tr -s ' ' <<<"$owner" | head -n1)"
    done
    offset=$(stat -c %s "$(logfile "$name")" 2>/dev/null || echo 0)
    printf '=== %s start %s (pid of stack.sh %s)\n' "$name" "$(date -Is)" "$$" >>"$(logfile "$name")"
    offset=$(stat -c %s "$(logfile "$name")")
    "launch_$name"
    pid=$LAUNCHED_PID
    printf '%s\n' "$pid" >"$(pidfile "$name")"
  fi

  deadline=$((SECONDS + WEFT_STACK_TIMEOUT))
  until ready "$name" "$pid"; do
    if [[ -n ${offset:-} ]] && why=$(logged_failure "$name" "$offset"); then
      stop_pid "$name" "$pid" >/dev/null 2>&1 || true
      rm -f "$(pidfile "$name")"
      show_log_tail "$name"
      die "$name: $why"
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      rm -f "$(pidfile "$name")"
      show_log_tail "$name"
      die "$name: process $pid exited before answering"
    fi
    if ((SECONDS >= deadline)); then
      show_log_tail "$name"
      die "$name: pid $pid did not answer within ${WEFT_STACK_TIMEOUT} s (it is left running; stack.sh stop $name)"
    fi
    sleep 0.05
  done
  if [[ $name == kafka ]]; then index_sqlite_headers; fi
  if [[ -n ${offset:-} ]]; then
    log "$name ready in $(elapsed "$t0") s (pid $pid, $(describe "$name" "$pid"))"
  else
    log "$name answering (pid $pid, $(describe "$name" "$pid"))"
  fi
}

# tansu 0.6's sqlite schema has no index on record headers, so every fetch of records with
# headers scans the whole header table (36 s for the first fetch of 20k records, seen here).
# The index is ours, idempotent, and changes no data; the memory engine has no tables.
index_sqlite_headers() {
  [[ $WEFT_KAFKA_STORAGE == sqlite ]] || return 0
  python3 - "$WEFT_RUN_DIR/data/kafka/tansu.db" <<'PY' || log "WARNING: could not index tansu's header table (fetches will be slow)"
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], timeout=30)
if db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'header'").fetchone():
    db.execute("CREATE INDEX IF NOT EXISTS weft_header_topition_offset ON header (topition, offset_id)")
    db.commit()
PY
}

stop_service() {
  local name=$1 pid
  if [[ $name == clickhouse ]] && ch_external; then
    die "clickhouse is external (WEFT_CLICKHOUSE_URL=$WEFT_CLICKHOUSE_URL): stack.sh does not stop it"
  fi
  if pid=$(service_pid "$name"); then
    local t0=$EPOCHREALTIME
    stop_pid "$name" "$pid"
    log "$name stopped in $(elapsed "$t0") s (was pid $pid)"
  else
    log "$name: not running"
  fi
  rm -f "$(pidfile "$name")"
}

# The --storage-engine a running broker (pid $1) was started with.
kafka_running_url() {
  { tr '\0' '\n' <"/proc/$1/cmdline"; } 2>/dev/null | grep -A1 -x -e '--storage-engine' | tail -n 1
}

describe() {
  case $1 in
    kafka) printf '127.0.0.1:%s, %s\n' "$WEFT_KAFKA_PORT" "$(kafka_running_url "$2")" ;;
    clickhouse) printf 'http 127.0.0.1:%s, tcp 127.0.0.1:%s\n' "$WEFT_CH_HTTP_PORT" "$WEFT_CH_TCP_PORT" ;;
  esac
}

env_lines() {
  printf 'export WEFT_KAFKA_BROKERS=127.0.0.1:%s\n' "$WEFT_KAFKA_PORT"
  printf 'export WEFT_CLICKHOUSE_URL=%s\n' "$(ch_url)"
  printf 'export WEFT_RUN_DIR=%q\n' "$WEFT_RUN_DIR"
}

status_line() {
  local name=$1 pid up ports
  ports=$(service_ports "$name" | tr ' ' '/')
  if [[ $name == clickhouse ]] && ch_external; then
    if ch_answers "$(ch_url)"; then
      printf '%-10s external %s (answering)\n' "$name" "$(ch_url)"
      return 0
    fi
    printf '%-10s external %s (NOT answering)\n' "$name" "$(ch_url)"
    return 1
  fi
  if pid=$(service_pid "$name"); then
    up=$(ps -o etime= -p "$pid" | tr -d ' ')
    local state=running
    ready "$name" "$pid" || state="running (not answering)"
    printf '%-10s %-8s pid %-7s port %-11s uptime %s%s\n' "$name" "$state" "$pid" "$ports" "$up" \
      "$([[ $name == kafka ]] && printf '  storage %s' "$(kafka_running_url "$pid")")"
    [[ $state == running ]]
  else
    printf '%-10s %-8s pid %-7s port %-11s uptime -\n' "$name" stopped - "$ports"
    return 1
  fi
}

check_name() {
  case ${1:-} in
    kafka | clickhouse) ;;
    *) die "usage: stack.sh ${2:-start} kafka|clickhouse" ;;
  esac
}

# --- the broker's supervisor ------------------------------------------------------------

slog() { printf '%s [supervisor] %s\n' "$(date -Is)" "$*" >>"$(logfile supervisor)"; }

# Start the supervisor unless it runs (or is switched off, or this is the supervisor).
start_supervisor() {
  [[ $WEFT_SUPERVISE == 1 && -z ${WEFT_IN_SUPERVISOR:-} ]] || return 0
  if service_pid supervisor >/dev/null; then return 0; fi
  WEFT_IN_SUPERVISOR=1 setsid bash "${BASH_SOURCE[0]}" __supervise </dev/null >>"$(logfile supervisor)" 2>&1 &
  printf '%s\n' "$!" >"$(pidfile supervisor)"
  log "kafka supervisor started (pid $!, log $(logfile supervisor))"
}

stop_supervisor() {
  local pid
  [[ -z ${WEFT_IN_SUPERVISOR:-} ]] || return 0
  if pid=$(service_pid supervisor); then
    kill -TERM "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
  fi
  rm -f "$(pidfile supervisor)"
}

# The loop: probe, count failures, restart with backoff, give up after too many in a row.
supervise() {
  local fails=0 restarts=0 backoff=1 healthy_since=$SECONDS pid why
  trap 'slog "stopping (SIGTERM)"; exit 0' TERM INT
  slog "watching kafka on 127.0.0.1:$WEFT_KAFKA_PORT every ${WEFT_SUPERVISE_INTERVAL} s (restart after $WEFT_SUPERVISE_FAILS failed probes, at most $WEFT_SUPERVISE_MAX_RESTARTS in a row)"
  while :; do
    sleep "$WEFT_SUPERVISE_INTERVAL" &
    wait $! || true
    # The pid file is ours while kafka should run; `stack.sh stop kafka` removes it.
    [[ -f $(pidfile kafka) ]] || { slog "kafka was stopped on purpose; supervisor exits"; exit 0; }
    if pid=$(service_pid kafka) && kafka_answers 5; then
      fails=0
      if ((restarts > 0 && SECONDS - healthy_since >= 60)); then
        slog "kafka healthy for 60 s after $restarts restart(s); counters reset"
        restarts=0 backoff=1
      fi
      continue
    fi
    fails=$((fails + 1))
    if pid=$(service_pid kafka); then why="pid $pid does not answer a metadata request"; else why="its process is gone"; fi
    slog "probe failed ($fails/$WEFT_SUPERVISE_FAILS): $why"
    ((fails >= WEFT_SUPERVISE_FAILS)) || continue
    if ((restarts >= WEFT_SUPERVISE_MAX_RESTARTS)); then
      slog "GIVING UP: $restarts restarts in a row did not keep kafka up; see $(logfile kafka)"
      exit 1
    fi
    restarts=$((restarts + 1))
    slog "restarting kafka (restart $restarts of at most $WEFT_SUPERVISE_MAX_RESTARTS, after ${backoff} s backoff): $why"
    [[ $WEFT_KAFKA_STORAGE == sqlite ]] || slog "WARNING: memory engine: the broker's data is lost with the restart"
    if pid=$(service_pid kafka); then (stop_pid kafka "$pid") || true; fi
    sleep "$backoff" &
    wait $! || true
    if ( start_service kafka ) >>"$(logfile supervisor)" 2>&1; then
      slog "kafka restarted (pid $(service_pid kafka || echo '?'))"
    else
      slog "kafka restart failed"
      # Keep the pid file so the loop tries again (it names no live process).
      [[ -f $(pidfile kafka) ]] || printf '0\n' >"$(pidfile kafka)"
    fi
    fails=0 healthy_since=$SECONDS
    backoff=$((backoff * 2 > 30 ? 30 : backoff * 2))
  done
}

refuse_topic_deletion() {
  die "refused: weft never deletes topics on the local broker. On tansu 0.6 deleting one topic deletes every topic, and a deletion while a consumer fetches has wiped the sqlite store; the broker then fails every request. Use a fresh topic prefix (WEFT_TOPIC_PREFIX, or --topic-prefix) instead, or 'stack.sh down' and remove \$WEFT_RUN_DIR/data/kafka to start empty."
}

# --- commands -----------------------------------------------------------------------

cmd=${1:-}
case $cmd in
  up)
    bash "$HERE/install.sh"
    start_service kafka
    start_supervisor
    start_service clickhouse
    env_lines >"$WEFT_RUN_DIR/env"
    log "stack is up; environment in $WEFT_RUN_DIR/env:"
    cat "$WEFT_RUN_DIR/env"
    ;;
  down)
    stop_supervisor
    stop_service kafka
    if ch_external; then
      log "clickhouse: external, left alone"
    else
      stop_service clickhouse
    fi
    ;;
  start | stop | restart)
    check_name "${2:-}" "$cmd"
    if [[ $2 == kafka && $cmd != start ]]; then stop_supervisor; fi
    [[ $cmd == start ]] || stop_service "$2"
    [[ $cmd == stop ]] || start_service "$2"
    if [[ $2 == kafka && $cmd != stop ]]; then start_supervisor; fi
    ;;
  __supervise)
    supervise
    ;;
  delete-topic | delete-topics | delete)
    refuse_topic_deletion
    ;;
  status)
    rc=0
    status_line kafka || rc=3
    status_line clickhouse || rc=3
    if pid=$(service_pid supervisor); then
      printf '%-10s running  pid %-7s log %s\n' supervisor "$pid" "$(logfile supervisor)"
    elif [[ $WEFT_SUPERVISE == 1 ]]; then
      printf '%-10s stopped  (last lines of %s:)\n' supervisor "$(logfile supervisor)"
      tail -n 3 "$(logfile supervisor)" 2>/dev/null | sed 's/^/           /' || true
    fi
    exit "$rc"
    ;;
  env)
    env_lines
    ;;
  *)
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
    ;;
esac

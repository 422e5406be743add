#!/usr/bin/env bash
# Installs what the local stack (deploy/local/stack.sh) needs on a fresh
# Debian 12 machine: a Kafka-protocol broker (tansu) and a ClickHouse engine
# (chdb-core's _chdb.abi3.so, served by chdb_server.py).
#
# Idempotent: each step checks for its result first and does nothing when it
# is already there. Tools go under $HOME/.cache/weft so that they outlive a
# checkout (a fresh CI clone reuses them instead of rebuilding for ~12 min).
#
# Environment:
#   WEFT_TOOLS_DIR  cargo --root for tansu     (default $HOME/.cache/weft/tools)
#   WEFT_VENV       venv that holds chdb-core  (default $HOME/.cache/weft/venv)
#   WEFT_PYTHON     python used to create it   (default python3)
#   WEFT_TANSU_WAIT seconds to wait for a tansu build already running (default 2400)
set -euo pipefail

WEFT_TOOLS_DIR="${WEFT_TOOLS_DIR:-$HOME/.cache/weft/tools}"
WEFT_VENV="${WEFT_VENV:-$HOME/.cache/weft/venv}"
WEFT_PYTHON="${WEFT_PYTHON:-python3}"
WEFT_TANSU_WAIT="${WEFT_TANSU_WAIT:-2400}"

TANSU_VERSION=0.6.0
# dynostore+libsql enable the memory:// and sqlite:// storage engines; the
# default build has neither and fails at start with "FeatureNotEnabled".
TANSU_FEATURES=dynostore,libsql
CHDB_VERSION=26.9.0

log() { printf '[install] %s\n' "$*" >&2; }
die() { printf '[install] ERROR: %s\n' "$*" >&2; exit 1; }

# Seconds since $1 (an $EPOCHREALTIME value), with one decimal.
elapsed() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }

# --- 1. Debian packages -------------------------------------------------------
# Only what is truly missing; `apt-get update` runs once, and only if needed.
apt_missing=()
command -v curl >/dev/null 2>&1 || apt_missing+=(curl)
command -v cc >/dev/null 2>&1 || apt_missing+=(gcc)
command -v make >/dev/null 2>&1 || apt_missing+=(make)
# zlib: the rdkafka crate's bundled librdkafka links against it.
dpkg-query -W -f='${Status}' zlib1g-dev 2>/dev/null | grep -q 'ok installed' || apt_missing+=(zlib1g-dev)
if ! command -v clickhouse >/dev/null 2>&1 \
    && ! "$WEFT_PYTHON" -c 'import venv, ensurepip' >/dev/null 2>&1; then
  # Debian's own python3 ships venv/ensurepip separately.
  apt_missing+=(python3-venv)
fi

if ((${#apt_missing[@]})); then
  sudo_cmd=()
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null 2>&1 || die "missing Debian packages (${apt_missing[*]}) and not root: install them first"
    sudo_cmd=(sudo)
  fi
  log "apt-get: installing ${apt_missing[*]}"
  t0=$EPOCHREALTIME
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${apt_missing[@]}" >/dev/null
  log "apt-get: installed ${apt_missing[*]} in $(elapsed "$t0") s"
else
  log "apt-get: nothing missing"
fi

# --- 2. ClickHouse engine: chdb-core in a venv ------------------------------------
chdb_so() {
  # The venv's python3.X folder name depends on the interpreter; glob for it.
  local f
  for f in "$WEFT_VENV"/lib/python3*/site-packages/chdb/_chdb.abi3.so; do
    [[ -f $f ]] && { printf '%s\n' "$f"; return 0; }
  done
  return 1
}

if command -v clickhouse >/dev/null 2>&1; then
  log "chdb: skipped, a clickhouse binary is on PATH ($(command -v clickhouse))"
elif so=$(chdb_so) && compgen -G "$(dirname "$(dirname "$so")")/chdb_core-${CHDB_VERSION}.dist-info" >/dev/null; then
  log "chdb: chdb-core ${CHDB_VERSION} already in $WEFT_VENV"
else
  t0=$EPOCHREALTIME
  if [[ ! -x $WEFT_VENV/bin/python ]]; then
    log "chdb: creating venv $WEFT_VENV"
    mkdir -p "$(dirname "$WEFT_VENV")"
    "$WEFT_PYTHON" -m venv "$WEFT_VENV"
  fi
  log "chdb: pip install --no-deps chdb-core==${CHDB_VERSION} (a ~180 MB wheel)"
  # --no-deps: pandas/pyarrow are only for chdb's Python API, which the
  # launcher does not use.
  "$WEFT_VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    --no-input --no-deps "chdb-core==${CHDB_VERSION}"
  so=$(chdb_so) || die "chdb: pip finished but no chdb/_chdb.abi3.so in $WEFT_VENV"
  log "chdb: installed in $(elapsed "$t0") s ($so)"
fi

# --- 3. Kafka-protocol broker: tansu ----------------------------------------------
tansu_bin="$WEFT_TOOLS_DIR/bin/tansu"
if [[ -x $tansu_bin ]]; then
  log "tansu: already installed ($tansu_bin)"
else
  if ! command -v cargo >/dev/null 2>&1 && [[ -f $HOME/.cargo/env ]]; then
    # shellcheck source=/dev/null
    . "$HOME/.cargo/env"
  fi
  command -v cargo >/dev/null 2>&1 || die "tansu: cargo not found (install Rust first)"

  # A build into the same root may already be running (another shell, or an
  # earlier `stack.sh up` still going): a second one would only compete for
  # the CPUs, so wait for its binary instead.
  if pgrep -f "cargo install tansu .*--root $WEFT_TOOLS_DIR" >/dev/null 2>&1; then
    log "tansu: a build into $WEFT_TOOLS_DIR is already running; waiting up to ${WEFT_TANSU_WAIT} s for it"
    t0=$EPOCHREALTIME
    deadline=$((SECONDS + WEFT_TANSU_WAIT))
    until [[ -x $tansu_bin ]]; do
      if ! pgrep -f "cargo install tansu .*--root $WEFT_TOOLS_DIR" >/dev/null 2>&1; then
        # cargo moves the binary into place just before it exits.
        sleep 1
        [[ -x $tansu_bin ]] && break
        die "tansu: the running build ended without producing $tansu_bin"
      fi
      ((SECONDS < deadline)) || die "tansu: still no $tansu_bin after ${WEFT_TANSU_WAIT} s"
      sleep 5
    done
    log "tansu: the running build finished after $(elapsed "$t0") s more"
  else
    log "tansu: cargo install tansu ${TANSU_VERSION} (about 12 min on 2 cores, ~1.5 GB of build files)"
    t0=$EPOCHREALTIME
    mkdir -p "$WEFT_TOOLS_DIR"
    cargo install tansu --version "$TANSU_VERSION" --locked \
      --features "$TANSU_FEATURES" --root "$WEFT_TOOLS_DIR"
    [[ -x $tansu_bin ]] || die "tansu: cargo install finished but $tansu_bin is missing"
    log "tansu: installed in $(elapsed "$t0") s"
  fi
fi

log "done"

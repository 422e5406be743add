#!/usr/bin/env bash
# Creates (once) the venv in which weft's Python publisher is tested against the real Weaver
# siblings from PyPI, and prints its python's path on stdout.
#
#   bash deploy/local/python_siblings.sh          # -> $HOME/.cache/weft/pyenv-siblings/bin/python
#
# Pinned: weaver-kernel 0.12.0, chainweaver 0.14.1, weaver-contracts 0.7.0, plus
# producers/python (weft-publish) installed editable from this checkout. Idempotent: when the
# pinned versions and the editable install are already there it does nothing (~0.3 s).
#
# Environment:
#   WEFT_SIBLINGS_VENV  the venv          (default $HOME/.cache/weft/pyenv-siblings)
#   WEFT_PYTHON         python to create it (default python3; needs >= 3.10)
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
VENV="${WEFT_SIBLINGS_VENV:-$HOME/.cache/weft/pyenv-siblings}"
PY="${WEFT_PYTHON:-python3}"
PINS=(weaver-kernel==0.12.0 chainweaver==0.14.1 weaver-contracts==0.7.0)

log() { printf '[python_siblings] %s\n' "$*" >&2; }

# One installer at a time (tests run in parallel and may all call this).
mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
flock 9

if [[ ! -x $VENV/bin/python ]]; then
  log "creating venv $VENV"
  "$PY" -m venv "$VENV"
fi

ready() {
  "$VENV/bin/python" - "$REPO/producers/python" <<'PY' 2>/dev/null
import sys, importlib.metadata as md, os
want = {"weaver-kernel": "0.12.0", "chainweaver": "0.14.1", "weaver-contracts": "0.7.0"}
for name, v in want.items():
    if md.version(name) != v:
        sys.exit(1)
import weft_publish
if os.path.realpath(os.path.dirname(os.path.dirname(weft_publish.__file__))) != os.path.realpath(sys.argv[1]):
    sys.exit(1)
PY
}

if ready; then
  log "siblings already installed in $VENV"
else
  log "pip install ${PINS[*]} and -e producers/python"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
    "${PINS[@]}" -e "$REPO/producers/python"
  ready || { log "ERROR: install finished but the pinned packages are not importable"; exit 1; }
fi
printf '%s\n' "$VENV/bin/python"

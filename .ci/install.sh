#!/usr/bin/env bash
# Make a virtual environment and install this checkout into it, editable, saying every 15 s that it
# is still working (pip prints nothing while it unpacks torch; venv is silent too: minutes and tens of
# seconds on a busy machine).
#
#   bash .ci/install.sh [VENV_DIR [EXTRAS]]      # defaults: .venv and all
#
# VENV_DIR is created with python3 -m venv when it has no bin/pip yet. EXTRAS are the extras of
# pyproject.toml (all = torch, plot, highs, test, eval, metrics, docs). Elastic Horovod is not
# built here: bash .ci/build-horovod.sh VENV_DIR does that (minutes; only the horovod runtime needs it).
set -euo pipefail

VENV_DIR=${1:-.venv}
EXTRAS=${2:-all}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
HEARTBEAT_S=15

log() { printf '[install] %s\n' "$*"; }

# Run "$@" in the background and say every HEARTBEAT_S seconds that it is still running; its exit code.
with_heartbeat() {
    local what=$1 start=$SECONDS pid next
    shift
    "$@" &
    pid=$!
    trap 'kill "$pid" 2>/dev/null || true' INT TERM
    next=$((start + HEARTBEAT_S))
    while kill -0 "$pid" 2>/dev/null; do
        sleep 1
        if [ "$SECONDS" -ge "$next" ]; then
            log "still $what: $((SECONDS - start)) s"
            next=$((SECONDS + HEARTBEAT_S))
        fi
    done
    wait "$pid"
}

start=$SECONDS
if [ ! -x "$VENV_DIR/bin/pip" ]; then
    log "creating the virtual environment $VENV_DIR"
    with_heartbeat "creating $VENV_DIR" python3 -m venv "$VENV_DIR"
fi
# --no-compile: Python compiles a module when it is first imported (and keeps the .pyc), so the
# thousands of modules of torch, sympy and dask that nothing here imports are never compiled
log "pip install --no-compile -e '$ROOT[$EXTRAS]' into $VENV_DIR"
with_heartbeat installing "$VENV_DIR/bin/pip" install --no-compile -e "$ROOT[$EXTRAS]"
log "installed in $((SECONDS - start)) s: $VENV_DIR/bin/malletrain"

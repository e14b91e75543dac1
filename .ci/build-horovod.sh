#!/usr/bin/env bash
# Make `import horovod.torch` work in the Python environment VENV_DIR.
#
#   bash .ci/build-horovod.sh VENV_DIR
#
# VENV_DIR is any prefix with bin/python (a venv, or the system python's prefix).
# Horovod 0.28.1 (the last release) does not build against torch >= 2.1 as
# shipped: it needs C++17. So this script, in order:
#   1. exits 0 if VENV_DIR/bin/python can already `import horovod.torch`;
#   2. else installs a cached wheel built for the same python + torch version
#      from ${MALLETRAIN_CACHE:-$HOME/.cache/malletrain}/wheels/<py>-torch-<ver>/;
#   3. else downloads the horovod 0.28.1 sdist from PyPI, patches its two
#      CMakeLists.txt to C++17, builds a wheel (PyTorch + Gloo, no MPI/TF/MXNet),
#      caches it and installs it (about 6 minutes on 2 cores).
# Environment knobs: MALLETRAIN_CACHE, HOROVOD_BUILD_TIMEOUT (seconds, default
# 2400), HOROVOD_BUILD_JOBS (make -j, default 2), HOROVOD_BUILD_NICE (default 10).
set -euo pipefail

HOROVOD_VERSION=0.28.1
TORCH_PIN=2.13.0

log() { printf '[build-horovod] %s\n' "$*" >&2; }
die() { printf '[build-horovod] ERROR: %s\n' "$*" >&2; exit 1; }

[ $# -eq 1 ] || die "usage: $0 VENV_DIR"
VENV_DIR=$1
PY="$VENV_DIR/bin/python"
[ -x "$PY" ] || die "$PY does not exist or is not executable (VENV_DIR=$VENV_DIR)"

if "$PY" -c "import horovod.torch" >/dev/null 2>&1; then
    log "horovod.torch already importable by $PY: nothing to do"
    exit 0
fi

pip_install() {
    log "pip install $*"
    timeout 900 "$PY" -m pip install --quiet "$@" || die "pip install $* failed (python $PY)"
}

# torch and numpy must be in the target environment: horovod compiles against
# this exact torch. Pin torch: an unpinned `torch` pulls a multi-GB CUDA build.
if ! "$PY" -c "import torch, numpy" >/dev/null 2>&1; then
    pip_install "torch==$TORCH_PIN" numpy
fi
# horovod's runtime requirements (its setup.py require_list), plus build tools.
pip_install cloudpickle psutil pyyaml packaging setuptools wheel numpy

PY_TAG=$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
TORCH_VERSION=$("$PY" -c 'import torch; print(torch.__version__)')
CACHE_ROOT=${MALLETRAIN_CACHE:-$HOME/.cache/malletrain}
CACHE_DIR="$CACHE_ROOT/wheels/$PY_TAG-torch-$TORCH_VERSION"
log "python $PY_TAG, torch $TORCH_VERSION, wheel cache $CACHE_DIR"

install_cached() {
    local whl
    whl=$(ls -1 "$CACHE_DIR"/horovod-"$HOROVOD_VERSION"-*.whl 2>/dev/null | head -n 1 || true)
    [ -n "$whl" ] || return 1
    log "installing cached wheel $whl"
    pip_install --no-deps --force-reinstall "$whl"
    return 0
}

check_import() {
    if ! "$PY" -c "import horovod.torch as hvd; print('[build-horovod] horovod', __import__('horovod').__version__, 'torch', __import__('torch').__version__, 'gloo built:', hvd.gloo_built())" >&2; then
        die "horovod installed but 'import horovod.torch' fails with $PY"
    fi
}

if install_cached; then
    check_import
    exit 0
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/build-horovod.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
log "no cached wheel: building horovod $HOROVOD_VERSION from source in $WORK"

log "downloading the horovod $HOROVOD_VERSION sdist"
timeout 600 "$PY" -m pip download --quiet --no-deps --no-binary :all: \
    "horovod==$HOROVOD_VERSION" -d "$WORK/sdist" \
    || die "pip download horovod==$HOROVOD_VERSION failed"
SDIST=$(ls -1 "$WORK"/sdist/horovod-"$HOROVOD_VERSION".tar.gz 2>/dev/null | head -n 1 || true)
[ -n "$SDIST" ] || die "sdist horovod-$HOROVOD_VERSION.tar.gz not found in $WORK/sdist"
tar -xzf "$SDIST" -C "$WORK"
SRC="$WORK/horovod-$HOROVOD_VERSION"
[ -d "$SRC" ] || die "unpacked source $SRC missing"

# Patch both CMakeLists.txt to C++17 (idempotent: rewrites any standard to 17,
# and fails if the line is not there, so a changed upstream is noticed).
for f in "$SRC/CMakeLists.txt" "$SRC/horovod/torch/CMakeLists.txt"; do
    grep -Eq 'set\(CMAKE_CXX_STANDARD [0-9]+\)' "$f" \
        || die "$f: no 'set(CMAKE_CXX_STANDARD N)' line to patch"
    sed -E -i 's/set\(CMAKE_CXX_STANDARD [0-9]+\)/set(CMAKE_CXX_STANDARD 17)/' "$f"
    log "patched $f: $(grep -Ec 'set\(CMAKE_CXX_STANDARD 17\)' "$f") line(s) now C++17"
done

command -v cmake >/dev/null || die "cmake not found on PATH (apt-get install cmake)"
BUILD_LOG="$WORK/build.log"
JOBS=${HOROVOD_BUILD_JOBS:-2}
BUILD_TIMEOUT=${HOROVOD_BUILD_TIMEOUT:-2400}
log "building the wheel (make -j$JOBS, nice ${HOROVOD_BUILD_NICE:-10}, timeout ${BUILD_TIMEOUT}s); log: $BUILD_LOG"
start=$(date +%s)
if ! env HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
        HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITHOUT_GPU=1 \
        MAKEFLAGS="-j$JOBS" \
        timeout "$BUILD_TIMEOUT" nice -n "${HOROVOD_BUILD_NICE:-10}" \
        "$PY" -m pip wheel --no-build-isolation --no-deps -v -w "$WORK/wheel" "$SRC" \
        >"$BUILD_LOG" 2>&1; then
    log "build FAILED after $(( $(date +%s) - start ))s; last 60 lines of $BUILD_LOG:"
    tail -n 60 "$BUILD_LOG" >&2
    die "horovod $HOROVOD_VERSION wheel build failed"
fi
log "built in $(( $(date +%s) - start ))s"
WHEEL=$(ls -1 "$WORK"/wheel/horovod-"$HOROVOD_VERSION"-*.whl 2>/dev/null | head -n 1 || true)
[ -n "$WHEEL" ] || die "pip wheel succeeded but no horovod wheel in $WORK/wheel"
mkdir -p "$CACHE_DIR"
cp "$WHEEL" "$CACHE_DIR/"
log "cached $(basename "$WHEEL") in $CACHE_DIR"
install_cached || die "cached wheel vanished from $CACHE_DIR"
check_import

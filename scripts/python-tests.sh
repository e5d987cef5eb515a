#!/usr/bin/env bash
# The Python package's tests (python/tests): a virtual environment in target/py-venv (ignored),
# numpy, pytest, maturin and torch from PyPI, the package built from python/ (maturin, release,
# the same cargo target folder as the workspace), the `fanout` binary for the tests that compare
# with the command line, then pytest. Idempotent: a second run reuses the environment and the
# build and only rebuilds what changed.
#
# Environment: PYTHON (the interpreter to make the venv from; default python3), FANOUT_PY_VENV
# (default target/py-venv), CARGO_TARGET_DIR (default target). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=${FANOUT_PY_VENV:-$ROOT/target/py-venv}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}

if [ ! -d ../shared/datasets ]; then
  echo "error: ../shared/datasets is missing; the tests import the small datasets kept there" >&2
  exit 1
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "== creating $VENV"
  "${PYTHON:-python3}" -m venv "$VENV"
fi
# The venv's tools first on PATH (maturin's build hook runs the `maturin` executable).
export PATH="$VENV/bin:$PATH" VIRTUAL_ENV="$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)

echo "== numpy, pytest, maturin (PyPI)"
"${PIP[@]}" install numpy pytest 'maturin>=1.5,<2'

# torch: PyPI's Linux x86-64 wheel is the CUDA build and PyPI has no CPU-only one (those live on
# download.pytorch.org, which CI cannot reach). `pip install --no-deps torch` plus its
# pure-Python dependencies does not work: libtorch.so links libtorch_cuda.so, which needs
# libcudart, cuBLAS, cuDNN, NCCL, ... from the nvidia-* wheels, so `import torch` fails. So torch
# is installed with its dependencies (about 5.5 GB unpacked with torch 2.15; 52 s here with a
# warm network; pip's cache is not used, see below). It runs on the CPU without a GPU or driver.
if ! "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
  echo "== torch (PyPI, with its CUDA runtime wheels; CPU use needs no GPU)"
  # Needs about 5.5 GB unpacked plus the downloads in pip's temporary folder; without pip's
  # cache, so the wheels are not kept a second time (a clean CI machine starts without one).
  df -h "$VENV" "${TMPDIR:-/tmp}" | sed 's/^/   /'
  "${PIP[@]}" install --no-cache-dir torch
fi

# The root workspace excludes python/, so .ci/run's fmt and clippy do not see it: check here.
echo "== cargo fmt --check, cargo clippy -D warnings (python/)"
cargo fmt --manifest-path python/Cargo.toml -- --check
PYO3_PYTHON="$VENV/bin/python" cargo clippy --manifest-path python/Cargo.toml --all-targets -- -D warnings
# `device="cuda"` (the CUDA backend) keeps compiling; no CUDA needed.
PYO3_PYTHON="$VENV/bin/python" cargo clippy --manifest-path python/Cargo.toml --all-targets --features cuda -- -D warnings

echo "== building and installing the package (pip install ./python)"
# No build isolation: maturin is in the venv already (no second download), and cargo reuses
# $CARGO_TARGET_DIR between runs.
"${PIP[@]}" install --no-build-isolation --force-reinstall --no-deps ./python

echo "== the fanout binary (tests compare the loader's batches and errors with the CLI's)"
cargo build --bin fanout
export FANOUT_BIN="$CARGO_TARGET_DIR/debug/fanout"

echo "== pytest python/tests"
# From the repository root, so `import fanout` is the installed package, not python/fanout/.
"$VENV/bin/python" -m pytest python/tests -q "$@"

#!/usr/bin/env bash
# MPI tests: build with the `mpi` feature and run programs under `mpirun -np N`.
#
# Installs Open MPI and libclang (for the bindings) with apt-get when they are missing (CI runs as
# root), builds, runs every test below, prints one line per test and a final
# `N passed, M failed` line, and exits 1 when any test failed.
#
# Adding a test: build what it needs in `build`, then add a line at the end, e.g.
#   run_np "train equivalence, 2 ranks" 2 target/debug/fanout train --workers-check ...
# `run_np NAME NP CMD...` (CMD may start with mpirun options such as `-x VAR=value`) passes
# when the command exits 0 on every rank within MPI_TEST_TIMEOUT
# seconds (default 300); `expect_abort NAME NP PATTERN SECONDS CMD...` passes when the job exits
# non-zero within SECONDS with PATTERN (a fixed string) on its stderr.
set -uo pipefail
cd "$(dirname "$0")/.."

TARGET_DIR="${CARGO_TARGET_DIR:-target}"
MPI_TEST_TIMEOUT="${MPI_TEST_TIMEOUT:-300}"
# Open MPI refuses to run as root without these; more ranks than cores need --oversubscribe.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# In containers without ptrace rights, Open MPI's shared-memory single copy (CMA) fails; copy
# through the shared segment instead (4.x calls the component vader, 5.x sm).
export OMPI_MCA_btl_vader_single_copy_mechanism="${OMPI_MCA_btl_vader_single_copy_mechanism:-none}"
export OMPI_MCA_btl_sm_single_copy_mechanism="${OMPI_MCA_btl_sm_single_copy_mechanism:-none}"
MPIRUN=(mpirun --oversubscribe)

PASSED=0
FAILED=0

pass() { PASSED=$((PASSED + 1)); echo "ok   $1 ($2 s)"; }
fail() { FAILED=$((FAILED + 1)); echo "FAIL $1 ($2 s): $3"; }

have_libclang() {
  compgen -G '/usr/lib/llvm-*/lib/libclang*.so*' >/dev/null \
    || compgen -G '/usr/lib/*/libclang*.so*' >/dev/null \
    || [ -n "${LIBCLANG_PATH:-}" ]
}

have_mpi() {
  command -v mpirun >/dev/null && command -v mpicc >/dev/null && have_libclang
}

ensure_mpi() {
  if have_mpi; then
    return 0
  fi
  echo "== installing Open MPI and libclang (mpirun, mpicc or libclang missing)"
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "error: need root and apt-get to install libopenmpi-dev openmpi-bin libclang-dev" >&2
    return 1
  fi
  apt-get update -q \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      libopenmpi-dev openmpi-bin libclang-dev \
    && have_mpi
}

build() {
  echo "== cargo build -p fanout-comm --features mpi --examples"
  cargo build -p fanout-comm --features mpi --examples
}

elapsed_since() { echo "$(( $(date +%s%N) / 1000000 - $1 ))" | awk '{ printf "%.1f", $1 / 1000 }'; }

# run_np NAME NP CMD... -- passes when `mpirun -np NP CMD...` exits 0 in time.
run_np() {
  local name="$1" np="$2"
  shift 2
  local start rc out
  start=$(( $(date +%s%N) / 1000000 ))
  out=$(timeout "$MPI_TEST_TIMEOUT" "${MPIRUN[@]}" -np "$np" "$@" 2>&1)
  rc=$?
  if [ "$rc" = 0 ]; then
    pass "$name" "$(elapsed_since "$start")"
    printf '%s\n' "$out" | sed 's/^/     | /' | tail -5
  else
    local why="exit code $rc"
    [ "$rc" = 124 ] && why="timed out after $MPI_TEST_TIMEOUT s"
    fail "$name" "$(elapsed_since "$start")" "$why"
    printf '%s\n' "$out" | sed 's/^/     | /' | tail -40
  fi
}

# expect_abort NAME NP PATTERN SECONDS CMD... -- passes when `mpirun -np NP CMD...` exits
# non-zero within SECONDS and its stderr contains PATTERN.
expect_abort() {
  local name="$1" np="$2" pattern="$3" limit="$4"
  shift 4
  local start rc err secs
  start=$(( $(date +%s%N) / 1000000 ))
  err=$(timeout "$limit" "${MPIRUN[@]}" -np "$np" "$@" 2>&1 >/dev/null)
  rc=$?
  secs=$(elapsed_since "$start")
  if [ "$rc" = 124 ]; then
    fail "$name" "$secs" "still running after $limit s (a failed rank must end the job)"
  elif [ "$rc" = 0 ]; then
    fail "$name" "$secs" "exited 0; expected a non-zero exit"
  elif ! grep -qF -- "$pattern" <<<"$err"; then
    fail "$name" "$secs" "exit code $rc but stderr lacks '$pattern'"
    printf '%s\n' "$err" | sed 's/^/     | /' | tail -20
  else
    pass "$name" "$secs"
  fi
}

if ! ensure_mpi; then
  fail "set-up" 0 "could not install Open MPI"
  echo "$PASSED passed, $FAILED failed"
  exit 1
fi
if ! build; then
  fail "build" 0 "cargo build --features mpi failed"
  echo "$PASSED passed, $FAILED failed"
  exit 1
fi

CHECK="$TARGET_DIR/debug/examples/mpi_check"
echo "== MPI tests ($(mpirun --version 2>/dev/null | head -1))"
run_np "comm conformance, 1 rank" 1 "$CHECK"
run_np "comm conformance, 2 ranks" 2 "$CHECK"
run_np "comm conformance, 3 ranks" 3 "$CHECK"
run_np "comm conformance, 3 ranks, MPI_THREAD_SERIALIZED" 3 \
  -x FANOUT_MPI_THREADS=serialized "$CHECK"
expect_abort "comm fail ends the job, 2 ranks" 2 \
  "fanout: rank 1: deliberate failure from mpi_check" 60 "$CHECK" fail
expect_abort "comm fail ends the job, 3 ranks" 3 \
  "fanout: rank 1: deliberate failure from mpi_check" 60 "$CHECK" fail

echo "$PASSED passed, $FAILED failed"
[ "$FAILED" = 0 ]

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
  cargo build -p fanout-comm --features mpi --examples || return 1
  echo "== cargo build -p fanout-exec --features mpi --example mpi_equivalence"
  cargo build -p fanout-exec --features mpi --example mpi_equivalence || return 1
  echo "== cargo build --features mpi --bin fanout"
  cargo build --features mpi --bin fanout
}

# same_run NAME NP ARGS... -- passes when `mpirun -np NP fanout train ARGS` and the same run
# as NP in-process workers (`--workers NP`) write metrics with identical losses, accuracies and
# per-worker counts (both sum in rank order, so they agree bit for bit).
same_run() {
  local name="$1" np="$2"
  shift 2
  local start dir
  start=$(( $(date +%s%N) / 1000000 ))
  dir=$(mktemp -d)
  if ! timeout "$MPI_TEST_TIMEOUT" "${MPIRUN[@]}" -np "$np" "$FANOUT" --quiet train "$@" \
      --threads 1 --metrics-out "$dir/mpi.json" >"$dir/mpi.log" 2>&1; then
    fail "$name" "$(elapsed_since "$start")" "the MPI run failed"
    sed 's/^/     | /' "$dir/mpi.log" | tail -20
  elif ! "$FANOUT" --quiet train "$@" --threads "$np" --workers "$np" \
      --metrics-out "$dir/local.json" >"$dir/local.log" 2>&1; then
    fail "$name" "$(elapsed_since "$start")" "the in-process run failed"
    sed 's/^/     | /' "$dir/local.log" | tail -20
  elif ! python3 - "$dir/mpi.json" "$dir/local.json" "$np" <<'PY'
import json, sys
a, b, n = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), int(sys.argv[3])
assert a["comm"]["kind"] == "mpi" and b["comm"]["kind"] == "local", (a["comm"], b["comm"])
assert a["workers"] == b["workers"] == n, (a["workers"], b["workers"])
key = lambda e: (e["loss"], e["train_acc"], e["val_acc"], e["test_acc"], e["batches"],
                 [(w["rank"], w["batches"], w["seeds"]) for w in e["workers"]])
for x, y in zip(a["epochs"], b["epochs"]):
    assert key(x) == key(y), (key(x), key(y))
assert a["test_acc"] == b["test_acc"]
PY
  then
    fail "$name" "$(elapsed_since "$start")" "MPI and in-process metrics differ"
  else
    pass "$name" "$(elapsed_since "$start")"
  fi
  rm -rf "$dir"
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


# Training: data parallelism over MPI against one worker and against in-process workers.
EQUIV="$TARGET_DIR/debug/examples/mpi_equivalence"
FANOUT="$TARGET_DIR/debug/fanout"
run_np "data-parallel gradients and run equal one worker's, 2 ranks" 2 "$EQUIV"
run_np "data-parallel gradients and run equal one worker's, 3 ranks" 3 "$EQUIV"
DATA=$(mktemp -d)
"$FANOUT" --quiet dataset gen --preset tiny "$DATA/tiny" >/dev/null
TRAIN=(--dataset "$DATA/tiny" --fanouts 5,5 --batch-size 128 --hidden 32 --epochs 3 --lr 0.01)
same_run "fanout train under mpirun equals --workers 2" 2 "${TRAIN[@]}"
same_run "fanout train under mpirun equals --workers 3" 3 "${TRAIN[@]}"
# GNNLab's factored design: samplers send slices to trainers through the queue (MPI messages
# with credits). Without switching the sums run in a fixed order, so MPI and threads agree
# bit for bit; with switching, which slices a standby trains depends on timing, so that run
# is checked for training every seed once per epoch.
same_run "factored training under mpirun equals --workers 3 (1 sampler)" 3 "${TRAIN[@]}" \
  --strategy factored --samplers 1 --no-switching
same_run "factored training under mpirun equals --workers 3 (2 samplers)" 3 "${TRAIN[@]}" \
  --strategy factored --samplers 2 --no-switching
same_run "hybrid training (MorphGL routes) under mpirun equals --workers 3" 3 "${TRAIN[@]}" \
  --strategy hybrid --samplers 1 --no-switching
factored_switching() {
  local dir start
  start=$(( $(date +%s%N) / 1000000 ))
  dir=$(mktemp -d)
  if timeout "$MPI_TEST_TIMEOUT" "${MPIRUN[@]}" -np 2 "$FANOUT" --quiet train "${TRAIN[@]}" \
      --strategy factored --samplers 1 --queue-depth 1 --threads 1 \
      --metrics-out "$dir/m.json" >"$dir/log" 2>&1 &&
    timeout "$MPI_TEST_TIMEOUT" "${MPIRUN[@]}" -np 2 "$FANOUT" --quiet train "${TRAIN[@]}" \
      --strategy factored --samplers 1 --queue-depth 1 --threads 1 --no-switching \
      --metrics-out "$dir/still.json" >>"$dir/log" 2>&1 &&
    python3 - "$dir/m.json" "$DATA/tiny/meta.txt" "$dir/still.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
still = json.load(open(sys.argv[3]))
n = int(dict(l.split(None, 1) for l in open(sys.argv[2]) if l.strip())["NUM_TRAIN_SET"])
assert m["comm"]["kind"] == "mpi" and m["factored"]["layout"]["samplers"] == 1
# The slices the standby trained count in the trainer's epoch, its products included
# (carried with its gradient: the trainer's process cannot count them): the same counts as
# when the trainer trains every slice itself.
counts = lambda e: (e["edges"], e["input_nodes"], e["extract"]["bytes_from_host"],
                    e["gemm_flops"], e["gemm_flops_skipped"])
for e, s in zip(m["epochs"], still["epochs"]):
    assert e["seeds"] == n, (e["epoch"], e["seeds"], n)
    assert counts(e) == counts(s), (e["epoch"], counts(e), counts(s))
PY
  then
    pass "factored training with switching under mpirun trains every seed once and counts every slice" "$(elapsed_since "$start")"
  else
    fail "factored training with switching under mpirun trains every seed once and counts every slice" "$(elapsed_since "$start")" "see the log"
    sed 's/^/     | /' "$dir/log" | tail -20
  fi
  rm -rf "$dir"
}
factored_switching
# A rank that cannot open its dataset ends the job with its message (rank 0 waits in the
# config check meanwhile); ranks started with different configs are refused.
# (`-np 1 A : -np 1 B`: two ranks, rank 1 running B.)
expect_abort "a failing rank ends a training job" 1 "fanout: rank 1: " 60 \
  "$FANOUT" --quiet train "${TRAIN[@]}" : -np 1 "$FANOUT" --quiet train "${TRAIN[@]}" \
  --dataset "$DATA/missing"
expect_abort "ranks with different configs are refused" 1 "different configs" 60 \
  "$FANOUT" --quiet train "${TRAIN[@]}" : -np 1 "$FANOUT" --quiet train "${TRAIN[@]}" --seed 9
# One process per GPU: each rank opens its own device, so a build without CUDA ends the job
# with the rebuild hint from every rank (the GPU runs themselves need the GPU machine).
expect_abort "ranks asked for a GPU in a build without CUDA end the job" 2 \
  "without CUDA support" 60 "$FANOUT" --quiet train "${TRAIN[@]}" --device cuda
# PaGraph partitions under MPI: each rank reads only its own part, so a damaged part stops
# the rank that owns it, and the job ends with its message.
"$FANOUT" --quiet dataset partition --parts 2 "$DATA/tiny" >/dev/null
same_run "partitioned fanout train under mpirun equals --workers 2" 2 "${TRAIN[@]}" \
  --partition pagraph-2 --cache-policy degree
PART1="$DATA/tiny/partitions/pagraph-2/train_1.bin"
head -c 8 "$PART1" >"$PART1.short" && mv "$PART1.short" "$PART1"
expect_abort "a rank with a damaged partition file ends the job" 2 \
  "fanout: rank 1: $PART1" 60 "$FANOUT" --quiet train "${TRAIN[@]}" --partition pagraph-2
# GSplit's split parallelism: one batch per step split by METIS ranges, rows shuffled with
# all-to-all-v; sampling talks on the training thread, so SERIALIZED threading is safe too.
for np in 2 3; do
  "$FANOUT" --quiet dataset partition --method metis --parts "$np" "$DATA/tiny" \
    "$DATA/tiny-m$np" >/dev/null
  SPLIT=(--dataset "$DATA/tiny-m$np" --fanouts 5,5 --batch-size 128 --hidden 32 --epochs 3
    --lr 0.01 --strategy split)
  same_run "split training under mpirun equals --workers $np" "$np" "${SPLIT[@]}"
done
# GCN (degrees counted at the owners, partial sums) and GAT (source rows) take other paths.
same_run "split GCN training under mpirun equals --workers 3" 3 "${SPLIT[@]}" --model gcn
same_run "split GAT training under mpirun equals --workers 3" 3 "${SPLIT[@]}" --model gat
run_np "split training under MPI_THREAD_SERIALIZED, 3 ranks" 3 \
  -x FANOUT_MPI_THREADS=serialized "$FANOUT" --quiet train "${SPLIT[@]}" --threads 1
rm -rf "$DATA"

echo "$PASSED passed, $FAILED failed"
[ "$FAILED" = 0 ]

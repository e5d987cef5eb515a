#!/usr/bin/env bash
# Epochs on the GPU machine (GUIDE §5), from the repository root: GCN 15,10,5, SAGE and GAT 10,25
# on the products preset at full size, 3 epochs, batch 8000, hidden 256, with the fanout binary
# in GPU_DIR (default .gpu) and, when OLD_BIN names one, an earlier build on the same runs (its
# losses must be the same); then the CPU on all cores. Prints each run and a comparison; the
# metrics JSON of every run go to $OUT/metrics2.tgz. Build as bench/gpu_check.sh says, with the
# crate's lib test binary copied as GPU_DIR/cuda_lib_tests.
set -uo pipefail
G=${GPU_DIR:-.gpu}; R=${OUT:-/tmp/out}; M=/tmp/m; mkdir -p $M $R
. "$(dirname "$0")/gpu_env.sh"
nvidia-smi -L
step "lib tests (sorts, transposes)"
timeout -k 5 120 $G/cuda_lib_tests --nocapture --test-threads 1 2>&1 | grep -E "test |result|skipped|panicked|assert" | head -20
step "backend tests"
timeout -k 5 120 $G/backend_matches_cpu 2>&1 | grep -E "test |result|panicked|mismatch" | head -20
step "sampler tests"
timeout -k 5 120 $G/sampler_matches_cpu 2>&1 | tail -3
step "dataset"
D=/tmp/products
timeout -k 5 150 $G/fanout --quiet dataset gen --preset products --nodes 2449029 $D > /dev/null
run() { # name binary args...
  local n=$1 b=$2; shift 2
  step "train $n"
  timeout -k 5 120 $b train --dataset $D --epochs 3 --batch-size 8000 --hidden 256 --metrics-out $M/$n.json "$@" 2>&1 | grep -E "^epoch|^test|error" | tail -5
}
for model in gcn sage gat; do
  f=10,25; [ $model = gcn ] && f=15,10,5
  [ -n "${OLD_BIN:-}" ] && run $model-hostT $OLD_BIN --model $model --fanouts $f --device cuda
  run $model-devT $G/fanout --model $model --fanouts $f --device cuda
done
for model in sage gcn gat; do
  f=10,25; [ $model = gcn ] && f=15,10,5
  run $model-cpu $G/fanout --model $model --fanouts $f --device cpu
done
step "compare"
python3 "$(dirname "$0")/metrics_table.py" $M gcn-hostT:gcn-devT gcn-cpu:gcn-devT sage-hostT:sage-devT sage-cpu:sage-devT gat-hostT:gat-devT gat-cpu:gat-devT
tar czf $R/metrics2.tgz -C /tmp m
step done

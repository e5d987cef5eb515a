#!/usr/bin/env bash
# A GPU training step with fewer host waits (docs/cuda.md, "Fewer waits per step"): the build in
# GPU_DIR (default .gpu) against an earlier one (OLD_BIN) on the same machine, GCN 15,10,5, SAGE
# and GAT 10,25 on the products preset at full size, 3 epochs, batch 8000, hidden 256, rows on
# the GPU and read in place from host memory (uva); their losses must be equal (MODELS picks
# other models, e.g. MODELS="gcn gin"). Then a profile
# of the new build's GCN step. Run on the GPU machine from the repository root (GUIDE §5), with
# fanout, backend_matches_cpu, sampler_matches_cpu and cuda_lib_tests built as
# bench/gpu_check.sh says. The log is also kept in $OUT/gpu_step.log, the metrics JSON in
# $OUT/metrics4.tgz.
set -uo pipefail
G=${GPU_DIR:-.gpu}; R=${OUT:-/tmp/out}; M=/tmp/m4; mkdir -p $M $R
. "$(dirname "$0")/gpu_env.sh"
exec > >(tee $R/gpu_step.log) 2>&1
nvidia-smi -L
step "device tests"
for t in backend_matches_cpu sampler_matches_cpu device_group cuda_lib_tests; do
  [ -x $G/$t ] && timeout -k 5 150 $G/$t --test-threads 1 --nocapture 2>&1 | grep -E "^test |test result|panicked|mismatch|comparisons|equal to" | head -20
done
step "dataset"
D=/tmp/products
timeout -k 5 150 $G/fanout --quiet dataset gen --preset products --nodes 2449029 $D > /dev/null
run() { # name binary args...
  local n=$1 b=$2; shift 2
  step "train $n"
  timeout -k 5 120 $b train --dataset $D --epochs 3 --batch-size 8000 --hidden 256 --device cuda --metrics-out $M/$n.json "$@" 2>&1 | grep -E "^epoch|^test|error" | tail -4
}
for model in ${MODELS:-gcn sage gat}; do
  f=10,25; [ $model = gcn ] && f=15,10,5
  [ -n "${OLD_BIN:-}" ] && run $model-old $OLD_BIN --model $model --fanouts $f
  run $model-new $G/fanout --model $model --fanouts $f
  [ -n "${OLD_BIN:-}" ] && run $model-olduva $OLD_BIN --model $model --fanouts $f --feature-placement uva
  run $model-newuva $G/fanout --model $model --fanouts $f --feature-placement uva
done
step "compare"
python3 "$(dirname "$0")/metrics_table.py" $M gcn-old:gcn-new gcn-olduva:gcn-newuva sage-old:sage-new sage-olduva:sage-newuva gat-old:gat-new gat-olduva:gat-newuva gin-old:gin-new gin-olduva:gin-newuva
for model in gcn gat; do
  f=10,25; [ $model = gcn ] && f=15,10,5
  step "profile $model (new build, 2 epochs)"
  FANOUT_CUDA_PROFILE=1 timeout -k 5 120 $G/fanout train --dataset $D --epochs 2 --batch-size 8000 --hidden 256 --device cuda --model $model --fanouts $f 2>&1 | grep -A12 "CUDA profile"
done
tar czf $R/metrics4.tgz -C /tmp m4
step done

#!/usr/bin/env bash
# The zero-copy feature gather on a side stream (docs/cuda.md, stop 50), on the GPU machine from
# the repository root (GUIDE §5): the device tests, then epochs with every feature row read in
# place from page-locked host memory (`--feature-placement uva`), GCN 15,10,5, SAGE and GAT
# 10,25, products preset at full size, batch 8000, hidden 256, 4 epochs, OLD_BIN (the build
# before, gathering on the backend stream) and GPU_DIR/fanout (this build) alternated
# old, new, new, old; then GCN with a 20% degree cache whose misses are read in place, and a
# profiled GCN run of this build. FANOUT_CUDA_MAPPED_GATHER_BLOCKS varies the gather's grid
# (runs named newfull and new4). Every old/new pair must give the same losses.
#
# Build here first (bench/gpu_check.sh lists the binaries) and carry GPU_DIR (default .gpu):
# fanout, fanout-prev (the old build, unless OLD_BIN names another), backend_matches_cpu,
# sampler_matches_cpu, cuda_lib_tests, and optionally backend_mutant: backend_matches_cpu
# built from a tree whose side-stream gather records no write event on its output (the readers
# then do not wait), which must fail the ordering test. In stop 50 the mutant passed the
# kernel `let (p, s) = out.data.device_ptr_mut(side); std::mem::forget(s);` and `.arg(&p)`
# instead of `.arg(&mut out.data)` in crates/fanout-cuda/src/backend/mapped.rs.
# Output: the log on stdout and in $OUT/uva_overlap.log, the metrics JSON in $OUT/uva.tgz.
set -uo pipefail
G=${GPU_DIR:-.gpu}; R=${OUT:-/tmp/out}; M=/tmp/m-uva; mkdir -p $M $R
OLD=${OLD_BIN:-$G/fanout-prev}
. "$(dirname "$0")/gpu_env.sh"
exec > >(tee $R/uva_overlap.log) 2>&1
nvidia-smi -L; nproc
step "backend tests"
timeout -k 5 150 $G/backend_matches_cpu --nocapture 2>&1 | grep -E "comparisons|test result|panicked|FAILED|failed" | head -30
step "ordering test, mutant build (must fail)"
[ -x $G/backend_mutant ] && timeout -k 5 60 $G/backend_mutant side_stream --nocapture 2>&1 | grep -E "comparisons|test result|not bit" | head -6
step "lib and sampler tests"
timeout -k 5 60 $G/cuda_lib_tests 2>&1 | tail -2
timeout -k 5 120 $G/sampler_matches_cpu 2>&1 | tail -2
D=${DATA:-/tmp/products}
if [ ! -f $D/meta.txt ]; then
  step "products dataset (2449029)"
  timeout -k 5 150 $G/fanout --quiet dataset gen --preset products --nodes 2449029 $D > /dev/null
fi
run() { # name binary args...
  local n=$1 b=$2; shift 2
  step "train $n"
  timeout -k 5 120 $b train --dataset $D --epochs 4 --batch-size 8000 --hidden 256 --device cuda \
    --metrics-out $M/$n.json "$@" 2>&1 | grep -E "^epoch|^test|error" | tail -5
}
# new-full: this build with the gather's grid as large as the rows need (as before), on the
# side stream; new-4: four thread blocks per multiprocessor; new: the default (two).
for model in gcn sage gat; do
  f=10,25; [ $model = gcn ] && f=15,10,5
  run $model-uva-old1 $OLD --model $model --fanouts $f --feature-placement uva
  run $model-uva-new1 $G/fanout --model $model --fanouts $f --feature-placement uva
  if [ $model != sage ]; then
    FANOUT_CUDA_MAPPED_GATHER_BLOCKS=0 run $model-uva-newfull $G/fanout --model $model --fanouts $f --feature-placement uva
    FANOUT_CUDA_MAPPED_GATHER_BLOCKS=4 run $model-uva-new4 $G/fanout --model $model --fanouts $f --feature-placement uva
  fi
  run $model-uva-new2 $G/fanout --model $model --fanouts $f --feature-placement uva
  run $model-uva-old2 $OLD --model $model --fanouts $f --feature-placement uva
done
for b in old new; do
  bin=$G/fanout; [ $b = old ] && bin=$OLD
  run gcn-uvacache-$b $bin --model gcn --fanouts 15,10,5 --feature-placement uva --cache-policy degree --cache-ratio 0.2
done
step "profile, GCN uva, this build (2 epochs)"
FANOUT_CUDA_PROFILE=1 timeout -k 5 90 $G/fanout train --dataset $D --epochs 2 --batch-size 8000 \
  --hidden 256 --device cuda --model gcn --fanouts 15,10,5 --feature-placement uva 2>&1 |
  grep -E "^epoch|CUDA profile|side:|cublas|spmm|copy|gather" | head -20
step "compare"
python3 "$(dirname "$0")/metrics_table.py" $M gcn-uva sage-uva gat-uva \
  gcn-uva-old1:gcn-uva-newfull gcn-uva-old1:gcn-uva-new4 gat-uva-old1:gat-uva-newfull gat-uva-old1:gat-uva-new4 \
  gcn-uva-old1:gcn-uva-new1 gcn-uva-old2:gcn-uva-new2 sage-uva-old1:sage-uva-new1 \
  sage-uva-old2:sage-uva-new2 gat-uva-old1:gat-uva-new1 gat-uva-old2:gat-uva-new2 \
  gcn-uvacache-old:gcn-uvacache-new
tar czf $R/uva.tgz -C /tmp m-uva
step done

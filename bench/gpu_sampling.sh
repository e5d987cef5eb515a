#!/usr/bin/env bash
# The GPU samplers' checks (docs/cuda.md, "GPU sampling"), run on the GPU machine from the
# repository root (GUIDE §5): the sampler tests; the sampling bench, uniform, weighted and
# random walks, on the products preset with random arc weights; and training runs per GPU
# sampler kind, the batches drawn on the GPU (arcs on the device, then pinned) and on the host
# (the losses must agree). Build here first and carry
# GPU_DIR (default .gpu) with:
#
#   cargo build --release --features cuda
#   cargo build --release --features cuda -p fanout-cuda --example cuda_sampling
#   cargo test --release --features cuda -p fanout-cuda --test sampler_matches_cpu --no-run
#   mkdir -p .gpu; cp target/release/fanout target/release/examples/cuda_sampling .gpu/
#
# with the test binary copied as .gpu/sampler_matches_cpu. Output: the log on stdout and in
# $OUT/gpu_sampling.log as it goes, the runs' metrics JSON in $OUT/sampling-metrics.tgz.
set -uo pipefail
G=${GPU_DIR:-.gpu}
R=${OUT:-/tmp/out}
M=/tmp/ms
mkdir -p $M $R
. "$(dirname "$0")/gpu_env.sh"
exec > >(tee $R/gpu_sampling.log) 2>&1
nvidia-smi -L; nproc
F=$G/fanout
step "1 sampler tests"
timeout -k 5 180 $G/sampler_matches_cpu --nocapture --test-threads 1 2>&1 | tail -15
step "2 products dataset (2449029) with random arc weights"
D=/tmp/products
timeout -k 5 150 $F --quiet dataset gen --preset products --nodes 2449029 $D > /dev/null
timeout -k 5 60 $F --quiet dataset weights $D --scheme random > /dev/null
step "3 sampling bench"
timeout -k 5 120 $G/cuda_sampling $D 8000 15,10,5 20
timeout -k 5 120 $G/cuda_sampling $D 8000 10,25 20
run() { # name, args...
  local n=$1; shift
  step "train $n"
  timeout -k 5 100 $F train --dataset $D --epochs 3 --batch-size 8000 --hidden 256 --device cuda \
    --metrics-out $M/$n.json "$@" 2>&1 | grep -v '^\s*$' | grep -iv 'progress' | tail -7
}
run sage-w-sdev --model sage --fanouts 10,25 --sampler weighted --sampling-placement device
run sage-w-suva --model sage --fanouts 10,25 --sampler weighted --sampling-placement uva
run sage-w-shost --model sage --fanouts 10,25 --sampler weighted --sampling-placement host
run pinsage-sdev --model pinsage --fanouts 5,5,5 --sampling-placement device
run pinsage-suva --model pinsage --fanouts 5,5,5 --sampling-placement uva
run pinsage-shost --model pinsage --fanouts 5,5,5 --sampling-placement host
step "compare losses"
python3 "$(dirname "$0")/metrics_table.py" $M sage-w-shost:sage-w-sdev sage-w-shost:sage-w-suva \
  pinsage-shost:pinsage-sdev pinsage-shost:pinsage-suva
tar czf $R/sampling-metrics.tgz -C /tmp ms
step done

#!/usr/bin/env bash
# The feature cache on the GPU (docs/cuda.md, "The device cache on a GPU, measured"): the build
# in GPU_DIR (default .gpu) against an earlier one (OLD_BIN, when set) on the same machine, on
# the products preset at full size, 3 epochs, batch 8000, hidden 256, sampled on the host, a
# degree cache of 20%: SAGE 10,25 with Match and GCN 15,10,5 without, the cache on the GPU with
# its misses uploaded (device) or read in place (uva), auto, and every row uploaded (host).
# Runs of one model must give equal losses (printed side by side). Then the kernel bench. Run
# on the GPU machine from the repository root (GUIDE §5), with fanout, backend_matches_cpu and
# cuda_kernels built as bench/gpu_check.sh says. The log is also kept in $OUT/gpu_cache.log.
set -uo pipefail
G=${GPU_DIR:-.gpu}; R=${OUT:-/tmp/out}; M=/tmp/m5; mkdir -p $M $R
. "$(dirname "$0")/gpu_env.sh"
exec > >(tee $R/gpu_cache.log) 2>&1
nvidia-smi -L
step "staging test"
timeout -k 5 120 $G/backend_matches_cpu 2>&1 | grep -E "staging|test result"
D=/tmp/products
timeout -k 5 150 $G/fanout --quiet dataset gen --preset products --nodes 2449029 $D > /dev/null
run() { # name binary args...
  local n=$1 b=$2; shift 2
  step "$n"
  timeout -k 5 100 $b train --dataset $D --epochs 3 --batch-size 8000 --hidden 256 --device cuda \
    --sampling-placement host --metrics-out $M/$n.json "$@" 2>&1 | grep -E "^feature|^the feature|^epoch|^test|error" | tail -6
}
S="--model sage --fanouts 10,25"
N="--model gcn --fanouts 15,10,5"
C="--cache-policy degree --cache-ratio 0.2"
[ -n "${OLD_BIN:-}" ] && run sage-device-old $OLD_BIN $S $C --match-reorder --feature-placement device
run sage-device $G/fanout $S $C --match-reorder --feature-placement device
run sage-uva $G/fanout $S $C --match-reorder --feature-placement uva
run sage-auto $G/fanout $S $C --match-reorder
run sage-upload $G/fanout $S --feature-placement host
[ -n "${OLD_BIN:-}" ] && run gcn-upload-old $OLD_BIN $N --feature-placement host
run gcn-upload $G/fanout $N --feature-placement host
[ -n "${OLD_BIN:-}" ] && run gcn-device-old $OLD_BIN $N $C --feature-placement device
run gcn-device $G/fanout $N $C --feature-placement device
run gcn-auto $G/fanout $N $C
step "compare"
python3 "$(dirname "$0")/metrics_table.py" $M sage gcn
step "kernels"
timeout -k 5 60 $G/cuda_kernels 2>&1 | tail -12

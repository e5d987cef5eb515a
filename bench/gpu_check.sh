#!/usr/bin/env bash
# The GPU checks of docs/cuda.md ("GPU sampling, the device cache and Python, measured"), run on
# the GPU machine from the repository root (GUIDE §5). Build GPU_DIR (default .gpu) here first
# with `SKIP_WHL=1 bash bench/gpu_prepare.sh` and carry it: the CLI, the examples
# cuda_sampling and cuda_kernels, fanout-cuda's test executables (sampler_matches_cpu,
# backend_matches_cpu, device_group for NCCL, cuda_lib_tests for its unit tests) and the Python
# wheel, all with `--features cuda`, and the CPU example split_speed. Optionally, where the GPU machine has
# Open MPI (`mpirun`), a build with `--features cuda,mpi` copied as .gpu/fanout-mpi runs two
# ranks sharing the GPU (one process per GPU on a machine with several).
# ONLY_TESTS=1 stops after the tests and two short runs of the embedded default (cuda, cpu).
# Output: the log on stdout and in $OUT/gpu_check.log as it goes (a call cut off at its limit
# still returns what ran), the metrics JSON of every run in $OUT/metrics.tgz.
set -uo pipefail
G=${GPU_DIR:-.gpu}
R=${OUT:-/tmp/out}
M=/tmp/m
mkdir -p $M $R
rm -f $M/*.json # a warm machine keeps /tmp: no earlier call's JSON may pass for this call's
. "$(dirname "$0")/gpu_env.sh"
exec > >(tee $R/gpu_check.log) 2>&1
nvidia-smi -L; nproc
F=$G/fanout
step "1 sampler tests"
timeout -k 5 120 $G/sampler_matches_cpu --nocapture --test-threads 1 2>&1 | tail -15
step "2 backend tests"
timeout -k 5 120 $G/backend_matches_cpu 2>&1 | tail -4
[ -x $G/cuda_lib_tests ] && timeout -k 5 60 $G/cuda_lib_tests 2>&1 | tail -3
[ -x $G/device_group ] && timeout -k 5 60 $G/device_group 2>&1 | tail -3
if [ -n "${ONLY_TESTS:-}" ]; then
  # The tests and one short run of the embedded default on the GPU against the CPU: a quick
  # check of a new build (ONLY_TESTS=1) before the longer steps below.
  step "2b embedded default, cuda and cpu, 2 epochs"
  for dev in cuda cpu; do
    timeout -k 5 120 $F train --device $dev --epochs 2 --metrics-out $R/default-$dev.json 2>&1 | tail -3
  done
  exit 0
fi
step "3 products dataset (2449029)"
D=/tmp/products
[ -f $D/meta.txt ] || time timeout -k 5 150 $F --quiet dataset gen --preset products --nodes 2449029 $D > /dev/null
step "4 sampling bench"
timeout -k 5 60 $G/cuda_sampling $D 8000 15,10,5 20
timeout -k 5 60 $G/cuda_sampling $D 8000 10,25 20
# The extract stage of a cache on the GPU against the plain gather, on every core.
[ -x $G/split_speed ] && timeout -k 5 60 $G/split_speed $D 8000 0.2
run() { # name, args...
  local n=$1; shift
  step "train $n"
  timeout -k 5 100 $F train --dataset $D --epochs 3 --batch-size 8000 --hidden 256 --device cuda --metrics-out $M/$n.json "$@" 2>&1 | grep -v '^\s*$' | grep -iv 'progress' | tail -7
}
run gcn-sdev --model gcn --fanouts 15,10,5 --sampling-placement device
run gcn-shost --model gcn --fanouts 15,10,5 --sampling-placement host
run sage-sdev --model sage --fanouts 10,25 --sampling-placement device
run sage-shost --model sage --fanouts 10,25 --sampling-placement host
run gat-sdev --model gat --fanouts 10,25 --sampling-placement device
run gat-shost --model gat --fanouts 10,25 --sampling-placement host
run sage-cache-dev --model sage --fanouts 10,25 --sampling-placement host --feature-placement device --cache-policy degree --cache-ratio 0.2 --match-reorder
run sage-cache-uva --model sage --fanouts 10,25 --sampling-placement host --feature-placement uva --cache-policy degree --cache-ratio 0.2 --match-reorder
run sage-cache-host --model sage --fanouts 10,25 --sampling-placement host --feature-placement host --cache-policy degree --cache-ratio 0.2 --match-reorder
run sage-upload --model sage --fanouts 10,25 --sampling-placement host --feature-placement host
step "compare losses"
python3 "$(dirname "$0")/metrics_table.py" $M gcn-shost:gcn-sdev sage-shost:sage-sdev gat-shost:gat-sdev sage-cache-host:sage-cache-dev sage-cache-host:sage-cache-uva
if command -v mpirun > /dev/null && [ -x $G/fanout-mpi ]; then
  # Two data-parallel ranks on one GPU (both take GPU 0): gradients summed through MPI.
  step "two MPI ranks on the GPU"
  timeout -k 5 150 mpirun --allow-run-as-root --oversubscribe -np 2 $G/fanout-mpi train --dataset $D \
    --epochs 3 --batch-size 8000 --hidden 256 --device cuda --strategy data-parallel \
    --model sage --fanouts 10,25 --metrics-out $M/sage-mpi2.json 2>&1 | grep -v '^\s*$' | tail -5
else
  step "two MPI ranks on the GPU: skipped (no mpirun or no $G/fanout-mpi)"
fi
step "python on the GPU"
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site $G/*.whl && \
  PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 timeout -k 5 120 python3 bench/gpu_check_python.py
step "out of memory"
timeout -k 5 120 $F train --dataset $D --epochs 1 --model sage --hidden 8192 --batch-size 200000 --fanouts 25,25 --device cuda --sampling-placement device > $R/oom.txt 2>&1
echo "exit $?"; grep -v '^\s*$' $R/oom.txt | tail -4; grep -c panicked $R/oom.txt
step "kernels"
timeout -k 5 60 $G/cuda_kernels 2>&1 | tail -12
tar czf $R/metrics.tgz -C /tmp m
step done

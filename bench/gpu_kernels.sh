#!/usr/bin/env bash
# FastGL's Memory-Aware aggregation against the plain kernels, the row gathers against
# torch.index_select, and where a GPU training step's time goes (docs/cuda.md, "Memory-Aware
# aggregation and the step profile"). Run on the GPU machine from the repository root (GUIDE §5)
# with the binaries built as bench/gpu_check.sh says in GPU_DIR (default .gpu): fanout,
# cuda_kernels, backend_matches_cpu. Prints the log (also kept in $OUT/gpu_kernels.log); the
# metrics JSON go to $OUT/metrics3.tgz.
set -uo pipefail
G=${GPU_DIR:-.gpu}; R=${OUT:-/tmp/out}; M=/tmp/m3; mkdir -p $M $R
. "$(dirname "$0")/gpu_env.sh"
exec > >(tee $R/gpu_kernels.log) 2>&1
nvidia-smi -L
step "backend tests (the Memory-Aware kernels against the plain ones and the CPU)"
timeout -k 5 150 $G/backend_matches_cpu --nocapture --test-threads 1 2>&1 | grep -E "test |result|panicked|mismatch|comparisons|not bit|relative error" | head -40
step "kernels: DST FANOUT COLS"
for shape in "100000 10 256" "100000 25 100" "400000 5 100" "120000 10 256" "8000 15 256"; do
  echo "--- $shape"
  timeout -k 5 90 $G/cuda_kernels $shape 2>&1 | grep -v "^gemm\|device copy"
done
timeout -k 5 90 $G/cuda_kernels 2>&1 | grep "device copy"
step "torch.index_select"
timeout -k 5 90 python3 bench/gpu_gather_torch.py
step "dataset"
D=/tmp/products
timeout -k 5 150 $G/fanout --quiet dataset gen --preset products --nodes 2449029 $D > /dev/null
run() { # name args...
  local n=$1; shift
  step "train $n"
  timeout -k 5 120 $G/fanout train --dataset $D --epochs 3 --batch-size 8000 --hidden 256 --device cuda --metrics-out $M/$n.json "$@" 2>&1 | grep -E "^epoch|^test|error" | tail -4
}
for model in gcn sage gat; do
  f=10,25; [ $model = gcn ] && f=15,10,5
  FANOUT_CUDA_GRAPH_KERNELS=plain run $model-plain --model $model --fanouts $f
  run $model-ma --model $model --fanouts $f
  run $model-uva --model $model --fanouts $f --feature-placement uva
  run $model-host --model $model --fanouts $f --feature-placement host
done
step "compare"
python3 - $M <<'PY'
import json, sys, os
d = sys.argv[1]
m = {f[:-5]: json.load(open(os.path.join(d, f))) for f in sorted(os.listdir(d)) if f.endswith('.json')}
for k, v in m.items():
    e = v['epochs']
    print(f"{k:12s} median {v['median_epoch_s']:.3f}s  epochs " + " ".join(f"{x['wall_s']:.3f}" for x in e)
          + f"  sample {e[-1]['sample_s']:.3f} train {e[-1]['train_s']:.3f}"
          + f"  loss {[x['loss'] for x in e]}  test {v['test_acc']}")
for mo in ['gcn', 'sage', 'gat']:
    a, b = m.get(mo + '-plain'), m.get(mo + '-ma')
    if a and b:
        print(mo, 'memory-aware vs plain: losses equal', [x['loss'] for x in a['epochs']] == [x['loss'] for x in b['epochs']],
              'test equal', a['test_acc'] == b['test_acc'], 'speed-up %.2fx' % (a['median_epoch_s'] / b['median_epoch_s']))
    u, h = m.get(mo + '-uva'), m.get(mo + '-host')
    if u and h and b:
        print(mo, 'uva vs host rows: losses equal', [x['loss'] for x in u['epochs']] == [x['loss'] for x in h['epochs']] == [x['loss'] for x in b['epochs']],
              'uva %.3fs host %.3fs device %.3fs: uva / host speed-up %.2fx' % (u['median_epoch_s'], h['median_epoch_s'], b['median_epoch_s'], h['median_epoch_s'] / u['median_epoch_s']),
              'first epochs uva %.3f host %.3f device %.3f' % (u['epochs'][0]['wall_s'], h['epochs'][0]['wall_s'], b['epochs'][0]['wall_s']),
              'host GB/epoch uva %.2f host %.2f' % (u['epochs'][-1]['extract']['bytes_from_host'] / 1e9, h['epochs'][-1]['extract']['bytes_from_host'] / 1e9))
PY
for run in gcn-ma gat-ma; do
  model=${run%-*}; k=plain; [ ${run#*-} = ma ] && k=memory-aware
  f=10,25; [ $model = gcn ] && f=15,10,5
  step "profile $run (2 epochs, events around every call on the backend's stream)"
  FANOUT_CUDA_GRAPH_KERNELS=$k FANOUT_CUDA_PROFILE=1 timeout -k 5 120 $G/fanout train --dataset $D --epochs 2 --batch-size 8000 --hidden 256 --device cuda --model $model --fanouts $f --metrics-out $M/profile-$run.json 2>&1 | grep -A40 "CUDA profile" | head -42
  python3 -c "import json,sys; v=json.load(open(sys.argv[1])); print('epochs', [round(e['wall_s'],3) for e in v['epochs']], 'train_s', [round(e['train_s'],3) for e in v['epochs']])" $M/profile-$run.json
done
tar czf $R/metrics3.tgz -C /tmp m3
step done

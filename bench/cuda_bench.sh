#!/usr/bin/env bash
# The CUDA benchmark of issue 21, run on the GPU machine (GUIDE §5) from the repository root.
# That machine has no Rust toolchain: build here first with `SKIP_WHL=1 bash bench/gpu_prepare.sh`,
# which puts `fanout` and `cuda_kernels` (built with --features cuda) in the ignored folder .gpu/,
# and carry that folder;
# then, there: `bash bench/cuda_bench.sh` (environment: GPU_DIR=.gpu, OUT=directory for the
# metrics JSON, NODES=vertices of the products preset (default: the preset's own small scale;
# 2449029 is ogbn-products' size), EPOCHS=3, THREADS=CPU threads of the CPU runs (default: all
# cores), MODELS="gcn sage" (gcn runs 15,10,5; any other model 10,25)).
#
# What it runs, three runs per model on the same machine, in turn: on the GPU with every
# feature row on it (--feature-placement device), on the GPU fed rows gathered on the host
# (--feature-placement host), and on the CPU: products preset, GCN 15,10,5 and SAGE 10,25,
# batch 8000, hidden 256 (the settings of issue 21).
# It prints, per case and device, the median epoch and its sample / extract / train split (the
# stages overlap: the epoch is about the slowest stage, not their sum), seeds per second, the
# final loss and test accuracy; then the graph kernels and the device feature gather against
# the device's copy rate (examples/cuda_kernels.rs) and torch.index_select on the same shapes.
#
# Sampling placement is the default, `auto`, which samples k-hop batches on the GPU when the
# topology fits there (since stop 35), so the GPU runs' sample column is the GPU sampler's
# time. Not measured here: the sampler alone, in seeds and edges per second (`cuda_sampling` in
# bench/gpu_check.sh), and PyTorch Geometric (bench/pyg_vs_fanout_gpu.sh).
set -euo pipefail
GPU_DIR=${GPU_DIR:-.gpu}
OUT=${OUT:-/tmp/cuda-bench}
EPOCHS=${EPOCHS:-3}
THREADS=${THREADS:-$(nproc)}
MODELS=${MODELS:-gcn sage}
BIN=$GPU_DIR/fanout
mkdir -p "$OUT"

# The CUDA libraries fanout loads at run time (libnvrtc, libcublas) may sit outside the default
# search path on that machine (the CUDA toolkit's lib64, or the pip wheels of PyTorch).
for lib in libnvrtc.so libcublas.so; do
  if ! ldconfig -p | grep -q "$lib"; then
    dir=$(find /usr/local /usr/lib /opt \( -name "$lib" -o -name "$lib.*" \) 2>/dev/null | head -1 | xargs -r dirname)
    [ -n "$dir" ] && export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
done
echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
nvidia-smi -L || true

DATA=$OUT/products
if [ ! -f "$DATA/meta.txt" ]; then
  echo "writing the products preset (${NODES:-default} vertices)" >&2
  "$BIN" --quiet dataset gen --preset products ${NODES:+--nodes "$NODES"} "$DATA" > /dev/null
fi

fanouts_of() { case $1 in gcn) echo 15,10,5 ;; *) echo 10,25 ;; esac; }
# Three runs per model: the GPU with every feature row on it (--feature-placement device), the
# GPU fed rows gathered on the host (host), the CPU.
for model in $MODELS; do
  for run in cuda-device cuda-host cpu; do
    case $run in
      cuda-device) args=(--device cuda --feature-placement device) ;;
      cuda-host) args=(--device cuda --feature-placement host) ;;
      cpu) args=(--device cpu) ;;
    esac
    echo "[$model $run]" >&2
    if ! "$BIN" --quiet train --dataset "$DATA" "${args[@]}" --model "$model" --fanouts "$(fanouts_of "$model")" \
      --batch-size 8000 --hidden 256 --epochs "$EPOCHS" --threads "$THREADS" \
      --metrics-out "$OUT/$model-$run.json" > /dev/null; then
      echo "[$model $run] failed" >&2
    fi
  done
done

python3 - "$OUT" "$MODELS" <<'PY'
import json, sys, statistics as st
out, models = sys.argv[1], sys.argv[2].split()
print("| model | run | epoch s | sample s | extract s | train s | seeds/s | CPU / this epoch | loss (last epoch) | test acc |")
print("|---|---|---|---|---|---|---|---|---|---|")
for model in models:
    try:
        cpu_epoch = json.load(open(f"{out}/{model}-cpu.json"))["median_epoch_s"]
    except (OSError, ValueError):
        cpu_epoch = float("nan")
    for dev in ("cuda-device", "cuda-host", "cpu"):
        try:
            j = json.load(open(f"{out}/{model}-{dev}.json"))
        except (OSError, ValueError) as e:
            print(f"| {model} | {dev} | missing ({e}) |")
            continue
        later = j["epochs"][1:] or j["epochs"]
        med = lambda k: st.median(e[k] for e in later)
        seeds = st.median(e["seeds"] / e["wall_s"] for e in later)
        print(f"| {model} | {dev} | {j['median_epoch_s']:.3f} | {med('sample_s'):.3f} | {med('extract_s'):.3f} | "
              f"{med('train_s'):.3f} | {seeds:,.0f} | {cpu_epoch / j['median_epoch_s']:.2f}x | "
              f"{j['epochs'][-1]['loss']:.4f} | {j['test_acc']:.4f} |")
PY

if [ -x "$GPU_DIR/cuda_kernels" ]; then
  "$GPU_DIR/cuda_kernels"
fi
# PyTorch's index_select on the same shapes as the example's feature gather (uniform random ids).
python3 - <<'PY' || echo "torch.index_select: not measured (no PyTorch with CUDA here)"
import torch
rows, feat, n = 2_449_029, 100, 1_000_000
table = torch.rand(rows, feat, device="cuda")
ids = torch.randint(0, rows, (n,), device="cuda")
for _ in range(2):
    torch.index_select(table, 0, ids)
torch.cuda.synchronize()
times = []
for _ in range(10):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record(); torch.index_select(table, 0, ids); b.record(); torch.cuda.synchronize()
    times.append(a.elapsed_time(b) / 1e3)
t = sorted(times)[5]
print(f"torch.index_select (same shapes) {t * 1e3:.3f} ms {2 * n * feat * 4 / t / 1e9:.1f} GB/s (ids already on the device)")
PY

#!/usr/bin/env bash
# Epoch time of data-parallel training against one worker, side by side in one run: N
# in-process workers (`--workers N`) and, when an MPI build exists ($BIN_MPI, made by
# `cargo build --release --features mpi --target-dir target/mpi`), N MPI processes. Same
# dataset, model, global batch, seed and total threads for every N.
#
#   bash bench/workers_scaling.sh                                # N = 1 2, this machine's cores
#   NS="1 2 4 8" THREADS=16 RUNS=3 bash bench/workers_scaling.sh  # the GPU machine's 16 cores
#   SUMMARY_ONLY=1 bash bench/workers_scaling.sh
#
# Configurations alternate within each run (load on a shared machine hits all of them). Per
# run we take the median epoch excluding epoch 0, report the median over runs, the speed-up
# over N = 1 of the same run, and the all-reduce's share of the train stage (mean over
# workers). PARTITION=1 trains over a PaGraph partition with N parts instead of sliced batches.
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${THREADS:-$(nproc)}
RUNS=${RUNS:-3}
EPOCHS=${EPOCHS:-4}
NS=${NS:-"1 2"}
MODEL=${MODEL:-sage}
FANOUTS=${FANOUTS:-10,25}
BATCH=${BATCH:-1024}
HIDDEN=${HIDDEN:-256}
OUT=${OUT:-bench/out/scaling}
SHARED=${SHARED:-../shared/datasets}
DATASETS=${DATASETS:-"cnr2000 products"}
BIN=${BIN:-target/release/fanout}
BIN_MPI=${BIN_MPI:-target/mpi/release/fanout}
MPIRUN=${MPIRUN:-"mpirun --oversubscribe --bind-to none"}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
[ -n "${NO_BUILD:-}" ] || cargo build --release -q
mkdir -p "$OUT"
[ -f "$OUT/cnr2000/meta.txt" ] || $BIN --quiet dataset import --format npy --random-features 128 \
  --train-frac 0.1 "$SHARED/cnr2000" "$OUT/cnr2000" > /dev/null
[ -f "$OUT/products/meta.txt" ] || $BIN --quiet dataset gen --preset products "$OUT/products" > /dev/null
COMMON="--model $MODEL --fanouts $FANOUTS --batch-size $BATCH --hidden $HIDDEN --lr 0.003 --epochs $EPOCHS --eval-every 0"
MODES="local"
[ -x "$BIN_MPI" ] && command -v mpirun > /dev/null && MODES="local mpi"
[ -n "${SUMMARY_ONLY:-}" ] ||
for ds in $DATASETS; do
  for n in $NS; do
    if [ -n "${PARTITION:-}" ] && [ "$n" -gt 1 ] && [ ! -d "$OUT/$ds/partitions/pagraph-$n" ]; then
      $BIN --quiet dataset partition --method pagraph --parts "$n" "$OUT/$ds" > /dev/null
    fi
  done
  for r in $(seq "$RUNS"); do
    for n in $NS; do
      part=""
      [ -n "${PARTITION:-}" ] && [ "$n" -gt 1 ] && part="--partition pagraph-$n"
      for mode in $MODES; do
        [ "$mode" = mpi ] && [ "$n" = 1 ] && continue
        echo "[$ds run $r/$RUNS] $mode N=$n" >&2
        f="$OUT/$ds-$mode-$n-$r.json"
        if [ "$mode" = local ]; then
          $BIN --quiet train --dataset "$OUT/$ds" $COMMON --seed "$r" --threads "$THREADS" \
            --workers "$n" $part --metrics-out "$f" > /dev/null
        else
          $MPIRUN -np "$n" "$BIN_MPI" --quiet train --dataset "$OUT/$ds" $COMMON --seed "$r" \
            --threads $(( THREADS / n > 0 ? THREADS / n : 1 )) $part --metrics-out "$f" > /dev/null
        fi
      done
    done
  done
done
python3 - "$OUT" "$RUNS" "$DATASETS" "$NS" "$MODES" "$COMMON --threads $THREADS" <<'PY'
import json, sys, statistics as st, os
out, runs, datasets, ns, modes, common = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split(), sys.argv[5].split(), sys.argv[6]
print(f"settings: {common}\n")
print("| dataset | workers | launch | median epoch s | speed-up over 1 worker (median of per-run ratios) | per run | all-reduce share of train stage | all-reduce MB per epoch |")
print("|---|---|---|---|---|---|---|---|")
for ds in datasets:
    one = [json.load(open(f"{out}/{ds}-local-1-{r}.json")) for r in range(1, runs + 1)]
    for n in ns:
        for mode in modes:
            if not os.path.exists(f"{out}/{ds}-{mode}-{n}-1.json"):
                continue
            js = [json.load(open(f"{out}/{ds}-{mode}-{n}-{r}.json")) for r in range(1, runs + 1)]
            ratios = [o["median_epoch_s"] / j["median_epoch_s"] for o, j in zip(one, js)]
            share, mb = [], []
            for j in js:
                for e in j["epochs"][1:]:
                    for w in e["workers"]:
                        share.append(w["allreduce_s"] / max(w["train_s"], 1e-9))
                    mb.append(sum(w["allreduce_bytes"] for w in e["workers"]) / 1e6)
            sh = f"{100 * st.mean(share):.1f}%" if share else "-"
            m = f"{st.mean(mb):.1f}" if mb else "0"
            print(f"| {ds} | {n} | {mode} | {st.median(j['median_epoch_s'] for j in js):.3f} "
                  f"| {st.median(ratios):.2f}x | {', '.join(f'{x:.2f}' for x in ratios)} | {sh} | {m} |")
PY

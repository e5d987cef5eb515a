#!/usr/bin/env bash
# Epoch time side by side: `fanout train` vs DGL on CPU (bench/dgl_train.py), same model,
# fanouts, batch size, hidden size, learning rate and threads, on the same dataset directory.
#
#   bash bench/train_vs_dgl.sh                      # cnr2000 (128-dim random features, 10% train) + products preset
#   DATASETS=products RUNS=3 EPOCHS=5 bash bench/train_vs_dgl.sh
#   SUMMARY_ONLY=1 NO_BUILD=1 bash bench/train_vs_dgl.sh  # only the table, from $OUT
#
# Each run trains EPOCHS epochs and evaluates once at the end (validation and test sets sampled
# with the training fanouts). The two alternate RUNS times (load changes on a shared machine hit
# both); per run we take the median epoch time excluding epoch 0 (warm-up), then report the
# median over runs of that, the ratio, the per-stage busy seconds of the median run (fanout's
# stages overlap in a pipeline, so they may add up to more than the wall time; DGL's run one
# after another in-process) and the final test accuracy. Raw JSON in $OUT/*.json.
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${THREADS:-$(nproc)}
RUNS=${RUNS:-3}
EPOCHS=${EPOCHS:-5}
MODEL=${MODEL:-sage}
FANOUTS=${FANOUTS:-10,25}
BATCH=${BATCH:-1024}
HIDDEN=${HIDDEN:-256}
OUT=${OUT:-bench/out/train}
SHARED=${SHARED:-../shared/datasets}
DATASETS=${DATASETS:-"cnr2000 products"}
PY=${PY:-.venv-peers/bin/python}
BIN=${BIN:-target/release/fanout}
[ -n "${NO_BUILD:-}" ] || cargo build --release -q
[ -x "$PY" ] || bash bench/setup-peers.sh
mkdir -p "$OUT"
if [ ! -f "$OUT/cnr2000/meta.txt" ]; then
  $BIN --quiet dataset import --format npy --random-features 128 --train-frac 0.1 \
    "$SHARED/cnr2000" "$OUT/cnr2000" > /dev/null
fi
if [ ! -f "$OUT/products/meta.txt" ]; then
  $BIN --quiet dataset gen --preset products "$OUT/products" > /dev/null
fi
COMMON="--model $MODEL --fanouts $FANOUTS --batch-size $BATCH --hidden $HIDDEN --lr 0.003 --dropout 0.5 --epochs $EPOCHS --eval-every 0 --threads $THREADS"
[ -n "${SUMMARY_ONLY:-}" ] ||
for ds in $DATASETS; do
  for r in $(seq "$RUNS"); do
    echo "[$ds run $r/$RUNS] fanout" >&2
    $BIN --quiet train --dataset "$OUT/$ds" $COMMON --seed "$r" --metrics-out "$OUT/ours-$ds-$r.json" > /dev/null
    echo "[$ds run $r/$RUNS] dgl" >&2
    DGLBACKEND=pytorch "$PY" bench/dgl_train.py --dataset "$OUT/$ds" $COMMON --seed "$r" \
      2> /dev/null > "$OUT/dgl-$ds-$r.json"
  done
done
python3 - "$OUT" "$RUNS" "$DATASETS" "$COMMON" <<'PY'
import json, sys, statistics as st
out, runs, datasets, common = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4]
print(f"settings: {common}\n")
print("| dataset | fanout epoch s | DGL epoch s | DGL / fanout (median of per-run ratios; each run) | fanout sample / extract / train s | DGL sample / extract / train s | fanout test acc | DGL test acc |")
print("|---|---|---|---|---|---|---|---|")
for ds in datasets:
    row = {}
    load = lambda who: [json.load(open(f"{out}/{who}-{ds}-{r}.json")) for r in range(1, runs + 1)]
    ratios = [d["median_epoch_s"] / o["median_epoch_s"] for o, d in zip(load("ours"), load("dgl"))]
    for who in ["ours", "dgl"]:
        js = load(who)
        med = st.median(j["median_epoch_s"] for j in js)
        j = min(js, key=lambda j: abs(j["median_epoch_s"] - med))
        stage = lambda k: st.median(e[k] for e in j["epochs"][1:] or j["epochs"])
        row[who] = (med, f"{stage('sample_s'):.2f} / {stage('extract_s'):.2f} / {stage('train_s'):.2f}",
                    st.mean(j["test_acc"] for j in js))
    o, d = row["ours"], row["dgl"]
    each = ", ".join("%.1f" % r for r in ratios)
    print(f"| {ds} | {o[0]:.2f} | {d[0]:.2f} | {st.median(ratios):.2f}x ({each}) | {o[1]} | {d[1]} | {o[2]:.4f} | {d[2]:.4f} |")
PY

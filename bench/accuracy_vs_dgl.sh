#!/usr/bin/env bash
# Test accuracy of `fanout train` vs DGL (bench/dgl_train.py) with the same hyperparameters on
# cora and citeseer (public Planetoid split), GraphSAGE and GCN, mean over SEEDS seeds.
#
#   bash bench/accuracy_vs_dgl.sh                 # 5 seeds, prints a markdown table
#   SEEDS="0 1" EPOCHS=10 bash bench/accuracy_vs_dgl.sh
#   SUMMARY_ONLY=1 bash bench/accuracy_vs_dgl.sh  # only the table, from the JSON already in $OUT
#
# Both evaluate every epoch by sampling the validation and test sets with the training fanouts
# and report the test accuracy of the best-validation epoch. Raw JSON in $OUT/*.json.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/out/accuracy}
SHARED=${SHARED:-../shared/datasets}
SEEDS=${SEEDS:-"0 1 2 3 4"}
EPOCHS=${EPOCHS:-20}
THREADS=${THREADS:-2}
PY=${PY:-.venv-peers/bin/python}
BIN=${BIN:-target/release/fanout}
[ -x "$BIN" ] || cargo build --release -q
[ -x "$PY" ] || bash bench/setup-peers.sh
mkdir -p "$OUT"
COMMON="--hidden 64 --batch-size 32 --epochs $EPOCHS --lr 0.01 --weight-decay 5e-4 --dropout 0.5 --threads $THREADS"
fanouts() { case "$1" in sage) echo 10,25 ;; gcn) echo 15,10,5 ;; esac; }
for ds in cora citeseer; do
  [ -f "$OUT/$ds/meta.txt" ] || $BIN --quiet dataset import --format npy "$SHARED/$ds" "$OUT/$ds" > /dev/null
done
[ -n "${SUMMARY_ONLY:-}" ] ||
for ds in cora citeseer; do
  for m in sage gcn; do
    f=$(fanouts $m)
    for s in $SEEDS; do
      echo "[$ds $m seed $s]" >&2
      $BIN --quiet train --dataset "$OUT/$ds" --model $m --fanouts $f $COMMON --seed $s \
        --metrics-out "$OUT/ours-$ds-$m-$s.json" > /dev/null
      DGLBACKEND=pytorch "$PY" bench/dgl_train.py --dataset "$OUT/$ds" --model $m --fanouts $f \
        $COMMON --seed $s 2> /dev/null > "$OUT/dgl-$ds-$m-$s.json"
    done
  done
done
python3 - "$OUT" "$SEEDS" <<'PY'
import json, sys, statistics as st
out, seeds = sys.argv[1], sys.argv[2].split()
print("| dataset | model | fanout test acc, best-val epoch (mean ± sd) | DGL (mean ± sd) | difference (points) | fanout test acc, last epoch | DGL, last epoch |")
print("|---|---|---|---|---|---|---|")
for ds in ["cora", "citeseer"]:
    for m in ["sage", "gcn"]:
        js = {w: [json.load(open(f"{out}/{w}-{ds}-{m}-{s}.json")) for s in seeds] for w in ["ours", "dgl"]}
        best = {w: [j["test_acc"] * 100 for j in js[w]] for w in js}
        last = {w: [j["epochs"][-1]["test_acc"] * 100 for j in js[w]] for w in js}
        sd = lambda v: st.stdev(v) if len(v) > 1 else 0.0
        o, d = best["ours"], best["dgl"]
        print(f"| {ds} | {m} | {st.mean(o):.1f} ± {sd(o):.1f} | {st.mean(d):.1f} ± {sd(d):.1f} | {st.mean(o) - st.mean(d):+.1f} "
              f"| {st.mean(last['ours']):.1f} | {st.mean(last['dgl']):.1f} |")
PY

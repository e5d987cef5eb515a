#!/usr/bin/env bash
# Test accuracy of data-parallel runs against one worker on cora and citeseer (public
# Planetoid split), GraphSAGE and GCN, SEEDS seeds, for WORKERS workers: with sliced batches
# (every step's one-worker batch split across the workers) and over a PaGraph partition
# (each worker trains its own part's training vertices).
#
#   bash bench/workers_accuracy.sh                  # seeds 0-4, workers 2 and 4, a markdown table
#   SEEDS="0 1" WORKERS="2" bash bench/workers_accuracy.sh
#   SUMMARY_ONLY=1 bash bench/workers_accuracy.sh   # only the table, from the JSON in $OUT
#
# Same hyperparameters as bench/accuracy_vs_dgl.sh. Raw metrics JSON in $OUT/*.json.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/out/workers-accuracy}
SHARED=${SHARED:-../shared/datasets}
SEEDS=${SEEDS:-"0 1 2 3 4"}
WORKERS=${WORKERS:-"2 4"}
EPOCHS=${EPOCHS:-20}
THREADS=${THREADS:-2}
BIN=${BIN:-target/release/fanout}
[ -x "$BIN" ] || cargo build --release -q
mkdir -p "$OUT"
COMMON="--hidden 64 --batch-size 32 --epochs $EPOCHS --lr 0.01 --weight-decay 5e-4 --dropout 0.5 --threads $THREADS"
fanouts() { case "$1" in sage) echo 10,25 ;; gcn) echo 15,10,5 ;; esac; }
hops() { case "$1" in sage) echo 2 ;; gcn) echo 3 ;; esac; }
for ds in cora citeseer; do
  [ -f "$OUT/$ds/meta.txt" ] || $BIN --quiet dataset import --format npy "$SHARED/$ds" "$OUT/$ds" > /dev/null
  for w in $WORKERS; do
    for h in 2 3; do
      name="pagraph-$w-h$h"
      [ -d "$OUT/$ds/partitions/$name" ] ||
        $BIN --quiet dataset partition --method pagraph --parts "$w" --hops "$h" --name "$name" "$OUT/$ds" > /dev/null
    done
  done
done
[ -n "${SUMMARY_ONLY:-}" ] ||
for ds in cora citeseer; do
  for m in sage gcn; do
    f=$(fanouts $m)
    for s in $SEEDS; do
      echo "[$ds $m seed $s]" >&2
      $BIN --quiet train --dataset "$OUT/$ds" --model $m --fanouts $f $COMMON --seed $s \
        --metrics-out "$OUT/$ds-$m-w1-$s.json" > /dev/null
      for w in $WORKERS; do
        $BIN --quiet train --dataset "$OUT/$ds" --model $m --fanouts $f $COMMON --seed $s \
          --workers "$w" --metrics-out "$OUT/$ds-$m-w$w-sliced-$s.json" > /dev/null
        $BIN --quiet train --dataset "$OUT/$ds" --model $m --fanouts $f $COMMON --seed $s \
          --workers "$w" --partition "pagraph-$w-h$(hops $m)" \
          --metrics-out "$OUT/$ds-$m-w$w-pagraph-$s.json" > /dev/null
      done
    done
  done
done
python3 - "$OUT" "$SEEDS" "$WORKERS" <<'PY'
import json, sys, statistics as st
out, seeds, workers = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
def acc(name):
    return [json.load(open(f"{out}/{name}-{s}.json"))["test_acc"] * 100 for s in seeds]
sd = lambda v: st.stdev(v) if len(v) > 1 else 0.0
print("| dataset | model | 1 worker (mean ± sd) | workers | sliced batches | diff | PaGraph partition | diff |")
print("|---|---|---|---|---|---|---|---|")
for ds in ["cora", "citeseer"]:
    for m in ["sage", "gcn"]:
        one = acc(f"{ds}-{m}-w1")
        for w in workers:
            sl, pg = acc(f"{ds}-{m}-w{w}-sliced"), acc(f"{ds}-{m}-w{w}-pagraph")
            print(f"| {ds} | {m} | {st.mean(one):.1f} ± {sd(one):.1f} | {w} "
                  f"| {st.mean(sl):.1f} ± {sd(sl):.1f} | {st.mean(sl) - st.mean(one):+.1f} "
                  f"| {st.mean(pg):.1f} ± {sd(pg):.1f} | {st.mean(pg) - st.mean(one):+.1f} |")
PY

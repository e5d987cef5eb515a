#!/usr/bin/env bash
# PaGraph's computation-aware partition against a random one (the shape of PaGraph's Table 4
# and of its partition study): for K parts of the training set with L = 2 hops, the
# training-vertex balance, the replicated vertices, the share of the graph each part holds,
# and what each worker's degree cache (10% of |V|, ranked by degree inside its part) saves:
# the share of the feature bytes of its sampled input nodes served from the cache, against one
# worker with the same cache ranked by degree over the whole graph.
#
#   bash bench/partition_table.sh                       # products preset + cnr2000, K = 2 and 4
#   DATASETS=cnr2000 KS="2 4 8" bash bench/partition_table.sh
#
# GraphSAGE 10,25, batch 1024, 2 epochs per run (the hit rate is read from epoch 1).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/out/part}
SHARED=${SHARED:-../shared/datasets}
DATASETS=${DATASETS:-"products cnr2000"}
KS=${KS:-"2 4"}
RATIO=${RATIO:-0.1}
THREADS=${THREADS:-$(nproc)}
BIN=${BIN:-target/release/fanout}
[ -n "${NO_BUILD:-}" ] || cargo build --release -q
mkdir -p "$OUT"
[ -f "$OUT/cnr2000/meta.txt" ] || $BIN --quiet dataset import --format npy --random-features 128 \
  --train-frac 0.1 "$SHARED/cnr2000" "$OUT/cnr2000" > /dev/null
[ -f "$OUT/products/meta.txt" ] || $BIN --quiet dataset gen --preset products "$OUT/products" > /dev/null
RUN="--model sage --fanouts 10,25 --batch-size 1024 --hidden 64 --epochs 2 --eval-every 0 --threads $THREADS --cache-policy degree --cache-ratio $RATIO"
for ds in $DATASETS; do
  $BIN --quiet train --dataset "$OUT/$ds" $RUN --metrics-out "$OUT/$ds-single.json" > /dev/null
  for k in $KS; do
    for m in pagraph random; do
      echo "[$ds K=$k $m]" >&2
      $BIN --quiet dataset partition --method $m --parts "$k" --overwrite --json "$OUT/$ds" > "$OUT/$ds-$m-$k-part.json"
      $BIN --quiet train --dataset "$OUT/$ds" $RUN --workers "$k" --partition "$m-$k" \
        --metrics-out "$OUT/$ds-$m-$k.json" > /dev/null
    done
  done
done
python3 - "$OUT" "$DATASETS" "$KS" "$RATIO" <<'PY'
import json, sys, statistics as st
out, datasets, ks, ratio = sys.argv[1], sys.argv[2].split(), sys.argv[3].split(), sys.argv[4]
print(f"| dataset | K | method | partition s | training balance (max/mean) | replicated vertices | part size (% of V, mean) | per-worker cache hit rate, in-part degree, {float(ratio):.0%} of V (mean; min-max) | host MB per worker-epoch (mean) |")
print("|---|---|---|---|---|---|---|---|---|")
for ds in datasets:
    one = json.load(open(f"{out}/{ds}-single.json"))["epochs"][1]
    print(f"| {ds} | 1 | (one worker, global degree) | - | 1.000 | 0% | 100% | {one['hit_rate']:.1%} | {one['extract']['bytes_from_host'] / 1e6:.1f} |")
    for k in ks:
        for m in ["pagraph", "random"]:
            p = json.load(open(f"{out}/{ds}-{m}-{k}-part.json"))
            s = p["stats"]
            w = json.load(open(f"{out}/{ds}-{m}-{k}.json"))["epochs"][1]["workers"]
            hits = [x["hit_rate"] for x in w]
            host = st.mean(x["bytes_from_host"] for x in w) / 1e6
            print(f"| {ds} | {k} | {m} | {p['seconds']:.2f} | {s['train_balance']:.3f} | {s['replicated_pct']:.1f}% | {s['mean_part_pct']:.1f}% "
                  f"| {st.mean(hits):.1%} ({min(hits):.1%}-{max(hits):.1%}) | {host:.1f} |")
PY

#!/usr/bin/env bash
# GSplit's split parallelism against data parallelism at equal worker counts, side by side in
# one run: per epoch, the feature rows every worker loads, the edges every worker computes,
# the bytes split parallelism shuffles, and the median epoch time; plus, over SEEDS seeds,
# the test accuracy of split and one-worker training on cora and citeseer (split computes the
# one-worker step, so the two should agree to rounding).
#
#   bash bench/split_vs_dp.sh
#   WORKERS="2 4" DATASETS="products cnr2000" EPOCHS=4 bash bench/split_vs_dp.sh
#   SUMMARY_ONLY=1 bash bench/split_vs_dp.sh        # only the tables, from $OUT
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/out/split}
SHARED=${SHARED:-../shared/datasets}
BIN=${BIN:-target/release/fanout}
WORKERS=${WORKERS:-2 4}
DATASETS=${DATASETS:-products cnr2000}
EPOCHS=${EPOCHS:-4}
THREADS=${THREADS:-1}
SEEDS=${SEEDS:-1 2 3 4 5}
ACC_DATASETS=${ACC_DATASETS-cora citeseer}
SETTINGS=(--model sage --fanouts 10,25 --batch-size 1024 --hidden 256 --lr 0.003 --eval-every 0)

dataset() { # NAME: writes $OUT/NAME once
  local ds=$1
  [ -f "$OUT/$ds/meta.txt" ] && return
  echo "[$ds] writing the dataset" >&2
  case $ds in
    products | papers) $BIN --quiet dataset gen --preset "$ds" "$OUT/$ds" > /dev/null ;;
    cnr2000) $BIN --quiet dataset import --format npy --random-features 100 --classes 16 \
      --train-frac 0.1 "$SHARED/cnr2000" "$OUT/$ds" > /dev/null ;;
    *) $BIN --quiet dataset import --format npy "$SHARED/$ds" "$OUT/$ds" > /dev/null ;;
  esac
}

metis() { # NAME PARTS
  [ -f "$OUT/$1-m$2/meta.txt" ] || $BIN --quiet dataset partition --method metis --parts "$2" \
    "$OUT/$1" "$OUT/$1-m$2" > /dev/null
}

if [ -z "${SUMMARY_ONLY:-}" ]; then
  [ -n "${NO_BUILD:-}" ] || cargo build --release -q
  mkdir -p "$OUT"
  for ds in $DATASETS; do
    dataset "$ds"
    for n in $WORKERS; do
      metis "$ds" "$n"
      # The same relabelled dataset for both strategies, so the batches are the same.
      echo "[$ds] $n workers: data-parallel, then split" >&2
      $BIN --quiet train --dataset "$OUT/$ds-m$n" "${SETTINGS[@]}" --epochs "$EPOCHS" \
        --threads "$THREADS" --workers "$n" --strategy data-parallel \
        --metrics-out "$OUT/$ds-dp$n.json" > /dev/null
      $BIN --quiet train --dataset "$OUT/$ds-m$n" "${SETTINGS[@]}" --epochs "$EPOCHS" \
        --threads "$THREADS" --workers "$n" --strategy split \
        --metrics-out "$OUT/$ds-split$n.json" > /dev/null
    done
  done
  for ds in $ACC_DATASETS; do
    dataset "$ds"
    metis "$ds" 2
    for seed in $SEEDS; do
      echo "[$ds] seed $seed: one worker, then split over 2" >&2
      $BIN --quiet train --dataset "$OUT/$ds-m2" --epochs 20 --seed "$seed" --threads 2 \
        --metrics-out "$OUT/$ds-acc-single-$seed.json" > /dev/null
      $BIN --quiet train --dataset "$OUT/$ds-m2" --epochs 20 --seed "$seed" --threads 1 \
        --workers 2 --strategy split --metrics-out "$OUT/$ds-acc-split-$seed.json" > /dev/null
    done
  done
fi

python3 - "$OUT" "$WORKERS" "$DATASETS" "$ACC_DATASETS" "$SEEDS" <<'PY'
import json, statistics, sys
out, workers, datasets, acc_sets, seeds = sys.argv[1], *[a.split() for a in sys.argv[2:]]
rows = []
print("| dataset | workers | strategy | median epoch s | rows loaded / epoch | edges computed / epoch | shuffled MB / epoch | rows shuffled / epoch (pre-aggregated would be) | gradient all-reduce MB / epoch |")
print("|---|---|---|---|---|---|---|---|---|")
for ds in datasets:
    for n in workers:
        for strat in ("dp", "split"):
            try:
                m = json.load(open(f"{out}/{ds}-{strat}{n}.json"))
            except FileNotFoundError:
                continue
            eps = m["epochs"][1:] or m["epochs"]
            w = [e["workers"] for e in eps]
            per = lambda k: statistics.median(sum(x[k] for x in ws) for ws in w)
            shuf = statistics.median(sum((x.get("split") or {}).get("shuffled_bytes", 0) for x in ws) for ws in w)
            ar = statistics.median(sum(x["allreduce_bytes"] for x in ws) for ws in w)
            sp = lambda k: statistics.median(sum((x.get("split") or {}).get(k, 0) for x in ws) for ws in w)
            remote_rows, pre_rows = sp("remote_rows"), sp("preaggregated_rows")
            r = dict(dataset=ds, workers=int(n), strategy="data-parallel" if strat == "dp" else "split",
                     median_epoch_s=m["median_epoch_s"], rows=per("input_nodes"), edges=per("edges"),
                     shuffled_bytes=shuf, allreduce_bytes=ar, remote_rows=remote_rows,
                     preaggregated_rows=pre_rows)
            rows.append(r)
            shuffled_rows = f"{remote_rows:,.0f} ({pre_rows:,.0f})" if strat == "split" else "-"
            print(f"| {ds} | {n} | {r['strategy']} | {r['median_epoch_s']:.3f} | {r['rows']:,.0f} | {r['edges']:,.0f} | {shuf/1e6:.1f} | {shuffled_rows} | {ar/1e6:.1f} |")
acc = []
if acc_sets:
    print()
    print("| dataset | seed | one worker test acc | split x2 test acc | difference (points) |")
    print("|---|---|---|---|---|")
for ds in acc_sets:
    for s in seeds:
        try:
            a = json.load(open(f"{out}/{ds}-acc-single-{s}.json"))["test_acc"]
            b = json.load(open(f"{out}/{ds}-acc-split-{s}.json"))["test_acc"]
        except FileNotFoundError:
            continue
        acc.append(dict(dataset=ds, seed=int(s), single=a, split=b))
        print(f"| {ds} | {s} | {a:.4f} | {b:.4f} | {100*(b-a):+.2f} |")
json.dump(dict(runs=rows, accuracy=acc), open(f"{out}/summary.json", "w"), indent=1)
PY

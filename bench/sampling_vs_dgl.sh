#!/usr/bin/env bash
# Sampling throughput side by side: fanout's k-hop sampler vs DGL's CPU NeighborSampler.
#
#   bash bench/sampling_vs_dgl.sh                # cnr2000 (1% train) and the products preset
#   THREADS=4 RUNS=5 bash bench/sampling_vs_dgl.sh
#   DATASETS="products" FANOUTS="15,10,5" BATCHES="8000" bash bench/sampling_vs_dgl.sh
#   DATASETS="products-full" bash bench/sampling_vs_dgl.sh   # products preset at full scale
#                                                            # (2.45M vertices, ~120M arcs, 1.5 GB)
#
# For every row (dataset x fanouts x batch size) both samplers read the SAME dataset directory,
# sample the same training set in shuffled batches of the same size without replacement, on the
# same number of threads (fanout: --threads; DGL: OMP_NUM_THREADS + torch.set_num_threads), with
# warm-up batches excluded, and count sampled edges the same way (sum of block edge counts).
# Fanouts are written in hop order from the seeds; bench/dgl_sample.py reverses them for DGL.
# The two run alternately RUNS times (so load changes on a shared machine hit both); the table
# shows the median SEPS of each and their ratio. Raw JSON lines go to $OUT/sampling_vs_dgl.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${THREADS:-$(nproc)}
RUNS=${RUNS:-3}
OUT=${OUT:-bench/out/sampling}
SHARED=${SHARED:-../shared/datasets}
DATASETS=${DATASETS:-"cnr2000 products"}
FANOUTS=${FANOUTS:-"15,10,5 10,25"}
BATCHES=${BATCHES:-"1024 8000"}
PY=${PY:-.venv-peers/bin/python}
mkdir -p "$OUT"
cargo build --release -q
BIN=target/release/fanout
[ -x "$PY" ] || bash bench/setup-peers.sh

# Datasets: cnr2000 imported with a 1% random training set (and small random features, which
# the import requires with --train-frac; sampling never reads them); products from its preset
# (default scale, 250k vertices), products-full from the same preset at ogbn-products' size.
if [[ " $DATASETS " == *" cnr2000 "* ]] && [ ! -f "$OUT/cnr2000/meta.txt" ]; then
  $BIN --quiet dataset import --format npy --random-features 16 --classes 16 --train-frac 0.01 \
    "$SHARED/cnr2000" "$OUT/cnr2000" > /dev/null
fi
for ds in $DATASETS; do
  if [ "$ds" = products ] && [ ! -f "$OUT/products/meta.txt" ]; then
    $BIN --quiet dataset gen --preset products "$OUT/products" > /dev/null
  fi
  if [ "$ds" = products-full ] && [ ! -f "$OUT/products-full/meta.txt" ]; then
    $BIN --quiet dataset gen --preset products --nodes 2449029 "$OUT/products-full" > /dev/null
  fi
done

# Timed batches per run: enough for about a second or more of DGL sampling on 2 cores.
timed_batches() {
  case "$1:$3" in
    cnr2000:1024) echo 200 ;;
    cnr2000:*) echo 60 ;;
    products:1024) echo 20 ;;
    products:*) echo 8 ;;
    products-full:1024) echo 10 ;;
    *) echo 4 ;;
  esac
}

LOG=${LOG:-"$OUT/sampling_vs_dgl.jsonl"}
: > "$LOG"
for ds in $DATASETS; do
  for f in $FANOUTS; do
    for b in $BATCHES; do
      n=$(timed_batches "$ds" "$f" "$b")
      for r in $(seq "$RUNS"); do
        echo "[$ds fanouts $f batch $b run $r/$RUNS]" >&2
        ours=$($BIN sample-bench --dataset "$OUT/$ds" --fanouts "$f" --batch-size "$b" \
          --threads "$THREADS" --batches "$n" --warmup 2 --seed "$r" --json)
        dgl=$(DGLBACKEND=pytorch "$PY" bench/dgl_sample.py --dataset "$OUT/$ds" --fanouts "$f" \
          --batch-size "$b" --threads "$THREADS" --batches "$n" --warmup 2 --runs 1 --seed "$r" \
          2> /dev/null | tail -n 1)
        echo "{\"name\": \"$ds\", \"run\": $r, \"fanout\": $ours, \"dgl\": $dgl}" >> "$LOG"
      done
    done
  done
done

python3 - "$LOG" <<'PY'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    v = json.loads(line)
    key = (v["name"], v["fanout"]["fanouts_hop_order"], v["fanout"]["batch_size"])
    rows.setdefault(key, []).append(v)
print("| dataset | fanouts (hop order) | batch | threads | fanout M SEPS | DGL M SEPS | ratio | input nodes fanout / DGL |")
print("|---|---|---|---|---|---|---|---|")
for (name, f, b), runs in rows.items():
    ours = statistics.median(r["fanout"]["seps"] for r in runs)
    dgl = statistics.median(r["dgl"]["seps"] for r in runs)
    ni = statistics.median(r["fanout"]["mean_input_nodes"] for r in runs)
    nd = statistics.median(r["dgl"]["mean_input_nodes"] for r in runs)
    t = runs[0]["fanout"]["threads"]
    print(f"| {name} | {f} | {b} | {t} | {ours/1e6:.2f} | {dgl/1e6:.2f} | {ours/dgl:.2f}x | {ni:.0f} / {nd:.0f} |")
PY

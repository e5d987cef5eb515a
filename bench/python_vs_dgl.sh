#!/usr/bin/env bash
# fanout's Python loader (`fanout.NeighborLoader`) side by side with DGL's DataLoader, in the
# same interpreter and torch (.venv-peers: torch 2.2.1 + DGL 2.1.0, with the fanout package
# installed into it), same dataset directory, fanouts, batch size, model and threads.
# bench/python_vs_dgl.py runs one configuration; this alternates them RUNS times and tabulates.
#
#   bash bench/python_vs_dgl.sh                          # cora (5 seeds) + products preset (3 runs)
#   DATASETS=products RUNS=2 EPOCHS=3 bash bench/python_vs_dgl.sh
#   SUMMARY_ONLY=1 bash bench/python_vs_dgl.sh           # only the tables, from the JSON in $OUT
#
# Three tables:
#  1. loader alone: batches per second with features as torch tensors (no model), products;
#  2. training epoch time (median over epochs 1.., then over runs) and the best-validation
#     epoch's test accuracy, products preset, for
#       fanout loader + plain-PyTorch GraphSAGE (fanout.torch.GraphSAGE, the example's model),
#       fanout loader + DGL SAGEConv (a fanout batch turned into dgl.create_block blocks),
#       DGL loader    + DGL SAGEConv (DGL's own mini-batch GraphSAGE);
#  3. accuracy on cora (public split) over SEEDS, the same three, the example's settings
#     (hidden 64, batch 32, lr 0.01, weight decay 5e-4, 20 epochs).
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${THREADS:-$(nproc)}
RUNS=${RUNS:-3}
EPOCHS=${EPOCHS:-4}
SEEDS=${SEEDS:-"0 1 2 3 4"}
OUT=${OUT:-bench/out/python}
SHARED=${SHARED:-../shared/datasets}
PY=${PY:-.venv-peers/bin/python}
BIN=${BIN:-target/release/fanout}
CONFIGS="fanout:torch fanout:dgl dgl:dgl"
if [ -z "${SUMMARY_ONLY:-}" ]; then
  [ -n "${NO_BUILD:-}" ] || cargo build --release -q
  [ -x "$PY" ] || bash bench/setup-peers.sh
  if [ -z "${NO_BUILD:-}" ] || ! "$PY" -c "import fanout" 2> /dev/null; then
    echo "== installing the fanout package into $(dirname "$(dirname "$PY")")" >&2
    "$PY" -m pip --disable-pip-version-check -q install 'maturin>=1.5,<2'
    # maturin's build hook runs the `maturin` executable from PATH, in pip's own temporary
    # folder: the venv's bin folder goes on PATH as an absolute path.
    PATH="$(cd "$(dirname "$PY")" && pwd):$PATH" "$PY" -m pip --disable-pip-version-check -q install \
      --no-build-isolation --force-reinstall --no-deps ./python
  fi
  mkdir -p "$OUT"
  [ -f "$OUT/cora/meta.txt" ] || $BIN --quiet dataset import --format npy "$SHARED/cora" "$OUT/cora" > /dev/null
  [ -f "$OUT/products/meta.txt" ] || $BIN --quiet dataset gen --preset products "$OUT/products" > /dev/null
  run() { # name loader model dataset extra-args...
    local name=$1 loader=$2 model=$3 ds=$4
    shift 4
    echo "[$name] $loader loader, $model model" >&2
    "$PY" bench/python_vs_dgl.py --dataset "$OUT/$ds" --loader "$loader" --model "$model" \
      --threads "$THREADS" "$@" > "$OUT/$name-$loader-$model.json"
  }
  BIG="--fanouts 10,25 --batch-size 1024 --hidden 256 --lr 0.003 --dropout 0.5"
  for r in $(seq "$RUNS"); do
    for c in $CONFIGS; do
      run "loader-products-$r" "${c%%:*}" "${c##*:}" products $BIG --mode loader --epochs 3 --seed "$r"
      run "train-products-$r" "${c%%:*}" "${c##*:}" products $BIG --mode train --epochs "$EPOCHS" --seed "$r"
    done
  done
  for s in $SEEDS; do
    for c in $CONFIGS; do
      run "train-cora-s$s" "${c%%:*}" "${c##*:}" cora --fanouts 10,25 --batch-size 32 --hidden 64 \
        --lr 0.01 --weight-decay 5e-4 --dropout 0.5 --mode train --epochs 20 --seed "$s"
    done
  done
fi
python3 - "$OUT" "$RUNS" "$SEEDS" "$CONFIGS" "$THREADS" <<'PY'
import glob, json, statistics as st, sys
out, runs, seeds, configs, threads = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split(), sys.argv[5]
label = {"fanout:torch": "fanout loader + PyTorch SAGE", "fanout:dgl": "fanout loader + DGL SAGEConv",
         "dgl:dgl": "DGL loader + DGL SAGEConv"}
load = lambda name, c: json.load(open(f"{out}/{name}-{c.replace(':', '-')}.json"))
first = load("train-products-1", "dgl:dgl")
print(f"threads {threads}; {first['versions']}; products preset: fanouts 10,25, batch 1024, hidden 256\n")
print("| loader (products, no model) | batches/s (median of runs) | each run | vs DGL |")
print("|---|---|---|---|")
dgl_lo = st.median(load(f"loader-products-{r}", "dgl:dgl")["batches_per_s"] for r in range(1, runs + 1))
for c in configs:
    xs = [load(f"loader-products-{r}", c)["batches_per_s"] for r in range(1, runs + 1)]
    print(f"| {c.split(':')[0]} (batches as {'DGL blocks' if c.endswith('dgl') else 'tensors'}) | {st.median(xs):.1f} | "
          f"{', '.join('%.1f' % x for x in xs)} | {st.median(xs) / dgl_lo:.2f}x |")
print("\n| training (products) | epoch s (median) | each run | DGL / this | test acc (mean) |")
print("|---|---|---|---|---|")
dgl_ep = [load(f"train-products-{r}", "dgl:dgl")["median_epoch_s"] for r in range(1, runs + 1)]
for c in configs:
    js = [load(f"train-products-{r}", c) for r in range(1, runs + 1)]
    ep = [j["median_epoch_s"] for j in js]
    ratios = [d / o for d, o in zip(dgl_ep, ep)]
    print(f"| {label[c]} | {st.median(ep):.2f} | {', '.join('%.2f' % x for x in ep)} | {st.median(ratios):.2f}x | "
          f"{st.mean(j['test_acc'] for j in js):.4f} |")
print(f"\n| cora, {len(seeds)} seeds | test acc mean ± sd | epoch s (median) |")
print("|---|---|---|")
for c in configs:
    js = [load(f"train-cora-s{s}", c) for s in seeds]
    acc = [j["test_acc"] for j in js]
    sd = st.stdev(acc) if len(acc) > 1 else 0.0
    print(f"| {label[c]} | {st.mean(acc):.4f} ± {sd:.4f} | {st.median(j['median_epoch_s'] for j in js):.3f} |")
PY

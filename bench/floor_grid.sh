#!/usr/bin/env bash
# Epoch time against its floor, and against DGL, over a grid of feature widths: for each
# dataset and width, `fanout train` and DGL (bench/dgl_train.py) alternate RUNS times with the
# same model, fanouts, batch, hidden size, learning rate and threads on the same directory.
#
#   bash bench/floor_grid.sh                                   # the full grid (long: hours)
#   WIDTHS="100 1024" CNR_WIDTHS="" RUNS=2 bash bench/floor_grid.sh   # an empty list skips that graph
#   MODEL=gcn FANOUTS=15,10,5 bash bench/floor_grid.sh
#   SUMMARY_ONLY=1 bash bench/floor_grid.sh                    # only the table, from $OUT
#   F16=1 bash bench/floor_grid.sh                             # features stored as f16 (both)
#   DGL_FLUSH=1 bash bench/floor_grid.sh                       # DGL with torch.set_flush_denormal(True)
#
# Datasets: the products preset at NODES vertices (`fanout dataset gen --feat-dim W`) for every
# width in WIDTHS, and cnr2000 with W-dim random features (10% train) for every width in
# CNR_WIDTHS. Per run: the median epoch excluding epoch 0, and fanout's median compute and
# memory floors over the same epochs (its GEMM flops at the GEMM rate, its gathered bytes at
# the copy bandwidth, both measured once per machine: README "Distance to the floor"), and
# the floor of the flops it did (the compute floor less the zero-skipped products). The
# table gives the medians over runs, epoch / compute floor, and DGL's epoch over fanout's
# (median of per-run ratios). fanout flushes subnormal floats to zero while it trains; PyTorch
# (so DGL) does not unless DGL_FLUSH is set, and late epochs of wide features slow it down
# several times (docs/performance.md). Raw JSON in $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${THREADS:-$(nproc)}
RUNS=${RUNS:-3}
EPOCHS=${EPOCHS:-4}
MODEL=${MODEL:-sage}
FANOUTS=${FANOUTS:-10,25}
BATCH=${BATCH:-1024}
HIDDEN=${HIDDEN:-256}
NODES=${NODES:-100000}
WIDTHS=${WIDTHS-"100 256 602 1024 4096"}
CNR_WIDTHS=${CNR_WIDTHS-"100 256 602 1024 4096"}
F16=${F16:-}
OUT=${OUT:-bench/out/floor${F16:+-f16}}
DTYPE_FLAG=${F16:+--f16}
SHARED=${SHARED:-../shared/datasets}
PY=${PY:-.venv-peers/bin/python}
BIN=${BIN:-target/release/fanout}
COMMON="--model $MODEL --fanouts $FANOUTS --batch-size $BATCH --hidden $HIDDEN --lr 0.003 --dropout 0.5 --epochs $EPOCHS --eval-every 0 --threads $THREADS"
CASES=""
for w in $WIDTHS; do CASES="$CASES products-$w"; done
for w in $CNR_WIDTHS; do CASES="$CASES cnr2000-$w"; done
if [ -z "${SUMMARY_ONLY:-}" ]; then
  [ -n "${NO_BUILD:-}" ] || cargo build --release -q
  [ -x "$PY" ] || bash bench/setup-peers.sh
  mkdir -p "$OUT"
  for c in $CASES; do
    ds=${c%-*} w=${c##*-}
    if [ ! -f "$OUT/$c/meta.txt" ]; then
      echo "[$c] writing the dataset" >&2
      if [ "$ds" = products ]; then
        $BIN --quiet dataset gen --preset products --nodes "$NODES" --feat-dim "$w" $DTYPE_FLAG "$OUT/$c" > /dev/null
      else
        $BIN --quiet dataset import --format npy --random-features "$w" --train-frac 0.1 $DTYPE_FLAG \
          "$SHARED/cnr2000" "$OUT/$c" > /dev/null
      fi
    fi
    for r in $(seq "$RUNS"); do
      echo "[$c run $r/$RUNS] fanout" >&2
      $BIN --quiet train --dataset "$OUT/$c" $COMMON --seed "$r" --metrics-out "$OUT/ours-$c-$r.json" > /dev/null
      echo "[$c run $r/$RUNS] dgl" >&2
      DGLBACKEND=pytorch "$PY" bench/dgl_train.py --dataset "$OUT/$c" $COMMON --seed "$r" ${DGL_FLUSH:+--flush-denormal} \
        2> /dev/null > "$OUT/dgl-$c-$r.json"
    done
    # The widest datasets take gigabytes: keep only what the table needs.
    [ -z "${KEEP_DATA:-}" ] && rm -rf "${OUT:?}/$c"
  done
fi
python3 - "$OUT" "$RUNS" "$CASES" "$COMMON${F16:+ (features stored as f16)}" <<'PY'
import json, sys, statistics as st
out, runs, cases, common = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4]
print(f"settings: {common}\n")
print("| dataset | width | fanout epoch s | compute floor s | memory floor s | epoch / compute floor | floor of the flops done s | epoch / that floor | DGL epoch s | DGL / fanout (each run) |")
print("|---|---|---|---|---|---|---|---|---|---|")
for c in cases:
    ds, w = c.rsplit("-", 1)
    try:
        ours = [json.load(open(f"{out}/ours-{c}-{r}.json")) for r in range(1, runs + 1)]
        dgl = [json.load(open(f"{out}/dgl-{c}-{r}.json")) for r in range(1, runs + 1)]
    except (OSError, ValueError) as e:
        print(f"| {ds} | {w} | missing ({e}) | | | | | | | |")
        continue
    later = lambda j, k: st.median(e[k] for e in (j["epochs"][1:] or j["epochs"]))
    epoch = st.median(j["median_epoch_s"] for j in ours)
    cf = st.median(later(j, "compute_floor_s") for j in ours)
    mf = st.median(later(j, "memory_floor_s") for j in ours)
    # Older metrics files have no performed floor (the zero-skipped flops left out).
    pf = st.median(later(j, "performed_floor_s") for j in ours) if "performed_floor_s" in ours[0]["epochs"][0] else None
    done = f"{pf:.3f} | {epoch / pf:.2f}x" if pf else "| "
    d = st.median(j["median_epoch_s"] for j in dgl)
    ratios = [b["median_epoch_s"] / a["median_epoch_s"] for a, b in zip(ours, dgl)]
    each = ", ".join(f"{r:.2f}" for r in ratios)
    print(f"| {ds} | {w} | {epoch:.3f} | {cf:.3f} | {mf:.3f} | {epoch / cf:.2f}x | {done} | {d:.3f} | {st.median(ratios):.2f}x ({each}) |")
PY

#!/usr/bin/env bash
# The shape of GSplit's Table 2 (extra edges computed by data parallelism: 4 micro-batches of
# 1024 against one batch of 4096, fanouts 20,20,20) and Table 5 (local edges and edge skew of
# 4 splits of each 4096 batch over a METIS partition), on the products and papers presets and
# cnr2000 (16-dim random features, 10% train). See crates/fanout-metis/examples/gsplit_tables.rs.
#
#   bash bench/gsplit_tables.sh
#   PRODUCTS_NODES=2449029 bash bench/gsplit_tables.sh     # products at full scale (about 8 GB)
#   SUMMARY_ONLY=1 bash bench/gsplit_tables.sh             # only the table, from $OUT
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/out/gsplit}
SHARED=${SHARED:-../shared/datasets}
BIN=${BIN:-target/release/fanout}
EX=${EX:-target/release/examples/gsplit_tables}
PRODUCTS_NODES=${PRODUCTS_NODES:-}
DATASETS="products papers cnr2000"
if [ -z "${SUMMARY_ONLY:-}" ]; then
  if [ -z "${NO_BUILD:-}" ]; then
    cargo build --release -q
    cargo build --release -q -p fanout-metis --example gsplit_tables
  fi
  mkdir -p "$OUT"
  for ds in $DATASETS; do
    if [ ! -f "$OUT/$ds/meta.txt" ]; then
      echo "[$ds] writing the dataset" >&2
      case $ds in
        products) $BIN --quiet dataset gen --preset products ${PRODUCTS_NODES:+--nodes $PRODUCTS_NODES} "$OUT/$ds" > /dev/null ;;
        papers) $BIN --quiet dataset gen --preset papers "$OUT/$ds" > /dev/null ;;
        cnr2000) $BIN --quiet dataset import --format npy --random-features 16 --train-frac 0.1 \
          "$SHARED/cnr2000" "$OUT/$ds" > /dev/null ;;
      esac
    fi
    if [ ! -f "$OUT/$ds-metis4/meta.txt" ]; then
      echo "[$ds] METIS, 4 parts" >&2
      $BIN --quiet dataset partition --method metis --parts 4 --json "$OUT/$ds" "$OUT/$ds-metis4" \
        > "$OUT/$ds-partition.json"
    fi
    echo "[$ds] tables" >&2
    $EX "$OUT/$ds" "$OUT/$ds-metis4" > "$OUT/$ds-tables.json"
  done
fi
python3 - "$OUT" "$DATASETS" <<'PY'
import json, sys
out, datasets = sys.argv[1], sys.argv[2].split()
paper = {"products": ("25.5%", "93%", "about 1.0"), "papers": ("148.9%", "96%", "about 1.3")}
print("| graph | vertices | arcs crossing METIS parts | extra edges, 4 x 1024 vs 1 x 4096 (paper) | local edges, 4 splits (paper) | edge skew (paper) |")
print("|---|---|---|---|---|---|")
for ds in datasets:
    t = json.load(open(f"{out}/{ds}-tables.json"))
    p = json.load(open(f"{out}/{ds}-partition.json"))["metis"]
    e2, e5 = t["table2"], t["table5"]
    pp = paper.get(ds, ("-", "-", "-"))
    print(f"| {ds} | {sum(p['vertices'])} | {100 * p['cut_fraction']:.1f}% | {e2['extra_pct']:.1f}% ({pp[0]}) "
          f"| {e5['local_edges_pct']:.1f}% ({pp[1]}) | {e5['edge_skew']:.2f} ({pp[2]}) |")
PY

#!/usr/bin/env bash
# Reproduces the tables of docs/caching.md: cache-sim on the papers, products, twitter and uk
# presets (default scales) and on cnr2000 (1% random training vertices) in GNNLab's GCN setting
# (fanouts 15,10,5 in hop order, batch 8000), then with the batch size scaled so that an epoch
# has as many batches as on the real dataset, then GraphSAGE's 10,25, then weighted k-hop on papers,
# twitter and cnr2000 (it writes weight.bin there with `fanout dataset weights --scheme newer`). Hit rates and the oracle
# are over 10 evaluated epochs (cache-sim's default, GNNLab's footnote 4: the optimal cache is
# computed from a training run's footprints); the "1 epoch" tables score a single epoch against
# its own oracle.
# Usage: bench/cache_sim.sh DATA_DIR [OUT_DIR]   (datasets are generated in DATA_DIR when missing;
# JSON lines go to OUT_DIR, default bench/out/cache; markdown tables to stdout)
set -euo pipefail
DATA=${1:?usage: bench/cache_sim.sh DATA_DIR [OUT_DIR]}
OUT=${2:-bench/out/cache}
BIN=${FANOUT:-target/release/fanout}
HERE=$(dirname "$0")
mkdir -p "$DATA" "$OUT"
for p in papers products twitter uk; do
  [ -d "$DATA/$p" ] || "$BIN" --quiet dataset gen --preset $p "$DATA/$p"
done
[ -d "$DATA/cnr2000" ] || "$BIN" --quiet dataset import --format npy ../shared/datasets/cnr2000 \
  "$DATA/cnr2000" --random-features 128 --train-frac 0.01
# sim NAME DATASET BATCH [cache-sim flags...]: appends JSON lines to $OUT/NAME.jsonl
sim() {
  local name=$1 d=$2 b=$3
  shift 3
  "$BIN" --quiet cache-sim --dataset "$DATA/$d" --batch-size "$b" --ratios 0.05,0.1,0.2 --json "$@" \
    | sed "s/^{/{\"name\":\"$d\",/" >>"$OUT/$name.jsonl"
}
rm -f "$OUT"/*.jsonl
# Real batches per epoch at batch 8000: papers 1.21M train -> 151, products 196k -> 25,
# twitter 417k -> 53, uk 777k -> 98; cnr2000 is not in GNNLab (64 gives 51 batches).
A="papers:8000 products:8000 twitter:8000 uk:8000 cnr2000:8000"
B="papers:73 products:800 twitter:96 uk:51 cnr2000:64"
for db in $A; do sim A "${db%%:*}" "${db##*:}" --fanouts 15,10,5 --match-reorder --similarity; done
for db in $B; do sim B "${db%%:*}" "${db##*:}" --fanouts 15,10,5 --match-reorder --similarity; done
for db in $A; do sim A1 "${db%%:*}" "${db##*:}" --fanouts 15,10,5 --epochs 1; done
for db in $B; do sim B1 "${db%%:*}" "${db##*:}" --fanouts 15,10,5 --epochs 1; done
for db in $A $B; do
  sim C "${db%%:*}" "${db##*:}" --fanouts 10,25 --policies degree,presc1,optimal
done
# D: weighted k-hop (GNNLab Figure 11a) with the newer-neighbour weights (`dataset weights`).
for d in papers twitter cnr2000; do
  "$BIN" --quiet dataset weights "$DATA/$d" --scheme newer --force > /dev/null
done
for db in papers:8000 papers:73 twitter:8000 twitter:96 cnr2000:8000 cnr2000:64; do
  sim D "${db%%:*}" "${db##*:}" --fanouts 15,10,5 --sampler weighted
done
python3 "$HERE/cache_table.py" "$OUT"

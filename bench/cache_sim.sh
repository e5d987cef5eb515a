#!/usr/bin/env bash
# Reproduces the tables of docs/caching.md: cache-sim on the papers, products, twitter and uk
# presets (default scales) and on cnr2000 (1% random training vertices), GNNLab's GCN setting
# (fanouts 15,10,5 in hop order, batch 8000), then the same with the batch size scaled so that
# an epoch has as many batches as on the real dataset, then GraphSAGE's 10,25.
# Usage: bench/cache_sim.sh DATA_DIR   (datasets are generated there when missing)
set -euo pipefail
DATA=${1:?usage: bench/cache_sim.sh DATA_DIR}
BIN=${FANOUT:-target/release/fanout}
mkdir -p "$DATA"
for p in papers products twitter uk; do
  [ -d "$DATA/$p" ] || "$BIN" --quiet dataset gen --preset $p "$DATA/$p"
done
[ -d "$DATA/cnr2000" ] || "$BIN" --quiet dataset import --format npy ../shared/datasets/cnr2000 \
  "$DATA/cnr2000" --random-features 128 --train-frac 0.01
sim() { "$BIN" --quiet cache-sim --ratios 0.05,0.1,0.2 "$@"; }
echo "## A. GNNLab GCN setting: fanouts 15,10,5, batch 8000"
for d in papers products twitter uk cnr2000; do
  sim --dataset "$DATA/$d" --fanouts 15,10,5 --batch-size 8000 --match-reorder --similarity
done
echo "## A10. as A, oracle and hit rates over 10 evaluated epochs"
for d in papers products twitter uk cnr2000; do
  sim --dataset "$DATA/$d" --fanouts 15,10,5 --batch-size 8000 --epochs 10 --policies degree,presc1,presc2,optimal
done
# Real batches per epoch at batch 8000: papers 1.21M train -> 151, products 196k -> 25,
# twitter 417k -> 53, uk 777k -> 98; cnr2000 is not in GNNLab (64 gives 51 batches).
echo "## B. batches per epoch as on the real datasets"
for db in papers:73 products:800 twitter:96 uk:51 cnr2000:64; do
  sim --dataset "$DATA/${db%%:*}" --fanouts 15,10,5 --batch-size "${db##*:}" --match-reorder --similarity
done
echo "## C. GraphSAGE fanouts 10,25"
for db in papers:8000 papers:73 products:8000 products:800 twitter:8000 twitter:96 uk:8000 uk:51 cnr2000:8000 cnr2000:64; do
  sim --dataset "$DATA/${db%%:*}" --fanouts 10,25 --batch-size "${db##*:}" --policies degree,presc1,optimal
done
# D. papers with its training set concentrated in three classes (communities), as the arXiv
# papers are inside papers100M: same graph, features and size of training set.
if [ ! -d "$DATA/papers-local" ]; then
  mkdir "$DATA/papers-local"
  for f in feat.bin indices.bin indptr.bin label.bin test_set.bin valid_set.bin; do
    ln "$DATA/papers/$f" "$DATA/papers-local/$f"
  done
  python3 - "$DATA" <<'PY'
import sys
from array import array
d = sys.argv[1]
lab = array('q', open(f'{d}/papers/label.bin', 'rb').read())
n_train = len(open(f'{d}/papers/train_set.bin', 'rb').read()) // 4
held = set(array('I', open(f'{d}/papers/valid_set.bin', 'rb').read()))
held |= set(array('I', open(f'{d}/papers/test_set.bin', 'rb').read()))
sel = [v for v in range(len(lab)) if lab[v] in (0, 1, 2) and v not in held][:n_train]
open(f'{d}/papers-local/train_set.bin', 'wb').write(array('I', sel).tobytes())
meta = [l for l in open(f'{d}/papers/meta.txt') if not l.startswith('CHECKSUM_TRAIN_SET')]
open(f'{d}/papers-local/meta.txt', 'w').write(''.join(meta))
PY
fi
echo "## D. papers, training set concentrated in three classes"
for b in 8000 73; do
  sim --dataset "$DATA/papers-local" --fanouts 15,10,5 --batch-size $b --match-reorder --similarity
done

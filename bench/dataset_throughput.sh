#!/usr/bin/env bash
# Import and generation throughput (arcs per second), median of RUNS runs after one warm-up.
#
#   bash bench/dataset_throughput.sh            # cnr2000 (npy, text, gzip text) + products preset
#   FULL=1 bash bench/dataset_throughput.sh     # also products at full scale (2.45M nodes, ~120M arcs)
#
# Figures come from each command's own --json summary (wall time inside the process, input arcs).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3}
OUT=${OUT:-bench/out}
SHARED=${SHARED:-../shared/datasets}
mkdir -p "$OUT"
cargo build --release -q
BIN=target/release/fanout

if [ ! -f "$OUT/cnr2000.txt" ]; then
  python3 bench/npy_to_edgelist.py "$SHARED/cnr2000/edge_index.npy" "$OUT/cnr2000.txt"
  gzip -kf "$OUT/cnr2000.txt"
fi

# run NAME FIELD_FOR_ARCS CMD...: prints the median arcs/s and seconds over RUNS runs.
run() {
  local name=$1 field=$2; shift 2
  "$@" > /dev/null  # warm-up (page cache, binary)
  local rates=() secs=()
  for _ in $(seq "$RUNS"); do
    local json
    json=$("$@")
    read -r arcs s < <(python3 -c 'import json,sys; v=json.load(sys.stdin); s=v["summary"]; print(eval(sys.argv[1]), s["seconds"])' "$field" <<< "$json")
    rates+=("$(python3 -c "print($arcs / $s)")")
    secs+=("$s")
  done
  python3 - "$name" "${rates[*]}" "${secs[*]}" <<'PY'
import statistics, sys
name, rates, secs = sys.argv[1], [float(x) for x in sys.argv[2].split()], [float(x) for x in sys.argv[3].split()]
print(f"| {name:<44} | {statistics.median(secs):8.2f} | {statistics.median(rates)/1e6:10.2f} | {min(rates)/1e6:6.2f}-{max(rates)/1e6:.2f} |")
PY
}

echo "machine: $(nproc) cores; runs: $RUNS (median; warm-up excluded)"
echo "| job | median s | M arcs/s | range |"
echo "|---|---|---|---|"
IN='s["build"]["input_arcs"]'
GEN='s["arcs"]'
run "import npy cnr2000 (3.2M arcs)" "$IN" $BIN --quiet dataset import --format npy "$SHARED/cnr2000" "$OUT/cnr-npy" --overwrite --json
run "import npy cnr2000 --symmetrize --dedup" "$IN" $BIN --quiet dataset import --format npy --symmetrize --dedup --drop-self-loops "$SHARED/cnr2000" "$OUT/cnr-sym" --overwrite --json
run "import edgelist text cnr2000" "$IN" $BIN --quiet dataset import --format edgelist "$OUT/cnr2000.txt" "$OUT/cnr-txt" --overwrite --json
run "import edgelist gzip cnr2000" "$IN" $BIN --quiet dataset import --format edgelist "$OUT/cnr2000.txt.gz" "$OUT/cnr-gz" --overwrite --json
run "import npy cnr2000 + 128-dim random features" "$IN" $BIN --quiet dataset import --format npy --random-features 128 --train-frac 0.01 "$SHARED/cnr2000" "$OUT/cnr-feat" --overwrite --json
run "gen products (default scale)" "$GEN" $BIN --quiet dataset gen --preset products "$OUT/products" --overwrite --json
run "gen papers (default scale)" "$GEN" $BIN --quiet dataset gen --preset papers "$OUT/papers" --overwrite --json
if [ "${FULL:-0}" = 1 ]; then
  RUNS=1 run "gen products full scale (2,449,029 nodes)" "$GEN" $BIN --quiet dataset gen --preset products --nodes 2449029 "$OUT/products-full" --overwrite --json
fi

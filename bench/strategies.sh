#!/usr/bin/env bash
# Single, data-parallel, factored (GNNLab) and hybrid (MorphGL routes) training side by side in one run, at equal
# worker count and total threads, on the products preset with uniform and with weighted
# sampling (weighted k-hop is the sampling-heavy case where GNNLab says factoring wins).
#
#   bash bench/strategies.sh                         # 2 workers on this machine's cores
#   WORKERS=8 THREADS=16 RUNS=3 bash bench/strategies.sh   # the GPU machine's 16 cores
#
# Configurations alternate within each run. Per run: the median epoch excluding epoch 0;
# reported: the median over runs, and for factored the allocation the cost model chose.
# Every fixed allocation 1..WORKERS-1 is measured too, so the table shows the best fixed
# allocation next to the cost model's.
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${THREADS:-$(nproc)}
WORKERS=${WORKERS:-2}
RUNS=${RUNS:-3}
EPOCHS=${EPOCHS:-4}
BATCH=${BATCH:-1024}
OUT=${OUT:-bench/out/strategies}
BIN=${BIN:-target/release/fanout}
[ -n "${NO_BUILD:-}" ] || cargo build --release -q
mkdir -p "$OUT"
DS="$OUT/products"
[ -f "$DS/meta.txt" ] || $BIN --quiet dataset gen --preset products "$DS" > /dev/null
[ -f "$DS/weight.bin" ] || $BIN --quiet dataset weights "$DS" --scheme newer > /dev/null
COMMON="--dataset $DS --model sage --fanouts 10,25 --batch-size $BATCH --hidden 256 --epochs $EPOCHS --eval-every 0 --threads $THREADS"
configs=("single|--workers 1 --strategy single"
         "data-parallel|--workers $WORKERS --strategy data-parallel"
         "factored auto|--workers $WORKERS --strategy factored"
         "hybrid auto|--workers $WORKERS --strategy hybrid")
for s in $(seq 1 $((WORKERS - 1))); do
  configs+=("factored $s sampler(s)|--workers $WORKERS --strategy factored --samplers $s")
done
for sampler in khop weighted; do
  for run in $(seq 1 "$RUNS"); do
    for c in "${configs[@]}"; do
      name=${c%%|*}; args=${c#*|}
      f="$OUT/${sampler}-${name// /_}-$run.json"
      $BIN --quiet train $COMMON --sampler $sampler $args --metrics-out "$f" > /dev/null
    done
  done
done
python3 - "$OUT" "$RUNS" "$WORKERS" "${configs[@]}" <<'PY'
import json, statistics as st, sys
out, runs, workers, configs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
print(f"products preset, SAGE 10,25, batch 1024, {workers} workers; median epoch (s) over {runs} runs")
print("| sampler | strategy | epoch s | vs single | samplers chosen | K = T_t/T_s | standby slices/epoch | own:remote slices |")
print("|---|---|---|---|---|---|---|---|")
for sampler in ["khop", "weighted"]:
    base = None
    for c in configs:
        name = c.split("|")[0]
        ms = [json.load(open(f"{out}/{sampler}-{name.replace(' ', '_')}-{r}.json")) for r in range(1, runs + 1)]
        med = st.median(st.median(e["wall_s"] for e in m["epochs"][1:]) for m in ms)
        base = base or med
        f = ms[0].get("factored")
        chosen = f["layout"]["samplers"] if f else "-"
        k = f"{f['trial']['k']:.2f}" if f else "-"
        claimed = (f"{st.median(m['factored']['claimed_by_standby'] for m in ms) / len(ms[0]['epochs']):.1f}"
                   if f else "-")
        h = ms[0].get("hybrid")
        routes = f"{h['split']['n_cpu']}:{h['split']['n_gpu']}" if h else "-"
        print(f"| {sampler} | {name} | {med:.2f} | {base / med:.2f}x | {chosen} | {k} | {claimed} | {routes} |")
PY

#!/usr/bin/env bash
# Two builds of `fanout` side by side: alternates `fanout train` with binary A and binary B on
# one dataset, ROUNDS times, and prints each run's median epoch (epochs after the first), its
# CPU time (`perf stat -e task-clock` when perf is installed) and final loss, then the medians
# and the paired A/B ratios (one per round, so a slow spell of the machine hits both).
#
#   cargo build --release && cp target/release/fanout /tmp/fanout-new
#   git stash && cargo build --release && cp target/release/fanout /tmp/fanout-old && git stash pop
#   ROUNDS=8 EPOCHS=10 bash bench/ab_train.sh /tmp/fanout-old /tmp/fanout-new DATASET_DIR
#   ... -- --model gcn --hidden 128          # arguments after -- replace the defaults below
#
# Losses should match where the change keeps results bit-identical. Raw JSON in $OUT.
set -euo pipefail
if [ $# -lt 3 ]; then
  echo "usage: bash bench/ab_train.sh BIN_A BIN_B DATASET_DIR [-- TRAIN_ARGS...]" >&2
  exit 2
fi
A=$1 B=$2 DATA=$3
shift 3
[ "${1:-}" = "--" ] && shift
ARGS=("$@")
if [ ${#ARGS[@]} -eq 0 ]; then
  ARGS=(--model sage --fanouts 10,25 --batch-size 1024 --hidden 256 --lr 0.003 --dropout 0.5
    --threads "$(nproc)")
fi
ROUNDS=${ROUNDS:-5}
EPOCHS=${EPOCHS:-10}
OUT=${OUT:-bench/out/ab}
mkdir -p "$OUT"
PERF=$(command -v perf || true)
for r in $(seq "$ROUNDS"); do
  for side in A B; do
    bin=$A
    [ "$side" = B ] && bin=$B
    json="$OUT/$side-$r.json"
    cmd=("$bin" --quiet train --dataset "$DATA" --epochs "$EPOCHS" --eval-every 0 --seed 1
      --metrics-out "$json" "${ARGS[@]}")
    if [ -n "$PERF" ]; then
      "$PERF" stat -x, -e task-clock -o "$OUT/$side-$r.perf" "${cmd[@]}" > /dev/null
    else
      "${cmd[@]}" > /dev/null
    fi
  done
done
python3 - "$OUT" "$ROUNDS" <<'PY'
import json, os, statistics as st, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def run(side, r):
    j = json.load(open(f"{out}/{side}-{r}.json"))
    later = j["epochs"][1:] or j["epochs"]
    cpu = None
    perf = f"{out}/{side}-{r}.perf"
    if os.path.exists(perf):
        for line in open(perf):
            if "task-clock" in line:
                cpu = float(line.split(",")[0]) / 1000
    return st.median(e["wall_s"] for e in later), cpu, j["epochs"][-1]["loss"]
runs = {s: [run(s, r) for r in range(1, rounds + 1)] for s in "AB"}
for r in range(rounds):
    for s in "AB":
        e, c, l = runs[s][r]
        print(f"round {r + 1} {s}: epoch {e:.3f} s" + (f", CPU {c:.2f} s" if c else "") + f", loss {l}")
for s in "AB":
    e = [x[0] for x in runs[s]]
    c = [x[1] for x in runs[s] if x[1]]
    print(f"{s}: median epoch {st.median(e):.3f} s [{min(e):.3f}-{max(e):.3f}]"
          + (f", median CPU {st.median(c):.2f} s [{min(c):.2f}-{max(c):.2f}]" if c else ""))
ratios = [a[0] / b[0] for a, b in zip(runs["A"], runs["B"])]
print("A/B epoch, per round: " + " ".join(f"{x:.2f}" for x in ratios) + f"; median {st.median(ratios):.3f}x")
if all(a[1] and b[1] for a, b in zip(runs["A"], runs["B"])):
    cr = [a[1] / b[1] for a, b in zip(runs["A"], runs["B"])]
    print("A/B CPU, per round: " + " ".join(f"{x:.2f}" for x in cr) + f"; median {st.median(cr):.3f}x")
PY

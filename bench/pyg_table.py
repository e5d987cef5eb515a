"""The table of bench/pyg_vs_fanout_gpu.sh: fanout's and PyG's runs side by side.

Usage: python3 bench/pyg_table.py DIR

DIR holds fanout-MODEL-PLACEMENT.json (fanout train --metrics-out) and pyg-MODEL-FEATURES.json
(bench/pyg_train.py's output). Per run: the median epoch over the epochs after the first (the
first holds start-up: pinning, workers, kernel compilation), the last epoch's stage times, its
loss and the test accuracy; per model, each PyG run's median over fanout's with the rows on the
GPU (how many times faster fanout is)."""
import json
import os
import statistics
import sys

d = sys.argv[1]


def load(name):
    try:
        with open(os.path.join(d, name + ".json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def median_after_first(run):
    walls = [e["wall_s"] for e in run["epochs"]]
    return statistics.median(walls[1:] if len(walls) > 1 else walls)


print("| model | run | epoch s (median, after the first) | sample s | extract s | train s | loss (last epoch) | test acc | epoch / fanout device |")
print("|---|---|---|---|---|---|---|---|---|")
for model in ["gcn", "sage", "gat"]:
    base = load(f"fanout-{model}-device")
    base_s = median_after_first(base) if base else None
    for name, label in [(f"fanout-{model}-device", "fanout, rows on the GPU"),
                        (f"fanout-{model}-uva", "fanout, rows read over the bus (uva)"),
                        (f"pyg-{model}-device", "PyG, rows on the GPU"),
                        (f"pyg-{model}-host", "PyG, rows on the host (loader slices, copies)")]:
        run = load(name)
        if run is None or not run.get("epochs"):
            print(f"| {model} | {label} | did not run | | | | | | |")
            continue
        s = median_after_first(run)
        last = run["epochs"][-1]
        ratio = f"{s / base_s:.2f}x" if base_s else ""
        acc = run.get("test_acc")
        print(f"| {model} | {label} | {s:.3f} | {last.get('sample_s', 0):.3f} | {last.get('extract_s', 0):.3f} "
              f"| {last.get('train_s', 0):.3f} | {last.get('loss', float('nan')):.4f} "
              f"| {acc if acc is None else f'{acc:.4f}'} | {ratio} |")

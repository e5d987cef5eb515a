"""Prints the metrics JSON files of a directory (fanout train --metrics-out) side by side:
per run its median epoch, the epochs, the last epoch's train and extract seconds and the test
accuracy; then, per name prefix given, whether every run of that prefix had the same loss at
every epoch. Usage: python3 bench/metrics_table.py DIR [PREFIX ...]"""
import json
import os
import sys

d, prefixes = sys.argv[1], sys.argv[2:]
m = {f[:-5]: json.load(open(os.path.join(d, f))) for f in sorted(os.listdir(d)) if f.endswith('.json')}
for k, v in m.items():
    e = v['epochs']
    print(f"{k:16s} median {v['median_epoch_s']:.3f}s  epochs " + " ".join(f"{x['wall_s']:.3f}" for x in e)
          + f"  train {e[-1]['train_s']:.3f} extract {e[-1]['extract_s']:.3f}  test {v['test_acc']:.4f}")
for p in prefixes:
    losses = {tuple(x['loss'] for x in v['epochs']) for k, v in m.items() if k.startswith(p)}
    print(p, 'losses equal in every run:', len(losses) == 1)

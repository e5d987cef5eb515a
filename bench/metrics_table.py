"""Prints the metrics JSON files of a directory (fanout train --metrics-out) side by side.

Usage: python3 bench/metrics_table.py DIR [PREFIX | A:B ...]

Per run (file name less .json): its median epoch, the epochs, the last epoch's sample, extract
and train seconds, hit rate and the test accuracy. Then, for each PREFIX given, whether every
run whose name starts with it had the same loss at every epoch; for each A:B pair present, B
against A: the same losses at every epoch (the losses when not), the same test accuracy, and
A's median epoch over B's (B's speed-up)."""
import json
import os
import sys

d, args = sys.argv[1], sys.argv[2:]
m = {f[:-5]: json.load(open(os.path.join(d, f))) for f in sorted(os.listdir(d)) if f.endswith('.json')}


def losses(name):
    return [x['loss'] for x in m[name]['epochs']]


for k, v in m.items():
    e = v['epochs']
    print(f"{k:16s} median {v['median_epoch_s']:.3f}s  epochs " + " ".join(f"{x['wall_s']:.3f}" for x in e)
          + f"  sample {e[-1]['sample_s']:.3f} extract {e[-1]['extract_s']:.3f} train {e[-1]['train_s']:.3f}"
          + f"  hit {e[-1]['hit_rate']:.3f}  test {v['test_acc']:.4f}")
for arg in args:
    if ':' not in arg:
        seen = {tuple(losses(k)) for k in m if k.startswith(arg)}
        print(arg, 'losses equal in every run:', len(seen) == 1)
        continue
    a, b = arg.split(':', 1)
    if a not in m or b not in m:
        continue
    same = losses(a) == losses(b)
    ta, tb = m[a]['median_epoch_s'], m[b]['median_epoch_s']
    print(f"{b} vs {a}: losses equal {same}" + ('' if same else f" ({losses(b)} vs {losses(a)})")
          + f", test equal {m[a]['test_acc'] == m[b]['test_acc']}, speed-up {ta / tb:.2f}x ({ta:.3f} -> {tb:.3f} s)")

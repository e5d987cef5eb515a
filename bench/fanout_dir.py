"""What the peer scripts (dgl_train.py, pyg_train.py) that train other libraries on fanout's
data share: the command-line options that mirror `fanout train`'s, and a dataset directory read
into torch tensors.

`train_args(doc, models, fanouts_help)` is an argument parser with the options both scripts
take (each adds its own). It imports nothing heavy, so a script can set OMP_NUM_THREADS from
`--threads` before torch is imported.

`load(d, script)` reads meta.txt and memory-maps the arrays (GUIDE's dataset format): the
topology as int64 `indptr` / `indices` in CSC (row v lists v's in-neighbours), the features
as stored (f16 stays f16; callers widen per batch with `.float()`, free on f32), the labels
(int64, -1 unlabelled) and the three splits as int64 ids. A directory that is not CSC or
holds other feature types stops the calling script with a message naming it."""
import argparse
import os
import sys
from types import SimpleNamespace


def train_args(doc, models, fanouts_help):
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", required=True)
    p.add_argument("--model", choices=models, default="sage")
    p.add_argument("--fanouts", default="10,25", help=fanouts_help)
    p.add_argument("--batch-size", type=int, default=8000)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.003)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--dropout", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="torch intra-op threads")
    p.add_argument("--eval-every", type=int, default=1)
    p.add_argument(
        "--flush-denormal",
        action="store_true",
        help="torch.set_flush_denormal(True), as fanout does while it trains (off by default in PyTorch)",
    )
    return p


def load(d, script):
    import numpy as np
    import torch

    meta = {}
    with open(os.path.join(d, "meta.txt")) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 2 and not line.startswith("#"):
                meta[parts[0]] = parts[1]
    dtype = meta.get("FEAT_DTYPE", "f32")
    if meta.get("LAYOUT", "csc") != "csc" or dtype not in ("f32", "f16"):
        sys.exit(f"{script}: the dataset {d} must be CSC with f32 or f16 features")
    n, e = int(meta["NUM_NODE"]), int(meta["NUM_EDGE"])
    dim, classes = int(meta["FEAT_DIM"]), int(meta["NUM_CLASS"])
    mm = lambda name, dt, shape: np.memmap(os.path.join(d, name), dtype=dt, mode="r", shape=shape)
    split = lambda s: torch.from_numpy(np.fromfile(os.path.join(d, f"{s}_set.bin"), dtype=np.uint32).astype(np.int64))
    return SimpleNamespace(
        n=n, e=e, dim=dim, classes=classes,
        indptr=torch.from_numpy(mm("indptr.bin", np.uint32, (n + 1,)).astype(np.int64)),
        indices=torch.from_numpy(mm("indices.bin", np.uint32, (e,)).astype(np.int64)),
        feat=torch.from_numpy(np.asarray(mm("feat.bin", np.float16 if dtype == "f16" else np.float32, (n, dim)))),
        label=torch.from_numpy(np.asarray(mm("label.bin", np.int64, (n,)))),
        train=split("train"), valid=split("valid"), test=split("test"),
    )

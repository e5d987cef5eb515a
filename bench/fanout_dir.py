"""A fanout dataset directory read into torch tensors, for the peer scripts (dgl_train.py,
pyg_train.py) that train other libraries on the same data.

`load(d, script)` reads meta.txt and memory-maps the arrays (GUIDE's dataset format): the
topology as int64 `indptr` / `indices` in CSC (row v lists v's in-neighbours), the features
as stored (f16 stays f16; callers widen per batch with `.float()`, free on f32), the labels
(int64, -1 unlabelled) and the three splits as int64 ids. A directory that is not CSC or
holds other feature types stops the calling script with a message naming it."""
import os
import sys
from types import SimpleNamespace

import numpy as np
import torch


def load(d, script):
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

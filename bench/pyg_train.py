#!/usr/bin/env python3
"""PyTorch Geometric mini-batch training on a fanout dataset directory, configured like `fanout train`.

Loads the SAME directory as `bench/dgl_train.py` through numpy memmaps (indptr.bin / indices.bin
in CSC: row v lists v's in-neighbours; feat.bin; label.bin; train/valid/test_set.bin) and builds a
`Data` whose `edge_index` is [sources = indices, destinations = repeat_interleave(arange(n),
in-degrees)], int64, already sorted by destination, so `NeighborLoader(..., is_sorted=True)`
takes the CSC as it is (no sort). Sampling is PyG's `NeighborLoader` with `num_neighbors` =
`--fanouts` as given: PyG, like fanout, lists fanouts in hop order from the seeds
(`num_neighbors[0]` is the first hop), so unlike DGL nothing is reversed. Models: GraphSAGE =
`SAGEConv(aggr="mean")`, GCN = `GCNConv` with its defaults (self-loops added, symmetric
normalisation computed on the sampled subgraph), GAT = `GATConv` with 8 heads (hidden layers
concatenate 8 heads of hidden / 8 columns, the output layer averages 8 heads of the classes:
`heads=8, concat=False`), ReLU + dropout between layers (not on the input, not on the logits),
Adam (optional L2 weight decay), cross-entropy with ignore_index=-1 over the batch's seeds
(`out[:batch.batch_size]`). Evaluation samples the validation and test sets with the same
fanouts and loader settings (shuffle=False, under torch.no_grad()), after the last epoch and
every `--eval-every` epochs, under one fixed random key as `dgl_train.py` does (torch's
generators, which drive torch-sparse's sampler too, are reseeded for evaluation and training's
streams restored after; with `--num-workers` > 0 persistent workers keep their own streams, so
that key only holds for `--num-workers 0`). The reported test accuracy is that of the
best-validation epoch.

Sampler backend and layer execution. Without pyg-lib, PyG 2.8 samples through
`torch.ops.torch_sparse.neighbor_sample`, which returns only the sampled nodes and edges, not
per-hop counts (`num_sampled_nodes` / `num_sampled_edges` are None), so `trim_to_layer` cannot
be used: every layer runs over the whole sampled subgraph and only the first `batch_size`
rows of the last layer are used. That is how PyG runs without pyg-lib, and it is what this
script does (with pyg-lib present it would still not trim, to keep one code path). torch-sparse
samples each vertex once, at the hop where it first appears (the frontier of hop h+1 is only
the vertices new at hop h); DGL and fanout instead sample hop h+1 from every destination of
block h, seeds included, so PyG's subgraphs are somewhat smaller for the same fanouts.

Feature placement (`--features`):
  host    standard PyG: `Data.x` / `Data.y` stay in host memory; the loader slices the sampled
          rows (its `filter_fn`, inside `next(iterator)`, so that slicing is counted in sample_s,
          or in the workers with `--num-workers` > 0) and `batch.to(device)` moves them.
  device  x and y are moved to the device once; the loader's `Data` has no features, so it only
          yields node ids and edges, and the rows are gathered on the device with
          `x[batch.n_id]` (on `--device cpu` this just pre-gathers in the same memory).
f16 features stay f16 in memory and are widened per batch (`.float()`), as in dgl_train.py.

Per-epoch stage times, measured in-process: sample = waiting on the loader's iterator, extract =
moving / gathering the batch onto the device (torch.cuda.synchronize() after it on CUDA), train
= forward + backward + optimiser step including float(loss), which synchronises. With
`--num-workers` > 0 the loader uses persistent workers and sample_s is only the wait.

The CPU-only torch-scatter build that may sit beside torch-sparse (torch-sparse imports it) has no
CUDA kernels; PyG would route a few CUDA ops to it (scatter max/min with gradients,
`segment_csr`), so on CUDA this script turns PyG's use of torch-scatter off when torch-scatter
reports no CUDA. None of the three models here takes those paths with a plain edge_index.

Prints one JSON object shaped like `fanout train --metrics-out` / dgl_train.py: test_acc,
median_epoch_s (over the epochs after the first) and `epochs` (epoch, wall_s, sample_s,
extract_s, train_s, loss, train_acc, val_acc, test_acc, mean sampled nodes / edges per batch),
plus "framework": "pyg", the torch / torch_geometric / torch_sparse versions and the device name.
"""
import json
import os
import platform
import random
import statistics
import sys
import time
import warnings


def parse():
    from fanout_dir import train_args

    p = train_args(__doc__, ["sage", "gcn", "gat"], "hop order from the seeds (fanout's and PyG's order)")
    p.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    p.add_argument("--num-workers", type=int, default=0, help="loader worker processes (persistent when > 0)")
    p.add_argument("--features", choices=["host", "device"], default="host")
    return p.parse_args()


HEADS = 8  # attention heads of `fanout train --model gat`


def main():
    a = parse()
    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    # Read-only memmaps back the features as in dgl_train.py; nothing writes to them.
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    import torch_geometric
    import torch_geometric.typing as pyg_typing
    from torch_geometric.data import Data
    from torch_geometric.loader import NeighborLoader
    from torch_geometric.nn import GATConv, GCNConv, SAGEConv

    if not (pyg_typing.WITH_PYG_LIB or pyg_typing.WITH_TORCH_SPARSE):
        sys.exit("pyg_train.py: PyG's NeighborLoader needs pyg-lib or torch-sparse (neither imports)")
    device = torch.device(a.device)
    cuda = device.type == "cuda"
    scatter_cuda = None
    if pyg_typing.WITH_TORCH_SCATTER:
        import torch_scatter
        scatter_cuda = int(torch.ops.torch_scatter.cuda_version()) != -1
        if cuda and not scatter_cuda:
            pyg_typing.WITH_TORCH_SCATTER = False  # CPU-only build: keep PyG's CUDA ops off it

    torch.set_num_threads(a.threads)
    if a.flush_denormal:
        torch.set_flush_denormal(True)
    random.seed(a.seed)
    np.random.seed(a.seed)
    torch.manual_seed(a.seed)

    from fanout_dir import load

    d = a.dataset
    t_load = time.perf_counter()
    ds = load(d, "pyg_train.py")
    n, e, dim, classes = ds.n, ds.e, ds.dim, ds.classes
    # CSC row v lists v's in-neighbours: edge j goes indices[j] -> v for indptr[v] <= j < indptr[v+1],
    # so (sources, destinations) is sorted by destination as is_sorted=True requires.
    dst = torch.repeat_interleave(torch.arange(n, dtype=torch.int64), ds.indptr[1:] - ds.indptr[:-1], output_size=e)
    edge_index = torch.stack([ds.indices, dst])
    del dst
    ds.indices = None  # edge_index holds them now
    feat, label = ds.feat, ds.label
    train_nids, valid_nids, test_nids = ds.train, ds.valid, ds.test

    if a.features == "host":
        data = Data(x=feat, y=label, edge_index=edge_index, num_nodes=n)
        x_dev = y_dev = None
    else:
        data = Data(edge_index=edge_index, num_nodes=n)
        x_dev, y_dev = feat.to(device), label.to(device)
    load_s = time.perf_counter() - t_load

    if a.model == "gat" and a.hidden % HEADS:
        sys.exit(f"pyg_train.py: GAT's hidden size must be a multiple of its {HEADS} heads")
    fanouts = [int(x) for x in a.fanouts.split(",")]
    layers = len(fanouts)

    def loader(nids, shuffle):
        return NeighborLoader(
            data, num_neighbors=fanouts, input_nodes=nids, batch_size=a.batch_size, shuffle=shuffle,
            drop_last=False, is_sorted=True, num_workers=a.num_workers,
            persistent_workers=a.num_workers > 0)

    t = time.perf_counter()
    train_loader = loader(train_nids, True)
    valid_loader = loader(valid_nids, False) if len(valid_nids) else None
    test_loader = loader(test_nids, False) if len(test_nids) else None
    loader_s = time.perf_counter() - t

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            dims = [dim] + [a.hidden] * (layers - 1) + [classes]

            def conv(i, o, last):
                if a.model == "sage":
                    return SAGEConv(i, o, aggr="mean")
                if a.model == "gcn":
                    return GCNConv(i, o)
                if last:  # average the 8 heads of the classes
                    return GATConv(i, o, heads=HEADS, concat=False)
                return GATConv(i, o // HEADS, heads=HEADS)  # concatenate 8 heads of hidden / 8

            self.layers = nn.ModuleList(conv(dims[i], dims[i + 1], i + 1 == layers) for i in range(layers))
            self.drop = nn.Dropout(a.dropout)

        def forward(self, x, edge_index):
            # No trim_to_layer: torch-sparse gives no per-hop counts, so every layer runs over the
            # whole sampled subgraph; the caller keeps the first batch_size rows.
            h = x
            for i, layer in enumerate(self.layers):
                h = layer(h, edge_index)
                if i + 1 < layers:
                    h = self.drop(F.relu(h))
            return h

    model = Net().to(device)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr, weight_decay=a.weight_decay)
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def to_device(batch):
        """The batch's features, labels of its seeds and edges, on the device."""
        bs = batch.batch_size
        if a.features == "host":
            batch = batch.to(device)
            x, y = batch.x.float(), batch.y[:bs]
            ei = batch.edge_index
        else:
            nid = batch.n_id.to(device)
            x, y = x_dev[nid].float(), y_dev[nid[:bs]]
            ei = batch.edge_index.to(device)
        sync()
        return x, y, ei, bs

    def evaluate(ld):
        model.eval()
        correct = total = 0
        with torch.random.fork_rng(devices=[device] if cuda else []):
            torch.manual_seed(0x5EED + a.seed)
            with torch.no_grad():
                for batch in ld:
                    x, y, ei, bs = to_device(batch)
                    pred = model(x, ei)[:bs].argmax(1)
                    mask = y >= 0
                    correct += int((pred[mask] == y[mask]).sum())
                    total += int(mask.sum())
        return correct / max(total, 1)

    epochs, best = [], (-1.0, 0.0, 0)
    for epoch in range(a.epochs):
        model.train()
        ts = te = tt = 0.0
        loss_sum = correct = count = 0
        steps = nodes = edges = 0
        t0 = time.perf_counter()
        it = iter(train_loader)
        while True:
            t = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                break
            t1 = time.perf_counter()
            x, y, ei, bs = to_device(batch)
            t2 = time.perf_counter()
            logits = model(x, ei)[:bs]
            loss = F.cross_entropy(logits, y, ignore_index=-1)
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss_f = float(loss.detach())
            t3 = time.perf_counter()
            ts, te, tt = ts + t1 - t, te + t2 - t1, tt + t3 - t2
            mask = y >= 0
            m = int(mask.sum())
            loss_sum += loss_f * m
            correct += int((logits.argmax(1)[mask] == y[mask]).sum())
            count += m
            steps += 1
            nodes += int(batch.n_id.numel())
            edges += int(batch.edge_index.size(1))
        wall = time.perf_counter() - t0
        rec = {"epoch": epoch, "wall_s": wall, "sample_s": ts, "extract_s": te, "train_s": tt,
               "loss": loss_sum / max(count, 1), "train_acc": correct / max(count, 1),
               "val_acc": None, "test_acc": None, "steps": steps,
               "nodes_per_batch": nodes / max(steps, 1), "edges_per_batch": edges / max(steps, 1)}
        if epoch + 1 == a.epochs or (a.eval_every > 0 and (epoch + 1) % a.eval_every == 0):
            t = time.perf_counter()
            rec["val_acc"] = evaluate(valid_loader) if valid_loader is not None else None
            rec["test_acc"] = evaluate(test_loader) if test_loader is not None else None
            rec["eval_s"] = time.perf_counter() - t
            v = rec["val_acc"] if rec["val_acc"] is not None else float("inf")
            if v > best[0] or v == float("inf"):
                best = (v, rec["test_acc"] or 0.0, epoch)
        print(f"pyg epoch {epoch:3d} {wall:7.2f}s sample {ts:.2f}s extract {te:.2f}s train {tt:.2f}s "
              f"loss {rec['loss']:.4f} train_acc {rec['train_acc']:.4f} val_acc {rec['val_acc']} "
              f"test_acc {rec['test_acc']}", file=sys.stderr)
        epochs.append(rec)

    def version(mod):
        try:
            return __import__(mod).__version__
        except Exception:
            return None

    walls = [r["wall_s"] for r in epochs[1:]] or [epochs[0]["wall_s"]]
    print(json.dumps({
        "framework": "pyg",
        "peer": f"pyg {torch_geometric.__version__} (torch {torch.__version__}, "
                f"torch_sparse {version('torch_sparse')}, pyg_lib {version('pyg_lib')})",
        "torch": torch.__version__, "torch_geometric": torch_geometric.__version__,
        "torch_sparse": version("torch_sparse"), "torch_scatter": version("torch_scatter"),
        "pyg_lib": version("pyg_lib"),
        "sampler_backend": "pyg-lib" if pyg_typing.WITH_PYG_LIB else "torch-sparse",
        "torch_scatter_cuda": scatter_cuda, "pyg_uses_torch_scatter": pyg_typing.WITH_TORCH_SCATTER,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if cuda else (platform.processor() or platform.machine()),
        "features": a.features, "num_workers": a.num_workers,
        "model": a.model, "dataset": d, "fanouts": fanouts, "batch_size": a.batch_size,
        "hidden": a.hidden, "lr": a.lr, "weight_decay": a.weight_decay, "dropout": a.dropout,
        "seed": a.seed, "threads": a.threads, "load_s": load_s, "loader_s": loader_s,
        "test_acc": best[1], "best_val_acc": best[0], "best_epoch": best[2],
        "median_epoch_s": statistics.median(walls), "epochs": epochs,
    }))


if __name__ == "__main__":
    main()

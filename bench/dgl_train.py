#!/usr/bin/env python3
"""DGL's CPU mini-batch training on a fanout dataset directory, configured like `fanout train`.

Loads the SAME directory through numpy memmaps (indptr.bin / indices.bin in CSC: row v lists
v's in-neighbours; feat.bin; label.bin; train/valid/test_set.bin), samples with
`dgl.dataloading.NeighborSampler` (fanouts given in fanout's hop order from the seeds and
reversed here, since DGL lists them from the input layer) and trains the same model:
GraphSAGE = `SAGEConv(mean)` layers, GCN = `GraphConv(norm="both", allow_zero_in_degree=True)`
layers, GAT = `GATConv` with 8 heads (hidden layers concatenate 8 heads of hidden / 8 columns,
the output layer averages 8 heads of the classes, as `fanout train --model gat`), GIN =
`GINConv(MLP, "sum", learn_eps=True)` with the MLP Linear-ReLU-Linear (hidden width inside);
ReLU + dropout between layers (not on the input, not on the logits), Adam with L2 weight
decay, cross-entropy. Evaluation samples the validation and test sets with the same
fanouts (DGL's standard mini-batch evaluation), as `fanout train` does, and like it under one
fixed random key: DGL's and torch's generators are reseeded to the same value before every
evaluation (and training's streams restored after), so every evaluation of a model sees the same
sampled neighbourhoods. The reported test accuracy is that of the best-validation epoch.

Per-stage busy times, measured in-process (num_workers=0, so the stages run one after the
other): sample = waiting on the DataLoader iterator, extract = `feat[input_nodes].float()` and label
gather, train = forward + backward + optimiser step.

Prints one JSON object shaped like `fanout train --metrics-out`: test_acc, median_epoch_s and
`epochs` (epoch, wall_s, sample_s, extract_s, train_s, loss, train_acc, val_acc, test_acc).
"""
import json
import os
import statistics
import sys
import time


def parse():
    from fanout_dir import train_args

    p = train_args(__doc__, ["sage", "gcn", "gat", "gin"], "hop order from the seeds (fanout's order)")
    return p.parse_args()


HEADS = 8  # attention heads of `fanout train --model gat`


def main():
    a = parse()
    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    os.environ.setdefault("DGLBACKEND", "pytorch")
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    import dgl
    import dgl.nn as dglnn

    torch.set_num_threads(a.threads)
    if a.flush_denormal:
        torch.set_flush_denormal(True)
    torch.manual_seed(a.seed)
    np.random.seed(a.seed)
    dgl.seed(a.seed)

    from fanout_dir import load

    ds = load(a.dataset, "dgl_train.py")
    n, dim, classes = ds.n, ds.dim, ds.classes
    g = dgl.graph(("csc", (ds.indptr, ds.indices, torch.tensor([], dtype=torch.int64))), num_nodes=n)
    g = g.formats(["csc"])
    # f16 features stay f16 in memory and are widened per batch, as a DGL user storing them
    # so would do (`.float()` is free on f32).
    feat, label = ds.feat, ds.label
    train_nids, valid_nids, test_nids = ds.train, ds.valid, ds.test

    if a.model == "gat" and a.hidden % HEADS:
        sys.exit(f"dgl_train.py: GAT's hidden size must be a multiple of its {HEADS} heads")
    fanouts = [int(x) for x in a.fanouts.split(",")]
    layers = len(fanouts)
    sampler = dgl.dataloading.NeighborSampler(list(reversed(fanouts)))
    loader = lambda nids, shuffle: dgl.dataloading.DataLoader(
        g, nids, sampler, batch_size=a.batch_size, shuffle=shuffle, drop_last=False, num_workers=0)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            dims = [dim] + [a.hidden] * (layers - 1) + [classes]

            def conv(i, o, last):
                if a.model == "sage":
                    return dglnn.SAGEConv(i, o, "mean")
                if a.model == "gcn":
                    return dglnn.GraphConv(i, o, norm="both", allow_zero_in_degree=True)
                if a.model == "gat":
                    return dglnn.GATConv(i, o if last else o // HEADS, HEADS, allow_zero_in_degree=True)
                mlp = nn.Sequential(nn.Linear(i, a.hidden), nn.ReLU(), nn.Linear(a.hidden, o))
                return dglnn.GINConv(mlp, "sum", learn_eps=True)

            self.layers = nn.ModuleList(conv(dims[i], dims[i + 1], i + 1 == layers) for i in range(layers))
            self.drop = nn.Dropout(a.dropout)

        def forward(self, blocks, x):
            h = x
            for i, (layer, block) in enumerate(zip(self.layers, blocks)):
                h = layer(block, h)
                if a.model == "gat":
                    # GATConv gives (nodes, heads, width): concatenate hidden heads, average the output's.
                    h = h.flatten(1) if i + 1 < layers else h.mean(1)
                if i + 1 < layers:
                    h = self.drop(F.relu(h))
            return h

    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=a.lr, weight_decay=a.weight_decay)

    def evaluate(nids, epoch):
        state = torch.get_rng_state()
        dgl.seed(0x5EED + a.seed)
        torch.manual_seed(0x5EED + a.seed)
        model.eval()
        correct = total = 0
        with torch.no_grad():
            for input_nodes, output_nodes, blocks in loader(nids, False):
                y = label[output_nodes]
                pred = model(blocks, feat[input_nodes].float()).argmax(1)
                mask = y >= 0
                correct += int((pred[mask] == y[mask]).sum())
                total += int(mask.sum())
        torch.set_rng_state(state)
        dgl.seed(a.seed * 1_000_003 + epoch + 1)
        return correct / max(total, 1)

    epochs, best = [], (-1.0, 0.0, 0)
    for epoch in range(a.epochs):
        model.train()
        ts = te = tt = 0.0
        loss_sum = correct = count = 0
        t0 = time.perf_counter()
        it = iter(loader(train_nids, True))
        while True:
            t = time.perf_counter()
            try:
                input_nodes, output_nodes, blocks = next(it)
            except StopIteration:
                break
            t1 = time.perf_counter()
            x = feat[input_nodes].float()
            y = label[output_nodes]
            t2 = time.perf_counter()
            logits = model(blocks, x)
            loss = F.cross_entropy(logits, y, ignore_index=-1)
            opt.zero_grad()
            loss.backward()
            opt.step()
            t3 = time.perf_counter()
            ts, te, tt = ts + t1 - t, te + t2 - t1, tt + t3 - t2
            m = int((y >= 0).sum())
            loss_sum += float(loss) * m
            correct += int((logits.argmax(1)[y >= 0] == y[y >= 0]).sum())
            count += m
        wall = time.perf_counter() - t0
        rec = {"epoch": epoch, "wall_s": wall, "sample_s": ts, "extract_s": te, "train_s": tt,
               "loss": loss_sum / max(count, 1), "train_acc": correct / max(count, 1),
               "val_acc": None, "test_acc": None}
        if epoch + 1 == a.epochs or (a.eval_every > 0 and (epoch + 1) % a.eval_every == 0):
            t = time.perf_counter()
            rec["val_acc"] = evaluate(valid_nids, epoch) if len(valid_nids) else None
            rec["test_acc"] = evaluate(test_nids, epoch) if len(test_nids) else None
            rec["eval_s"] = time.perf_counter() - t
            v = rec["val_acc"] if rec["val_acc"] is not None else float("inf")
            if v > best[0] or v == float("inf"):
                best = (v, rec["test_acc"] or 0.0, epoch)
        print(f"dgl epoch {epoch:3d} {wall:7.2f}s sample {ts:.2f}s extract {te:.2f}s train {tt:.2f}s "
              f"loss {rec['loss']:.4f} train_acc {rec['train_acc']:.4f} val_acc {rec['val_acc']}", file=sys.stderr)
        epochs.append(rec)
    walls = [r["wall_s"] for r in epochs[1:]] or [epochs[0]["wall_s"]]
    print(json.dumps({
        "peer": f"dgl {dgl.__version__} (torch {torch.__version__})",
        "model": a.model, "dataset": a.dataset, "fanouts": fanouts, "batch_size": a.batch_size,
        "hidden": a.hidden, "lr": a.lr, "weight_decay": a.weight_decay, "dropout": a.dropout,
        "seed": a.seed, "threads": a.threads,
        "test_acc": best[1], "best_val_acc": best[0], "best_epoch": best[2],
        "median_epoch_s": statistics.median(walls), "epochs": epochs,
    }))


if __name__ == "__main__":
    main()

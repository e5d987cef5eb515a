#!/usr/bin/env python3
"""fanout's Python loader against DGL's DataLoader, in one interpreter, on one dataset directory.

One run of one configuration, printed as one JSON object (bench/python_vs_dgl.sh alternates the
configurations and tabulates them):

- ``--loader fanout``: ``fanout.NeighborLoader`` (sampling and gathering on fanout's Rust
  threads, ``--threads`` of them), batches turned into tensors by ``fanout.torch.to_torch``;
- ``--loader dgl``: ``dgl.dataloading.DataLoader`` over ``NeighborSampler`` (fanouts reversed,
  DGL lists them from the input layer), ``num_workers=0`` (sampling on DGL's OpenMP threads in
  the main process), features gathered by ``feat[input_nodes]`` from a numpy memmap of the same
  ``feat.bin``, as bench/dgl_train.py does.

``--mode loader`` only iterates: every batch is produced, its features and blocks made torch
tensors (and, for ``--model dgl``, DGL blocks), then dropped: batches per second with features,
the loader's own cost. ``--mode train`` trains a 2-layer GraphSAGE (mean) with Adam, ReLU and
dropout between layers, and evaluates the best-validation epoch's test accuracy:
``--model torch`` is ``fanout.torch.GraphSAGE`` (plain PyTorch, ``index_add_`` aggregation,
what python/examples/train_sage.py trains), ``--model dgl`` is ``dgl.nn.SAGEConv("mean")``
(DGL's fused CPU SpMM); a fanout batch reaches a DGL model through ``dgl.create_block``.
Evaluation samples validation and test sets with the training fanouts under one fixed key.
"""
import argparse
import json
import os
import statistics
import sys
import time


def parse():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", required=True)
    p.add_argument("--mode", choices=["loader", "train"], default="train")
    p.add_argument("--loader", choices=["fanout", "dgl"], required=True)
    p.add_argument("--model", choices=["torch", "dgl"], default="torch")
    p.add_argument("--fanouts", default="10,25", help="hop order from the seeds (fanout's order)")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--lr", type=float, default=0.003)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--dropout", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    return p.parse_args()


def main():
    a = parse()
    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    os.environ.setdefault("DGLBACKEND", "pytorch")
    import numpy as np
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    np.random.seed(a.seed)
    fanouts = [int(x) for x in a.fanouts.split(",")]
    need_dgl = a.loader == "dgl" or a.model == "dgl"
    if need_dgl:
        import dgl
        import dgl.nn as dglnn

        dgl.seed(a.seed)

    import fanout
    from fanout.torch import GraphSAGE, to_torch

    ds = fanout.Dataset(a.dataset)
    dim, classes = ds.feat_dim, ds.num_classes

    # Each loader yields (x, y, blocks, num_seeds) with blocks in the model's form.
    if a.loader == "fanout":
        mk = lambda seeds, shuffle: fanout.NeighborLoader(
            ds, seeds, fanouts, a.batch_size, shuffle=shuffle, seed=a.seed, num_threads=a.threads)
        loaders = {s: mk(s, s == "train") for s in ["train", "valid", "test"]}

        def as_model_blocks(tb):
            if a.model == "torch":
                return tb.blocks
            return [dgl.create_block((b.src, b.dst), num_src_nodes=b.num_src, num_dst_nodes=b.num_dst)
                    for b in tb.blocks]

        def batches(split, epoch):
            it = loaders[split] if epoch is None else loaders[split].epoch(epoch)
            for batch in it:
                tb = to_torch(batch)
                yield tb.x, tb.y, as_model_blocks(tb), tb.num_seeds

        train_batches = lambda epoch: batches("train", None)
        eval_batches = lambda split: batches(split, fanout.EVAL_EPOCH)
        num_batches = len(loaders["train"])
        reseed_eval = lambda: None
    else:
        d = a.dataset
        n, e = ds.num_nodes, ds.num_edges
        mm = lambda name, dt, shape: np.memmap(os.path.join(d, name), dtype=dt, mode="r", shape=shape)
        indptr = torch.from_numpy(mm("indptr.bin", np.uint32, (n + 1,)).astype(np.int64))
        indices = torch.from_numpy(mm("indices.bin", np.uint32, (e,)).astype(np.int64))
        g = dgl.graph(("csc", (indptr, indices, torch.tensor([], dtype=torch.int64))), num_nodes=n)
        g = g.formats(["csc"])
        feat = torch.from_numpy(np.asarray(mm("feat.bin", np.float32, (n, dim))))  # the same memmap DGL users make
        label = torch.from_numpy(np.asarray(mm("label.bin", np.int64, (n,))))
        split_ids = {s: torch.from_numpy(np.asarray(getattr(ds, s + "_idx")).astype(np.int64))
                     for s in ["train", "valid", "test"]}
        sampler = dgl.dataloading.NeighborSampler(list(reversed(fanouts)))
        mk = lambda s, shuffle: dgl.dataloading.DataLoader(
            g, split_ids[s], sampler, batch_size=a.batch_size, shuffle=shuffle, drop_last=False, num_workers=0)

        def to_torch_blocks(blocks):
            if a.model == "dgl":
                return blocks
            out = []
            for b in blocks:
                src, dst = b.edges()
                out.append(fanout.torch.TorchBlock(src, dst, b.num_src_nodes(), b.num_dst_nodes()))
            return out

        def batches(split, shuffle):
            for input_nodes, output_nodes, blocks in mk(split, shuffle):
                yield feat[input_nodes], label[output_nodes], to_torch_blocks(blocks), len(output_nodes)

        train_batches = lambda epoch: batches("train", True)
        eval_batches = lambda split: batches(split, False)
        num_batches = -(-len(split_ids["train"]) // a.batch_size)

        def reseed_eval():
            dgl.seed(0x5EED + a.seed)

    if a.model == "torch":
        model = GraphSAGE(dim, a.hidden, classes, num_layers=len(fanouts), dropout=a.dropout)
        forward = lambda blocks, x: model(blocks, x)
    else:
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                dims = [dim] + [a.hidden] * (len(fanouts) - 1) + [classes]
                self.layers = nn.ModuleList(dglnn.SAGEConv(i, o, "mean") for i, o in zip(dims, dims[1:]))
                self.drop = nn.Dropout(a.dropout)

            def forward(self, blocks, x):
                for i, (layer, block) in enumerate(zip(self.layers, blocks)):
                    x = layer(block, x)
                    if i + 1 < len(self.layers):
                        x = self.drop(F.relu(x))
                return x

        model = Net()
        forward = lambda blocks, x: model(blocks, x)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr, weight_decay=a.weight_decay)

    def evaluate(split):
        state = torch.get_rng_state()
        reseed_eval()
        model.eval()
        correct = total = 0
        with torch.no_grad():
            for x, y, blocks, _ in eval_batches(split):
                keep = y >= 0
                correct += int((forward(blocks, x).argmax(1)[keep] == y[keep]).sum())
                total += int(keep.sum())
        torch.set_rng_state(state)
        return correct / max(total, 1)

    epochs, best = [], (-1.0, 0.0, -1)
    for epoch in range(a.epochs):
        model.train()
        t0 = time.perf_counter()
        wait = compute = 0.0
        loss_sum = count = steps = 0
        t = time.perf_counter()
        for x, y, blocks, _ in train_batches(epoch):
            t1 = time.perf_counter()
            wait += t1 - t
            steps += 1
            if a.mode == "train":
                logits = forward(blocks, x)
                loss = F.cross_entropy(logits, y, ignore_index=-1)
                opt.zero_grad()
                loss.backward()
                opt.step()
                m = int((y >= 0).sum())
                loss_sum += float(loss) * m
                count += m
            t = time.perf_counter()
            compute += t - t1
        wall = time.perf_counter() - t0
        rec = {"epoch": epoch, "wall_s": wall, "batches": steps, "batches_per_s": steps / wall,
               "loader_wait_s": wait, "train_s": compute}
        if a.mode == "train":
            rec["loss"] = loss_sum / max(count, 1)
            rec["val_acc"], rec["test_acc"] = evaluate("valid"), evaluate("test")
            if rec["val_acc"] > best[0]:
                best = (rec["val_acc"], rec["test_acc"], epoch)
        print(f"{a.loader}/{a.model} epoch {epoch} {wall:.2f}s {steps / wall:.1f} batches/s "
              f"wait {wait:.2f}s {('loss %.4f val %.4f' % (rec['loss'], rec['val_acc'])) if a.mode == 'train' else ''}",
              file=sys.stderr)
        epochs.append(rec)
    assert epochs[0]["batches"] == num_batches, (epochs[0]["batches"], num_batches)
    walls = [r["wall_s"] for r in epochs[1:]] or [epochs[0]["wall_s"]]
    print(json.dumps({
        "loader": a.loader, "model": a.model, "mode": a.mode, "dataset": a.dataset,
        "versions": {"torch": torch.__version__, "dgl": dgl.__version__ if need_dgl else None},
        "fanouts": fanouts, "batch_size": a.batch_size, "hidden": a.hidden, "seed": a.seed,
        "threads": a.threads, "median_epoch_s": statistics.median(walls),
        "batches_per_s": statistics.median(r["batches_per_s"] for r in (epochs[1:] or epochs)),
        "test_acc": best[1] if a.mode == "train" else None, "best_epoch": best[2], "epochs": epochs,
    }))


if __name__ == "__main__":
    main()

"""Train a plain-PyTorch GraphSAGE on cora with fanout's NeighborLoader.

fanout samples the neighbourhoods and gathers the features on Rust threads; the model below is
ordinary PyTorch (mean aggregation written with ``index_add_`` over each block's edges), so the
same loop works for any model that takes DGL-style blocks or PyG-style edge indices.

    python python/examples/train_sage.py                       # cora from ../shared/datasets
    python python/examples/train_sage.py --data data/cora --epochs 20 --seed 3

``--data`` is a fanout dataset directory or a NumPy directory (edge_index.npy, node_feat.npy,
...), which is imported into a temporary dataset first. Prints each epoch's time, loss and
accuracies, then the test accuracy of the best-validation epoch (what ``fanout train``
reports) and of the last epoch.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

# OpenMP threads that spin while waiting slow everything down when fanout's threads (or
# another process) hold a core; set before torch loads OpenMP.
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import fanout  # noqa: E402
from fanout.torch import to_torch  # noqa: E402

HERE = Path(__file__).resolve()
DEFAULT_DATA = HERE.parents[2].parent / "shared" / "datasets" / "cora"


class SAGELayer(nn.Module):
    """h_dst = x_dst W_self + mean_{s -> d} x_src[s] W_neigh + b (DGL SAGEConv "mean")."""

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.lin_self = nn.Linear(in_dim, out_dim, bias=False)
        self.lin_neigh = nn.Linear(in_dim, out_dim)
        gain = nn.init.calculate_gain("relu")
        nn.init.xavier_uniform_(self.lin_self.weight, gain=gain)
        nn.init.xavier_uniform_(self.lin_neigh.weight, gain=gain)
        nn.init.zeros_(self.lin_neigh.bias)

    def forward(self, x: torch.Tensor, block) -> torch.Tensor:
        src, dst, _num_src, num_dst = block  # local ids; destinations are x[:num_dst]
        agg = x.new_zeros(num_dst, x.shape[1]).index_add_(0, dst, x[src])
        deg = torch.bincount(dst, minlength=num_dst).clamp(min=1).unsqueeze(1)
        return self.lin_self(x[:num_dst]) + self.lin_neigh(agg / deg)


class GraphSAGE(nn.Module):
    def __init__(self, in_dim: int, hidden: int, classes: int, layers: int, dropout: float):
        super().__init__()
        dims = [in_dim] + [hidden] * (layers - 1) + [classes]
        self.layers = nn.ModuleList(SAGELayer(a, b) for a, b in zip(dims, dims[1:]))
        self.dropout = nn.Dropout(dropout)

    def forward(self, blocks, x: torch.Tensor) -> torch.Tensor:
        for i, (layer, block) in enumerate(zip(self.layers, blocks)):
            x = layer(x, block)
            if i + 1 < len(self.layers):
                x = self.dropout(F.relu(x))
        return x


@torch.no_grad()
def accuracy(model: nn.Module, loader: fanout.NeighborLoader) -> float:
    model.eval()
    correct = total = 0
    # One fixed epoch key, so every evaluation sees the same sampled neighbourhoods.
    for batch in loader.epoch(fanout.EVAL_EPOCH):
        b = to_torch(batch)
        keep = b.y >= 0
        correct += (model(b.blocks, b.x).argmax(1)[keep] == b.y[keep]).sum().item()
        total += keep.sum().item()
    return correct / max(total, 1)


def open_dataset(path: Path, tmp: str) -> fanout.Dataset:
    if (path / "meta.txt").exists():
        return fanout.Dataset(path)
    out = Path(tmp) / path.name
    fanout.import_npy(path, out)
    return fanout.Dataset(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=DEFAULT_DATA)
    p.add_argument("--fanouts", default="10,25", help="hop order from the seeds")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--weight-decay", type=float, default=5e-4)
    p.add_argument("--dropout", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch threads")
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    fanouts = [int(f) for f in a.fanouts.split(",")]

    with tempfile.TemporaryDirectory() as tmp:
        ds = open_dataset(a.data, tmp)
        print(ds)
        train = fanout.NeighborLoader(ds, "train", fanouts, a.batch_size, seed=a.seed)
        valid = fanout.NeighborLoader(ds, "valid", fanouts, a.batch_size, shuffle=False, seed=a.seed)
        test = fanout.NeighborLoader(ds, "test", fanouts, a.batch_size, shuffle=False, seed=a.seed)
        model = GraphSAGE(ds.feat_dim, a.hidden, ds.num_classes, len(fanouts), a.dropout)
        opt = torch.optim.Adam(model.parameters(), lr=a.lr, weight_decay=a.weight_decay)

        best = (-1.0, 0.0, -1)  # (val acc, test acc, epoch)
        for epoch in range(a.epochs):
            model.train()
            t0 = time.perf_counter()
            total_loss = n = 0
            for batch in train:
                b = to_torch(batch)
                loss = F.cross_entropy(model(b.blocks, b.x), b.y, ignore_index=-1)
                opt.zero_grad()
                loss.backward()
                opt.step()
                total_loss += loss.item() * b.num_seeds
                n += b.num_seeds
            train_s = time.perf_counter() - t0
            sample_s, extract_s = train.take_times()
            val_acc, test_acc = accuracy(model, valid), accuracy(model, test)
            if val_acc > best[0]:
                best = (val_acc, test_acc, epoch)
            print(
                f"epoch {epoch:>3}  {train_s:6.3f}s (fanout sample {sample_s:.3f}s, "
                f"gather {extract_s:.3f}s, on Rust threads)  loss {total_loss / n:.4f}  "
                f"val_acc {val_acc:.4f}  test_acc {test_acc:.4f}"
            )
        print(
            f"test accuracy {best[1]:.4f} (best validation {best[0]:.4f} at epoch {best[2]}); "
            f"last epoch {test_acc:.4f}"
        )


if __name__ == "__main__":
    main()

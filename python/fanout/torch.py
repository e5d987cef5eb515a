"""PyTorch helpers: batches as tensors, blocks for PyG and DGL, and fanout checkpoints as
plain ``torch.nn.Module`` s.

Neither DGL nor PyG is imported. A block becomes

- ``edge_index(block)``: an ``int64 [2, E]`` tensor, row 0 the local source ids, row 1 the
  local destination ids (PyG's ``flow="source_to_target"``); the destination features are
  ``x[:block.num_dst]`` (PyG's bipartite ``(x, x[:num_dst])`` convention);
- ``dgl_block(block)``: ``(src, dst, num_src, num_dst)``, the arguments of
  ``dgl.create_block((src, dst), num_src_nodes=num_src, num_dst_nodes=num_dst)``.

:func:`load_checkpoint` rebuilds a GraphSAGE or GCN checkpoint of ``fanout train`` as
:class:`GraphSAGE` / :class:`GCN`, whose forward on a batch's blocks computes what fanout's
own forward computes (same formulas; float32 rounding aside).
"""

from __future__ import annotations

import os
from typing import Any, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import Tensor, nn

from .loader import Block, MiniBatch

__all__ = [
    "GCN",
    "GCNConv",
    "GraphSAGE",
    "SAGEConv",
    "TorchBatch",
    "TorchBlock",
    "dgl_block",
    "edge_index",
    "load_checkpoint",
    "to_torch",
]

Device = Union[str, torch.device, None]


class TorchBlock(NamedTuple):
    """A block as tensors: ``src``/``dst`` (``int64 [E]``, local ids) and its sizes."""

    src: Tensor
    dst: Tensor
    num_src: int
    num_dst: int


class TorchBatch(NamedTuple):
    """A batch as tensors. ``x`` shares memory with the batch's numpy features (on CPU)."""

    x: Tensor
    """``float32 [num_input, feat_dim]`` input features."""
    y: Optional[Tensor]
    """``int64 [num_seeds]`` the seeds' labels (-1: unlabelled)."""
    blocks: List[TorchBlock]
    """One per layer, input layer first."""
    input_nodes: Tensor
    """``int64 [num_input]`` global ids."""
    num_seeds: int


def dgl_block(block: Block, device: Device = None) -> TorchBlock:
    """``(src, dst, num_src, num_dst)`` of a block: pass it as
    ``dgl.create_block((src, dst), num_src_nodes=num_src, num_dst_nodes=num_dst)``."""
    src = torch.from_numpy(block.indices.astype(np.int64))
    counts = torch.from_numpy(np.diff(block.indptr).astype(np.int64))
    dst = torch.repeat_interleave(torch.arange(block.num_dst, dtype=torch.int64), counts)
    if device is not None:
        src, dst = src.to(device), dst.to(device)
    return TorchBlock(src, dst, int(block.num_src), int(block.num_dst))


def edge_index(block: Block, device: Device = None) -> Tensor:
    """PyG-style ``int64 [2, E]`` edge index of a block (row 0 sources, row 1 destinations,
    local ids; sources index ``x``, destinations ``x[:block.num_dst]``)."""
    b = dgl_block(block, device)
    return torch.stack([b.src, b.dst])


def to_torch(batch: MiniBatch, device: Device = None) -> TorchBatch:
    """Converts a batch: features without a copy (``torch.from_numpy``) unless moved to
    ``device``; ids and labels as int64."""
    x = torch.from_numpy(batch.features)
    y = None if batch.labels is None else torch.from_numpy(batch.labels)
    ids = torch.from_numpy(batch.input_nodes.astype(np.int64))
    if device is not None:
        x = x.to(device, non_blocking=True)
        y = None if y is None else y.to(device)
        ids = ids.to(device)
    blocks = [dgl_block(b, device) for b in batch.blocks]
    return TorchBatch(x, y, blocks, ids, int(batch.num_seeds))


def _in_degrees(b: TorchBlock) -> Tensor:
    return torch.bincount(b.dst, minlength=b.num_dst)


class SAGEConv(nn.Module):
    """GraphSAGE, mean aggregator, on a block (DGL ``SAGEConv(aggregator_type="mean")``,
    fanout's ``SageLayer``)::

        h_dst = x[:num_dst] @ W_self + mean_{s -> d} x[s] @ W_neigh + bias

    A destination without edges gets only the self term. Checkpoint tensors:
    ``w_self`` / ``w_neigh`` ``[in, out]`` (= ``lin_self.weight.T`` / ``lin_neigh.weight.T``),
    ``bias`` ``[1, out]``.
    """

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.lin_self = nn.Linear(in_dim, out_dim, bias=False)
        self.lin_neigh = nn.Linear(in_dim, out_dim, bias=False)
        self.bias = nn.Parameter(torch.zeros(out_dim))
        gain = nn.init.calculate_gain("relu")
        nn.init.xavier_uniform_(self.lin_self.weight, gain=gain)
        nn.init.xavier_uniform_(self.lin_neigh.weight, gain=gain)

    def forward(self, x: Tensor, block: TorchBlock) -> Tensor:
        src, dst, _, num_dst = block
        agg = x.new_zeros(num_dst, x.shape[1]).index_add_(0, dst, x[src])
        agg = agg / _in_degrees(block).clamp(min=1).to(x.dtype).unsqueeze(1)
        return self.lin_self(x[:num_dst]) + self.lin_neigh(agg) + self.bias


class GCNConv(nn.Module):
    """GCN on a block (DGL ``GraphConv(norm="both")``, fanout's ``GcnLayer``)::

        h_dst[d] = sum_{s -> d} x[s] / sqrt(max(out_deg(s), 1) * max(in_deg(d), 1)) @ W + bias

    with degrees counted on the block's edges and no self-loop added. Checkpoint tensors:
    ``weight`` ``[in, out]`` (= ``lin.weight.T``), ``bias`` ``[1, out]``.
    """

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.lin = nn.Linear(in_dim, out_dim, bias=False)
        self.bias = nn.Parameter(torch.zeros(out_dim))
        nn.init.xavier_uniform_(self.lin.weight)

    def forward(self, x: Tensor, block: TorchBlock) -> Tensor:
        src, dst, num_src, num_dst = block
        out_deg = torch.bincount(src, minlength=num_src).clamp(min=1).to(x.dtype)
        in_deg = _in_degrees(block).clamp(min=1).to(x.dtype)
        coeff = (out_deg[src] * in_deg[dst]).rsqrt().unsqueeze(1)
        agg = x.new_zeros(num_dst, x.shape[1]).index_add_(0, dst, x[src] * coeff)
        return self.lin(agg) + self.bias


class _Stack(nn.Module):
    """Layers on blocks (input layer first) with ReLU and dropout between them."""

    def __init__(self, layers: Sequence[nn.Module], dropout: float) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.dropout = nn.Dropout(dropout)

    def forward(self, blocks: Sequence[TorchBlock], x: Tensor) -> Tensor:
        if len(blocks) != len(self.layers):
            raise ValueError(f"model has {len(self.layers)} layers but was given {len(blocks)} blocks")
        h = x
        for i, (layer, block) in enumerate(zip(self.layers, blocks)):
            h = layer(h, block)
            if i + 1 < len(self.layers):
                h = self.dropout(torch.relu(h))
        return h


def _dims(in_dim: int, hidden: int, num_classes: int, num_layers: int) -> List[Tuple[int, int]]:
    return [
        (in_dim if i == 0 else hidden, num_classes if i + 1 == num_layers else hidden)
        for i in range(num_layers)
    ]


class GraphSAGE(_Stack):
    """``num_layers`` :class:`SAGEConv` layers (fanout's ``--model sage``)."""

    def __init__(self, in_dim: int, hidden: int, num_classes: int, num_layers: int = 2, dropout: float = 0.5) -> None:
        dims = _dims(in_dim, hidden, num_classes, num_layers)
        super().__init__([SAGEConv(a, b) for a, b in dims], dropout)


class GCN(_Stack):
    """``num_layers`` :class:`GCNConv` layers (fanout's ``--model gcn``)."""

    def __init__(self, in_dim: int, hidden: int, num_classes: int, num_layers: int = 3, dropout: float = 0.5) -> None:
        dims = _dims(in_dim, hidden, num_classes, num_layers)
        super().__init__([GCNConv(a, b) for a, b in dims], dropout)


# Checkpoint tensor name -> (attribute path in the layer, transpose?)
_NAMES = {
    "sage": {"w_self": ("lin_self.weight", True), "w_neigh": ("lin_neigh.weight", True), "bias": ("bias", False)},
    "gcn": {"weight": ("lin.weight", True), "bias": ("bias", False)},
}


def load_checkpoint(path: Union[str, "os.PathLike[str]"], device: Device = None) -> nn.Module:
    """Loads a checkpoint of ``fanout train --save-model`` (or :func:`fanout.train`'s
    ``save_model``) into a :class:`GraphSAGE` or :class:`GCN`, in eval mode.

    Tensor names and orientation: ``layers.{i}.{param}``, layer 0 the input layer; weights
    ``[in, out]`` (copied transposed into ``nn.Linear.weight``), biases ``[1, out]``. The
    module's ``fanout_config`` and ``fanout_metadata`` attributes hold the stored model
    configuration and run settings (``train.fanouts``, ``train.batch_size``, ``train.seed``).
    GAT, GIN and PinSAGE checkpoints are refused with ``NotImplementedError``.
    """
    from .run import read_checkpoint

    meta, cfg, tensors = read_checkpoint(path)
    kind = cfg["kind"]
    if kind not in _NAMES:
        raise NotImplementedError(
            f"{os.fspath(path)}: a {kind} checkpoint; fanout.torch rebuilds sage and gcn models only"
        )
    cls = GraphSAGE if kind == "sage" else GCN
    model = cls(cfg["in_dim"], cfg["hidden"], cfg["num_classes"], cfg["num_layers"], cfg["dropout"])
    state = {}
    for name, arr in tensors.items():
        _, i, param = name.split(".", 2)
        attr, transpose = _NAMES[kind][param]
        t = torch.from_numpy(arr)
        state[f"layers.{i}.{attr}"] = t.T.contiguous() if transpose else t.reshape(-1)
    model.load_state_dict(state, strict=True)
    model.fanout_config = cfg  # type: ignore[assignment]
    model.fanout_metadata = meta  # type: ignore[assignment]
    model.eval()
    if device is not None:
        model.to(device)
    return model

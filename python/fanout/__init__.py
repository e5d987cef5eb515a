"""fanout: fast sample-based GNN training, from Python.

fanout's Rust engine samples neighbourhoods and gathers features on its own threads; this
package hands the results to Python as numpy arrays without copying them, so a PyTorch model
can train on fanout's mini-batches the way it would on DGL's ``DataLoader`` or PyG's
``NeighborLoader``::

    import fanout
    ds = fanout.Dataset("data/cora")
    loader = fanout.NeighborLoader(ds, ds.train_idx, fanouts=[10, 25], batch_size=32)
    for batch in loader:
        batch.features          # [len(batch.input_nodes), feat_dim] float32
        batch.blocks            # one Block per layer, input layer first (DGL semantics)
        batch.labels            # the seeds' labels

``fanout.torch`` turns batches into torch tensors (PyG ``edge_index`` or DGL blocks) and loads
fanout checkpoints into plain PyTorch modules; ``fanout.train`` / ``fanout.evaluate`` run
fanout's own trainer, and ``fanout.report`` draws a run's metrics as a picture. Every error
from Rust is raised as a subclass of :class:`FanoutError` with the Rust message. See
docs/python.md in the repository.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional, Union

from . import _fanout
from ._fanout import (
    CUDA_BUILT,
    EVAL_EPOCH,
    Dataset,
    DatasetError,
    DeviceError,
    FanoutError,
    FanoutIOError,
    InvalidArgumentError,
    NotFoundError,
    __version__,
)
from .loader import Block, MiniBatch, NeighborLoader
from .run import evaluate, read_checkpoint, report, train

PathLike = Union[str, "os.PathLike[str]"]

__all__ = [
    "CUDA_BUILT",
    "EVAL_EPOCH",
    "Block",
    "Dataset",
    "DatasetError",
    "DeviceError",
    "FanoutError",
    "FanoutIOError",
    "InvalidArgumentError",
    "MiniBatch",
    "NeighborLoader",
    "NotFoundError",
    "__version__",
    "evaluate",
    "import_edgelist",
    "import_npy",
    "import_ogb",
    "read_checkpoint",
    "report",
    "train",
    "verify",
]


def _import(fmt: str, src: PathLike, dst: PathLike, **options: Any) -> Dict[str, Any]:
    defaults: Dict[str, Any] = dict(
        layout=None,
        symmetrize=False,
        drop_self_loops=False,
        dedup=False,
        num_nodes=None,
        f16=False,
        overwrite=False,
        random_features=None,
        classes=16,
        train_frac=0.1,
        valid_frac=0.05,
        test_frac=0.05,
        signal=0.5,
        seed=0,
        split_scheme=None,
    )
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        raise InvalidArgumentError(f"unknown import option(s): {', '.join(unknown)}")
    # As on the command line: the random labels' settings mean nothing without random features.
    random_only = sorted(
        k for k in ("classes", "train_frac", "valid_frac", "test_frac", "signal") if k in options
    )
    if random_only and options.get("random_features") is None:
        raise InvalidArgumentError(
            f"{', '.join(random_only)}: only with random_features=DIM (they set the random "
            "labels and split that come with random features)"
        )
    defaults.update(options)
    return _fanout.import_dataset(fmt, os.fspath(src), os.fspath(dst), defaults)


def import_npy(src: PathLike, dst: PathLike, **options: Any) -> Dict[str, Any]:
    """Imports a directory of NumPy arrays into a new fanout dataset at ``dst``.

    ``src`` holds ``edge_index.npy`` ``[2, E]`` and optionally ``node_feat.npy``,
    ``node_label.npy`` and ``{train,valid,test}_idx.npy`` (what
    ``fanout dataset import --format npy`` reads). Options are the command's flags:
    ``layout="csc"|"csr"``, ``symmetrize``, ``drop_self_loops``, ``dedup``, ``num_nodes``,
    ``f16`` (store features as float16), ``overwrite``, and for topology-only graphs
    ``random_features=DIM`` with ``classes``, ``train_frac``, ``valid_frac``, ``test_frac``,
    ``signal`` and ``seed``. Returns the import summary (sizes, arcs read and dropped,
    seconds). Nothing is left at ``dst`` when the import fails.
    """
    return _import("npy", src, dst, **options)


def import_edgelist(src: PathLike, dst: PathLike, **options: Any) -> Dict[str, Any]:
    """Imports a text edge list (``src dst`` per line, optionally gzip) into ``dst``.

    Same options as :func:`import_npy`.
    """
    return _import("edgelist", src, dst, **options)


def import_ogb(src: PathLike, dst: PathLike, **options: Any) -> Dict[str, Any]:
    """Imports an OGB node-property dataset in its raw download layout into ``dst``.

    Same options as :func:`import_npy`, plus ``split_scheme`` (the folder under ``split/``).
    """
    return _import("ogb", src, dst, **options)


def verify(path: PathLike) -> Dict[str, Any]:
    """Checks every entry of the dataset at ``path`` (checksums, offsets, ids, labels, splits,
    features). Returns the report; raises :class:`DatasetError` naming the file and the first
    damaged entry otherwise."""
    return _fanout.verify(os.fspath(path))


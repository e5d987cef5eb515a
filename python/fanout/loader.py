"""The neighbour loader: fanout's sampling and feature gathering on Rust threads, each
mini-batch handed to Python as numpy arrays that own the Rust buffers (no copy)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

import numpy as np

from . import _fanout
from ._fanout import Dataset, InvalidArgumentError

__all__ = ["Block", "MiniBatch", "NeighborLoader"]


@dataclass
class Block:
    """One layer's message-flow graph, in DGL's block semantics.

    Local ids: sources are ``0..num_src``, destinations ``0..num_dst``, and destination ``d``
    is source ``d`` too (destinations are a prefix of the sources). The edges are stored by
    destination (CSR): the sources of destination ``d`` are
    ``indices[indptr[d]:indptr[d + 1]]``.
    """

    num_src: int
    num_dst: int
    indptr: np.ndarray
    """``uint32 [num_dst + 1]`` offsets into ``indices``."""
    indices: np.ndarray
    """``uint32 [num_edges]`` local source id of every edge, grouped by destination."""
    weights: Optional[np.ndarray] = None
    """``float32 [num_edges]`` per-edge weights (weighted, random-walk and layer-wise samplers)."""

    @property
    def num_edges(self) -> int:
        return int(self.indices.shape[0])

    def src(self) -> np.ndarray:
        """Local source id of every edge (``int64``)."""
        return self.indices.astype(np.int64)

    def dst(self) -> np.ndarray:
        """Local destination id of every edge (``int64``), in the order of :meth:`src`."""
        return np.repeat(np.arange(self.num_dst, dtype=np.int64), np.diff(self.indptr))

    def edge_index(self) -> np.ndarray:
        """``int64 [2, num_edges]``: row 0 the sources, row 1 the destinations (PyG style)."""
        return np.stack([self.src(), self.dst()])


@dataclass
class MiniBatch:
    """A sampled mini-batch with its features.

    ``blocks[0]`` is the input layer (its sources are all of ``input_nodes``) and
    ``blocks[-1]`` produces the seeds; every array was built by Rust and handed over without
    copying.
    """

    epoch: int
    step: int
    num_seeds: int
    input_nodes: np.ndarray
    """``uint32 [num_input]`` global id of every local id: the seeds first, then each hop's
    new vertices. ``features`` row ``i`` belongs to ``input_nodes[i]``."""
    blocks: List[Block]
    features: np.ndarray
    """``float32 [num_input, feat_dim]`` the input nodes' features (gathered in Rust)."""
    labels: Optional[np.ndarray]
    """``int64 [num_seeds]`` the seeds' labels (-1: unlabelled), or ``None``."""
    extract: Dict[str, int] = field(default_factory=dict)
    """Where the feature bytes came from (``bytes_from_cache``, ``bytes_from_host``, ...)."""
    _addresses: Dict[str, int] = field(default_factory=dict, repr=False)
    """Address of each Rust buffer at the handover (for zero-copy checks)."""

    @property
    def seeds(self) -> np.ndarray:
        """The seeds' global ids (``input_nodes[:num_seeds]``; DGL's ``output_nodes``)."""
        return self.input_nodes[: self.num_seeds]

    output_nodes = seeds

    @property
    def num_layers(self) -> int:
        return len(self.blocks)

    @property
    def num_edges(self) -> int:
        """Sampled edges over all blocks."""
        return sum(b.num_edges for b in self.blocks)

    @classmethod
    def _from_dict(cls, d: Dict[str, Any]) -> "MiniBatch":
        return cls(
            epoch=d["epoch"],
            step=d["step"],
            num_seeds=d["num_seeds"],
            input_nodes=d["input_nodes"],
            blocks=[Block(**b) for b in d["blocks"]],
            features=d["features"],
            labels=d["labels"],
            extract=d["extract"],
            _addresses=d["_addresses"],
        )


SeedsLike = Union[str, Sequence[int], np.ndarray]


class _EpochIterator:
    """The batches of one epoch, in step order; sampling runs ahead on Rust threads."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._len = len(inner)

    def __iter__(self) -> "_EpochIterator":
        return self

    def __next__(self) -> MiniBatch:
        return MiniBatch._from_dict(next(self._inner))

    def __len__(self) -> int:
        return self._len

    def close(self) -> None:
        """Stops the epoch's background threads (after the batches they are on)."""
        self._inner.close()


class NeighborLoader:
    """Iterates mini-batches of sampled neighbourhoods with their features and labels.

    Args:
        dataset: a :class:`fanout.Dataset` or the path of a dataset directory.
        seeds: the vertices to iterate: ``"train"``, ``"valid"``, ``"test"`` or an array of
            vertex ids (any integer dtype; each id once).
        fanouts: neighbours drawn per vertex at each hop, in hop order from the seeds
            (``[10, 25]``: each seed draws 10 neighbours, each of those 25; DGL lists them
            reversed; -1: all). One block per fanout.
        batch_size: seeds per mini-batch (the last batch of an epoch may be smaller).
        shuffle: shuffle the seeds every epoch (by a stream keyed by ``(seed, epoch)``).
        sampler: ``"khop"`` (uniform), ``"weighted"``, ``"randomwalk"`` or ``"layerwise"``,
            or a dict of sampler settings (``{"kind": "khop", "replace": True}``; the keys of
            a run config's ``[sampler]`` table).
        cache: ``None`` or a feature cache in front of the store, as a run config's
            ``[cache]`` table: ``{"policy": "degree", "ratio": 0.1}`` (``random``,
            ``degree``, ``presc``; ``match_reorder``). Batches are identical either way.
        prefetch: batches prepared ahead of the consumer (each pipeline queue's depth).
        seed: the run's seed: batch ``(epoch, step)`` is a pure function of it.
        num_threads: threads of a pool of the loader's own (default: fanout's global pool,
            one thread per core).

    Iterating the loader starts the next epoch (0, 1, ...); :meth:`epoch` iterates a given
    one. Batches equal ``fanout sample-bench`` / ``fanout train``'s for the same dataset,
    sampler, fanouts, batch size, shuffle and seed. Sampling and gathering run on Rust
    threads with the GIL released, so no worker processes are needed; do not wrap the loader
    in a ``torch.utils.data.DataLoader`` with ``num_workers > 0`` (see docs/python.md).
    """

    def __init__(
        self,
        dataset: Union[Dataset, str, "os.PathLike[str]"],
        seeds: SeedsLike,
        fanouts: Sequence[int],
        batch_size: int,
        shuffle: bool = True,
        sampler: Union[str, Dict[str, Any]] = "khop",
        cache: Optional[Union[str, Dict[str, Any]]] = None,
        prefetch: int = 2,
        seed: int = 0,
        *,
        num_threads: Optional[int] = None,
    ) -> None:
        if not isinstance(dataset, Dataset):
            dataset = Dataset(os.fspath(dataset))
        self.dataset = dataset
        self.fanouts = [int(f) for f in fanouts]
        self.batch_size = int(batch_size)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.seeds = _seed_array(dataset, seeds)
        sampler_spec = {"kind": sampler} if isinstance(sampler, str) else dict(sampler)
        cache_spec = _cache_spec(cache)
        # Ranges checked here, so that a value the native call cannot take is an
        # InvalidArgumentError rather than an OverflowError from the conversion.
        if not 1 <= self.batch_size < 2**63:
            raise InvalidArgumentError(f"batch_size {self.batch_size}: expected 1 to 2**63 - 1")
        if int(prefetch) < 1:
            raise InvalidArgumentError("prefetch must be at least 1")
        if not 0 <= self.seed < 2**64:
            raise InvalidArgumentError(f"seed {self.seed}: expected 0 to 2**64 - 1")
        if num_threads is not None and not 1 <= int(num_threads) <= 4096:
            raise InvalidArgumentError(f"num_threads {num_threads}: expected 1 to 4096")
        prefetch = min(int(prefetch), 2**63)  # the native check names the real bound
        self._inner = _fanout._Loader(
            dataset,
            self.seeds,
            self.fanouts,
            self.batch_size,
            self.shuffle,
            sampler_spec,
            cache_spec,
            int(prefetch),
            self.seed,
            num_threads,
        )
        self._pid = os.getpid()
        self._next_epoch = 0
        self._running: Optional[_EpochIterator] = None

    def __len__(self) -> int:
        """Batches per epoch."""
        return len(self._inner)

    @property
    def cache(self) -> Optional[Dict[str, Any]]:
        """The feature cache as built (policy, rows, ratio, bytes), or ``None``."""
        return self._inner.cache

    def take_times(self) -> "tuple[float, float]":
        """``(sample_s, extract_s)``: busy seconds of the two Rust stages since the last call."""
        return self._inner.take_times()

    def __iter__(self) -> _EpochIterator:
        epoch = self._next_epoch
        self._next_epoch += 1
        return self.epoch(epoch)

    def epoch(self, epoch: int) -> _EpochIterator:
        """The batches of epoch ``epoch`` (``fanout.EVAL_EPOCH`` with ``shuffle=False``: the
        batches fanout's trainer evaluates on). Starting an epoch stops the previous one."""
        if os.getpid() != self._pid:
            raise RuntimeError(
                "fanout.NeighborLoader was created in another process: it samples on Rust "
                "threads, which a forked process does not have. Iterate it in the process that "
                "made it (torch DataLoader: num_workers=0; the loader prefetches on its own "
                "threads), or make a new loader in this process."
            )
        if not 0 <= epoch < 2**64:
            raise InvalidArgumentError(f"epoch {epoch} is not in [0, 2**64)")
        if self._running is not None:
            self._running.close()
        self._running = _EpochIterator(self._inner.epoch(epoch))
        return self._running

    def __getstate__(self) -> Any:
        raise TypeError(
            "fanout.NeighborLoader cannot be pickled (it owns Rust threads and a memory map); "
            "make the loader in the process that iterates it"
        )

    def __repr__(self) -> str:
        return (
            f"fanout.NeighborLoader({len(self.seeds)} seeds, fanouts {self.fanouts}, "
            f"batch_size {self.batch_size}, {len(self)} batches per epoch)"
        )


def _seed_array(ds: Dataset, seeds: SeedsLike) -> np.ndarray:
    if isinstance(seeds, str):
        splits = {"train": ds.train_idx, "valid": ds.valid_idx, "test": ds.test_idx}
        if seeds not in splits:
            raise InvalidArgumentError(
                f"seeds: expected \"train\", \"valid\", \"test\" or vertex ids, found {seeds!r}"
            )
        return np.ascontiguousarray(splits[seeds], dtype=np.uint32)
    arr = np.asarray(seeds)
    if arr.ndim != 1:
        raise InvalidArgumentError(f"seeds: expected a 1-d array of vertex ids, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise InvalidArgumentError(f"seeds: expected integer vertex ids, got dtype {arr.dtype}")
    if arr.size and (arr.min() < 0 or arr.max() >= ds.num_nodes):
        bad = arr.min() if arr.min() < 0 else arr.max()
        raise InvalidArgumentError(
            f"seed vertex {bad} is out of range; the graph has {ds.num_nodes} vertices"
        )
    return np.ascontiguousarray(arr, dtype=np.uint32)


def _cache_spec(cache: Optional[Union[str, Dict[str, Any]]]) -> Optional[Dict[str, Any]]:
    if cache is None:
        return None
    spec = {"policy": cache} if isinstance(cache, str) else dict(cache)
    if "ratio" in spec and not isinstance(spec["ratio"], str):
        spec["ratio"] = repr(float(spec["ratio"]))
    return spec

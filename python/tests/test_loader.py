"""fanout.NeighborLoader: DGL block semantics, determinism, batches equal to the CLI
sampler's, the zero-copy handover of Rust buffers, the GIL released while sampling, and the
behaviour in forked processes."""

from __future__ import annotations

import json
import os
import threading
import time

import numpy as np
import pytest

import fanout
from conftest import run_cli


def _arcs(ds):
    """Set of (src, dst) global arcs of a CSC dataset."""
    indptr = ds.indptr.astype(np.int64)
    dst = np.repeat(np.arange(ds.num_nodes), np.diff(indptr))
    return set(zip(ds.indices.tolist(), dst.tolist()))


def _check_batch(b, ds, arcs, fanouts):
    assert b.features.shape == (len(b.input_nodes), ds.feat_dim)
    assert b.features.dtype == np.float32 and b.input_nodes.dtype == np.uint32
    assert len(np.unique(b.input_nodes)) == len(b.input_nodes)
    assert np.array_equal(b.features, ds.features[b.input_nodes])
    assert np.array_equal(b.labels, ds.labels[b.seeds])
    assert b.num_layers == len(fanouts)
    assert b.blocks[0].num_src == len(b.input_nodes)
    assert b.blocks[-1].num_dst == b.num_seeds
    for i, blk in enumerate(b.blocks):
        # DGL semantics: destinations are a prefix of the sources; layer i's destinations are
        # layer i+1's sources.
        assert blk.num_dst <= blk.num_src
        if i + 1 < len(b.blocks):
            assert b.blocks[i + 1].num_src == blk.num_dst
        assert blk.indptr.shape == (blk.num_dst + 1,) and blk.indptr[0] == 0
        assert blk.indptr[-1] == blk.num_edges
        src, dst = blk.src(), blk.dst()
        assert src.max(initial=0) < blk.num_src
        # Every sampled edge is an arc of the graph into its destination; fanout bounds it.
        g = b.input_nodes.astype(np.int64)
        assert set(zip(g[src].tolist(), g[dst].tolist())) <= arcs
        hop = len(b.blocks) - 1 - i
        assert np.diff(blk.indptr).max(initial=0) <= fanouts[hop]


def test_batches_are_valid_blocks_with_features_and_labels(cora):
    loader = fanout.NeighborLoader(cora, "train", [10, 25], batch_size=32)
    assert len(loader) == 5
    arcs = _arcs(cora)
    seen = []
    for b in loader:
        _check_batch(b, cora, arcs, [10, 25])
        seen.append(b.seeds.copy())
    assert sorted(np.concatenate(seen).tolist()) == sorted(cora.train_idx.tolist())
    # Each epoch is a new shuffle; the same epoch is the same batches.
    e0 = [b.seeds.copy() for b in loader.epoch(0)]
    e1 = [b.seeds.copy() for b in loader.epoch(1)]
    assert all(np.array_equal(a, c) for a, c in zip(e0, seen))
    assert not all(np.array_equal(a, c) for a, c in zip(e0, e1))


def test_deterministic_per_seed_whatever_the_threads_and_prefetch(cora):
    def epoch(**kw):
        loader = fanout.NeighborLoader(cora, cora.train_idx, [5, 5, 5], 16, **kw)
        return [(b.input_nodes.copy(), [(x.indptr.copy(), x.indices.copy()) for x in b.blocks])
                for b in loader.epoch(3)]

    a = epoch(seed=7)
    b = epoch(seed=7, num_threads=1, prefetch=5)
    c = epoch(seed=8)
    assert len(a) == len(b)
    for (na, ba), (nb, bb) in zip(a, b):
        assert np.array_equal(na, nb)
        assert all(np.array_equal(x, y) for p, q in zip(ba, bb) for x, y in zip(p, q))
    assert any(not np.array_equal(x[0], y[0]) for x, y in zip(a, c))


def test_unshuffled_order_and_all_neighbours(cora):
    seeds = np.arange(100, 150)
    loader = fanout.NeighborLoader(cora, seeds, [-1], 20, shuffle=False)
    batches = list(loader)
    assert [len(b.seeds) for b in batches] == [20, 20, 10]
    assert np.array_equal(np.concatenate([b.seeds for b in batches]), seeds)
    deg = np.diff(cora.indptr.astype(np.int64))
    for b in batches:
        assert np.array_equal(np.diff(b.blocks[0].indptr), deg[b.seeds])


@pytest.mark.parametrize(
    "sampler,fanouts,batch,seed",
    [("khop", [10, 25], 32, 0), ("khop", [15, 10, 5], 64, 3), ("layerwise", [64, 128], 32, 1),
     ("randomwalk", [5, 5], 32, 2)],
)
def test_batches_equal_the_cli_samplers(cora, cora_path, fanout_cli, sampler, fanouts, batch, seed):
    """`fanout sample-bench` samples epoch 0 with the same Loader and sampler: its totals of
    sampled edges and input nodes must equal the Python loader's batch for batch."""
    r = run_cli(
        fanout_cli, "sample-bench", "--dataset", str(cora_path), "--sampler", sampler,
        "--fanouts", ",".join(map(str, fanouts)), "--batch-size", str(batch),
        "--seed", str(seed), "--warmup", "0", "--epochs", "1", "--json",
    )
    assert r.returncode == 0, r.stderr
    cli = json.loads(r.stdout)
    loader = fanout.NeighborLoader(cora, "train", fanouts, batch, sampler=sampler, seed=seed)
    batches = list(loader)
    assert cli["batches"] == len(batches)
    assert cli["sampled_edges"] == sum(b.num_edges for b in batches)
    inputs = sum(len(b.input_nodes) for b in batches)
    assert cli["mean_input_nodes"] == pytest.approx(inputs / len(batches), abs=1e-9)
    # The totals are sensitive to the seed (so equality above is not a coincidence).
    other = fanout.NeighborLoader(cora, "train", fanouts, batch, sampler=sampler, seed=seed + 100)
    assert (sum(b.num_edges for b in other), sum(len(b.input_nodes) for b in other)) != (
        cli["sampled_edges"], inputs)


def test_each_batch_equals_the_cli_samplers_batch(cora, cora_path, fanout_cli):
    """Batch by batch: `sample-bench --warmup k --batches 1` samples exactly batch k of epoch 0
    (the first k are untimed), so its figures are batch k's."""
    loader = fanout.NeighborLoader(cora, "train", [10, 25], 32, seed=5)
    for k, b in enumerate(loader):
        r = run_cli(
            fanout_cli, "sample-bench", "--dataset", str(cora_path), "--fanouts", "10,25",
            "--batch-size", "32", "--seed", "5", "--warmup", str(k), "--batches", "1", "--json",
        )
        assert r.returncode == 0, r.stderr
        cli = json.loads(r.stdout)
        assert (cli["sampled_edges"], cli["mean_input_nodes"]) == (b.num_edges, len(b.input_nodes)), k


def test_arrays_take_over_the_rust_buffers_without_copy(cora):
    loader = fanout.NeighborLoader(cora, "train", [10, 25], 32)
    b = next(iter(loader))
    addr = b._addresses
    assert b.features.ctypes.data == addr["features"]
    assert b.input_nodes.ctypes.data == addr["input_nodes"]
    assert b.labels.ctypes.data == addr["labels"]
    for i, blk in enumerate(b.blocks):
        assert blk.indptr.ctypes.data == addr[f"blocks.{i}.indptr"]
        assert blk.indices.ctypes.data == addr[f"blocks.{i}.indices"]
    for arr in (b.features, b.input_nodes, b.labels, b.blocks[0].indices):
        # Owned by a Rust container object (numpy's base), not by numpy.
        assert not arr.flags.owndata and arr.base is not None
        assert arr.flags.writeable and arr.flags.c_contiguous


def test_feature_buffers_are_recycled_only_once_python_lets_go(cora):
    """A dropped batch's feature memory is gathered into again; a batch still held keeps its
    features intact however many batches come after it (against a fresh loader's copies)."""
    torch = pytest.importorskip("torch")
    loader = fanout.NeighborLoader(cora, "train", [10, 10], 16, prefetch=1, seed=3)
    fresh = fanout.NeighborLoader(cora, "train", [10, 10], 16, prefetch=1, seed=3)
    reference = [b.features.copy() for b in fresh]
    assert len(reference) >= 5
    held = None
    seen, reused = set(), 0
    for k, b in enumerate(loader):
        assert np.array_equal(b.features, reference[k]), k
        if k == 0:
            held = (b.features, torch.from_numpy(b.features))
            continue
        reused += b._addresses["features"] in seen
        seen.add(b._addresses["features"])
        del b  # the only reference: its buffer goes back to the pool
    assert reused > 0, "no batch was gathered into a recycled buffer"
    assert held[0].ctypes.data not in seen, "a held batch's memory was handed out again"
    assert np.array_equal(held[0], reference[0]) and np.array_equal(held[1].numpy(), reference[0])


def test_cache_gives_the_same_batches(cora):
    plain = fanout.NeighborLoader(cora, "train", [10, 10], 32, seed=4)
    cached = fanout.NeighborLoader(cora, "train", [10, 10], 32, seed=4,
                                   cache={"policy": "degree", "ratio": 0.2})
    assert cached.cache["policy"] == "degree" and cached.cache["rows"] == int(0.2 * 2708)
    hits = 0
    for a, b in zip(plain, cached):
        assert np.array_equal(a.input_nodes, b.input_nodes)
        assert np.array_equal(a.features, b.features)
        hits += b.extract["bytes_from_cache"]
    assert hits > 0


def test_split_arrays_stay_readable_while_a_loader_is_built_from_them(cora):
    """Building a loader over a split (its seeds: the split's own memory) runs without the GIL;
    another thread taking the same split meanwhile gets its array, not a PanicException from
    numpy's borrow checking."""
    import threading

    errors = []

    def build():
        try:
            fanout.NeighborLoader(cora, "train", [10, 25], 32, cache={"policy": "presc", "ratio": 0.5})
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    t = threading.Thread(target=build)
    t.start()
    taken = 0
    while t.is_alive() or taken == 0:
        assert len(cora.train_idx) == 140
        taken += 1
    t.join()
    assert not errors, errors
    assert taken > 1


def test_sampling_releases_the_gil(cora):
    """A Python thread keeps running while the main thread waits for batches."""
    ticks = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            ticks[0] += 1

    t = threading.Thread(target=spin)
    t.start()
    try:
        loader = fanout.NeighborLoader(cora, np.arange(cora.num_nodes), [-1, -1], 64,
                                       num_threads=1)
        start = ticks[0]
        t0 = time.perf_counter()
        n = sum(1 for _ in loader)
        elapsed = time.perf_counter() - t0
    finally:
        stop.set()
        t.join()
    assert n == len(loader)
    assert ticks[0] > start or elapsed < 0.01


def test_starting_an_epoch_stops_the_previous_one(cora):
    loader = fanout.NeighborLoader(cora, "test", [10, 10], 10)
    it = iter(loader)
    next(it)
    again = list(loader)  # epoch 1 while epoch 0 is unfinished: epoch 0 is closed
    assert len(again) == len(loader)
    with pytest.raises(StopIteration):
        next(it)


def test_under_a_forking_torch_dataloader(cora):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, IterableDataset

    loader = fanout.NeighborLoader(cora, "train", [10, 10], 32)

    class Batches(IterableDataset):
        def __iter__(self):
            return iter(loader)

    # In-process (num_workers=0): the loader's own threads prefetch.
    n = sum(1 for _ in DataLoader(Batches(), batch_size=None, num_workers=0,
                                  collate_fn=lambda b: b))
    assert n == len(loader)
    # A forked worker process has none of the loader's threads: a clear error, not a hang.
    ctx = torch.multiprocessing.get_context("fork")
    dl = DataLoader(Batches(), batch_size=None, num_workers=1, multiprocessing_context=ctx,
                    collate_fn=lambda b: b)
    with pytest.raises(RuntimeError, match="created in another process"):
        next(iter(dl))
    # A spawned worker would need to pickle it: refused with a message.
    import pickle
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(loader)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_process_forked_after_use_gets_an_error_not_a_hang(cora, cora_path):
    loader = fanout.NeighborLoader(cora, "train", [5, 5], 32)
    it = iter(loader)
    next(it)  # fanout's threads are running in this process
    features = cora.features
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what happened through the pipe, never return to pytest
        try:
            out = [str(float(features[5].sum()))]  # views stay readable
            for call in (lambda: fanout.Dataset(cora_path), lambda: next(it),
                         lambda: list(loader.epoch(0))):
                try:
                    call()
                    out.append("ran")
                except Exception as e:  # noqa: BLE001
                    out.append(f"{type(e).__name__}: {e}")
            os.write(w, "\n".join(out).encode())
        finally:
            os._exit(0)
    os.close(w)
    deadline = time.time() + 60
    while time.time() < deadline:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        pytest.fail("the forked child hung")
    with os.fdopen(r) as f:
        lines = f.read().splitlines()
    assert float(lines[0]) == pytest.approx(float(features[5].sum()))
    assert lines[1].startswith("FanoutError: fanout's threads were started in process")
    assert lines[2].startswith("FanoutError: fanout's threads were started in process")
    assert lines[3].startswith("RuntimeError: fanout.NeighborLoader was created in another process")

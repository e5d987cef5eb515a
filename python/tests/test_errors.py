"""Errors from Rust arrive as Python exceptions with Rust's messages: bad paths, damaged
datasets, bad arguments. None crashes the interpreter."""

from __future__ import annotations

import os

import numpy as np
import pytest

import fanout
from conftest import run_cli


def test_exception_hierarchy():
    assert issubclass(fanout.DatasetError, fanout.FanoutError)
    assert issubclass(fanout.InvalidArgumentError, fanout.FanoutError)
    assert issubclass(fanout.InvalidArgumentError, ValueError)
    assert issubclass(fanout.NotFoundError, FileNotFoundError)
    assert issubclass(fanout.NotFoundError, fanout.FanoutError)
    assert issubclass(fanout.FanoutIOError, OSError)
    assert issubclass(fanout.DeviceError, RuntimeError)
    assert issubclass(fanout.DeviceError, fanout.FanoutError)
    assert fanout.FanoutError.__module__ == "fanout"


def test_missing_dataset_is_not_found_with_the_cli_message(tmp_path, fanout_cli):
    missing = tmp_path / "nowhere"
    with pytest.raises(fanout.NotFoundError) as e:
        fanout.Dataset(missing)
    assert "not a dataset directory" in str(e.value)
    r = run_cli(fanout_cli, "dataset", "info", str(missing))
    assert r.returncode != 0
    assert str(e.value) in r.stderr


def test_truncated_file_is_a_dataset_error_naming_it(damaged_copy, fanout_cli):
    d = damaged_copy()
    feat = d / "feat.bin"
    feat.write_bytes(feat.read_bytes()[:-8])
    with pytest.raises(fanout.DatasetError) as e:
        fanout.Dataset(d)
    msg = str(e.value)
    assert "feat.bin" in msg and "truncated" in msg
    r = run_cli(fanout_cli, "dataset", "info", str(d))
    assert msg in r.stderr


def test_damaged_offsets_are_caught_on_open(damaged_copy):
    d = damaged_copy()
    p = np.fromfile(d / "indptr.bin", dtype=np.uint32)
    p[10] = p[11] + 5  # decreases after entry 10
    p.tofile(d / "indptr.bin")
    with pytest.raises(fanout.DatasetError, match=r"indptr.bin: entry 11: .*must not decrease"):
        fanout.Dataset(d)


def test_damaged_entry_fails_verify(damaged_copy):
    d = damaged_copy()
    idx = np.fromfile(d / "indices.bin", dtype=np.uint32)
    idx[3] = 10_000_000
    idx.tofile(d / "indices.bin")
    with pytest.raises(fanout.DatasetError, match="indices.bin"):
        fanout.verify(d)


def test_ids_out_of_range_are_caught_on_open(damaged_copy):
    """Neighbour ids are checked when the dataset is opened (once per content of indices.bin),
    so a damaged one never reaches a sampler."""
    d = damaged_copy()
    idx = np.fromfile(d / "indices.bin", dtype=np.uint32)
    idx[7] = 4_000_000
    idx.tofile(d / "indices.bin")
    with pytest.raises(
        fanout.DatasetError,
        match=r"indices.bin: entry 7 = 4000000 \(in the row of vertex \d+\) is out of range; "
        r"expected a vertex id < NUM_NODE = ",
    ):
        fanout.Dataset(d)


def test_missing_meta_field(damaged_copy):
    d = damaged_copy()
    meta = (d / "meta.txt").read_text().splitlines()
    (d / "meta.txt").write_text("\n".join(l for l in meta if not l.startswith("NUM_NODE")) + "\n")
    with pytest.raises(fanout.DatasetError, match="meta.txt"):
        fanout.Dataset(d)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(fanouts=[0, 5]), "fanouts: fanout 0 in"),
        (dict(fanouts=[]), "fanouts: "),
        (dict(batch_size=0), "batch_size 0: expected 1 to 2[*][*]63 - 1"),
        (dict(sampler="bfs"), "sampler: unknown variant `bfs`"),
        (dict(sampler={"kind": "khop", "walk": 3}), "sampler: unknown field `walk`"),
        (dict(cache={"policy": "hottest"}), "cache policy"),
        (dict(cache={"policy": "degree", "ratio": "auto"}), "trains nothing"),
        (dict(seeds=[1, 2, 99999]), "seed vertex 99999 is out of range; the graph has 2708 vertices"),
        (dict(seeds=[-1]), "seed vertex -1 is out of range"),
        (dict(seeds=np.array([0.5])), "integer vertex ids"),
        (dict(seeds="training"), "seeds: expected"),
        (dict(num_threads=0), "num_threads 0: expected 1 to 4096"),
        (dict(sampler="weighted"), "weight.bin"),
        # Values the native call cannot take are refused by name, never an OverflowError,
        # and a queue that large is refused before anything is allocated (it used to abort).
        (dict(num_threads=-1), "num_threads -1: expected 1 to 4096"),
        (dict(seed=2**64), "seed 18446744073709551616: expected 0 to 2[*][*]64 - 1"),
        (dict(batch_size=2**64), "batch_size .*: expected 1 to 2[*][*]63 - 1"),
        (dict(prefetch=2**40), "prefetch 1099511627776: expected 1 to 1024 batches"),
        (dict(prefetch=2**70), "prefetch 9223372036854775808: expected 1 to 1024 batches"),
        (dict(cache={"match_reorder": True, "reorder_window": 2**40}), "reorder_window 1099511627776: at most 1024"),
        (dict(cache={"policy": "degree", "ratio": "0.1", "device_memory": "1GiB"}), "device_memory"),
    ],
)
def test_bad_loader_arguments(cora, kwargs, match):
    args = dict(seeds="train", fanouts=[5, 5], batch_size=8)
    args.update(kwargs)
    with pytest.raises(fanout.FanoutError, match=match) as e:
        fanout.NeighborLoader(cora, **args)
    assert isinstance(e.value, (ValueError, FileNotFoundError))


def test_errors_while_sampling_arrive_at_next(cora):
    loader = fanout.NeighborLoader(cora, [3, 4, 3], [5], 8)  # a seed twice
    with pytest.raises(fanout.FanoutError, match="seed"):
        next(iter(loader))


def test_run_api_errors(tmp_path, cora_path):
    with pytest.raises(fanout.InvalidArgumentError, match="unknown field `epoch`"):
        fanout.train({"dataset": cora_path, "epoch": 3})
    with pytest.raises(fanout.InvalidArgumentError, match="--epochs must be at least 1"):
        fanout.train({"dataset": cora_path, "epochs": 0})
    # A bad setting stays a bad setting when the dataset is missing too.
    with pytest.raises(fanout.InvalidArgumentError, match="--epochs must be at least 1"):
        fanout.train({"dataset": tmp_path / "none", "epochs": 0})
    with pytest.raises(fanout.InvalidArgumentError, match="--prefetch 1099511627776: at most 1024"):
        fanout.train({"dataset": cora_path, "epochs": 1, "prefetch": 2**40})
    with pytest.raises(fanout.InvalidArgumentError, match="save_model given twice"):
        fanout.train({"dataset": cora_path, "save_model": tmp_path / "a"}, save_model=tmp_path / "b")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    # Outputs that could not be written are refused before the run, not after it.
    with pytest.raises(fanout.InvalidArgumentError, match="metrics_out .*: the folder .* does not exist"):
        fanout.train({"dataset": cora_path, "epochs": 1}, metrics_out=tmp_path / "no" / "m.json")
    with pytest.raises(fanout.NotFoundError, match="not a dataset directory"):
        fanout.train({"dataset": tmp_path / "none", "epochs": 1})
    # A path that JSON cannot hold is refused by name, as str (surrogate escapes) or bytes;
    # a UTF-8 bytes path is taken.
    for bad in (os.fsdecode(b"d\xff"), os.fsencode(tmp_path) + b"/d\xff"):
        with pytest.raises(fanout.InvalidArgumentError, match="dataset .*not valid UTF-8"):
            fanout.train({"dataset": bad, "epochs": 1})
    with pytest.raises(fanout.NotFoundError, match="not a dataset directory"):
        fanout.train({"dataset": os.fsencode(tmp_path / "none"), "epochs": 1})
    with pytest.raises(fanout.NotFoundError):
        fanout.train(tmp_path / "run.toml")
    with pytest.raises(fanout.NotFoundError):
        fanout.evaluate(tmp_path / "model.safetensors", cora_path)
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not a checkpoint")
    # A file that is not a checkpoint is the same error whichever call reads it.
    with pytest.raises(fanout.InvalidArgumentError, match="junk.safetensors: .*not a safetensors file"):
        fanout.read_checkpoint(junk)
    with pytest.raises(fanout.InvalidArgumentError, match="not a safetensors file"):
        fanout.evaluate(junk, cora_path)
    with pytest.raises(fanout.InvalidArgumentError, match="split"):
        fanout.evaluate(junk, cora_path, split="dev")


def test_device_errors(cora_path, tmp_path):
    run = {"dataset": cora_path, "epochs": 1, "threads": 2, "metrics_out": tmp_path / "m.json"}
    with pytest.raises(fanout.InvalidArgumentError, match='device: "tpu" is not a device'):
        fanout.train(run, device="tpu")
    if fanout.CUDA_BUILT:
        pytest.skip("a CUDA build: its errors depend on the machine's driver and GPUs")
    # A package built without CUDA says so, and how to get it, before anything runs: no
    # metrics file, and never a quiet fall-back to the CPU.
    with pytest.raises(fanout.DeviceError, match="without CUDA support.*--features cuda"):
        fanout.train(run, device="cuda:1")
    assert not (tmp_path / "m.json").exists()
    with pytest.raises(fanout.DeviceError, match="device cuda:0: .*without CUDA support"):
        fanout.evaluate(tmp_path / "model.safetensors", cora_path, device="cuda")


def test_import_errors(sources, tmp_path, cora_path):
    with pytest.raises(fanout.NotFoundError, match="no such file or directory"):
        fanout.import_npy(tmp_path / "none", tmp_path / "out")
    with pytest.raises(fanout.FanoutError, match="exists"):
        fanout.import_npy(sources / "cora", cora_path)
    with pytest.raises(fanout.InvalidArgumentError, match="unknown import option"):
        fanout.import_npy(sources / "cora", tmp_path / "x", symmetrise=True)
    with pytest.raises(fanout.InvalidArgumentError, match="layout"):
        fanout.import_npy(sources / "cora", tmp_path / "x", layout="coo")
    # The random labels' settings without random features would be ignored: refused, as the
    # command line refuses them.
    with pytest.raises(fanout.InvalidArgumentError, match="classes, train_frac: only with random_features"):
        fanout.import_npy(sources / "cora", tmp_path / "x", classes=3, train_frac=0.9)
    assert not (tmp_path / "x").exists()

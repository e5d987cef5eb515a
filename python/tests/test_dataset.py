"""fanout.Dataset and the importers: sizes, splits, labels, and features as read-only views of
the memory map (no copy)."""

from __future__ import annotations

import gc
import json
import sys

import numpy as np
import pytest

import fanout
from conftest import run_cli


def test_sizes_splits_labels_match_the_sources(cora, sources):
    src = sources / "cora"
    feat = np.load(src / "node_feat.npy")
    assert cora.num_nodes == len(cora) == feat.shape[0] == 2708
    assert cora.num_edges == np.load(src / "edge_index.npy").shape[1] == 10556
    assert cora.feat_dim == feat.shape[1] == 1433
    assert cora.num_classes == 7
    assert (cora.feat_dtype, cora.layout) == ("float32", "csc")
    assert np.array_equal(cora.features, feat.astype(np.float32))
    assert np.array_equal(cora.labels, np.load(src / "node_label.npy").reshape(-1))
    for name in ("train", "valid", "test"):
        got = getattr(cora, f"{name}_idx")
        assert got.dtype == np.uint32
        assert np.array_equal(got, np.load(src / f"{name}_idx.npy"))
    assert (len(cora.train_idx), len(cora.valid_idx), len(cora.test_idx)) == (140, 500, 1000)
    assert "2708 nodes" in repr(cora)


def test_topology_is_csc_over_the_edge_index(cora, sources):
    ei = np.load(sources / "cora" / "edge_index.npy")
    indptr, indices = cora.indptr, cora.indices
    assert indptr.shape == (cora.num_nodes + 1,) and indices.shape == (cora.num_edges,)
    # Row v lists the sources of the arcs into v.
    dst = np.repeat(np.arange(cora.num_nodes), np.diff(indptr.astype(np.int64)))
    got = sorted(zip(indices.tolist(), dst.tolist()))
    assert got == sorted(zip(ei[0].tolist(), ei[1].tolist()))
    assert np.array_equal(cora.in_degrees(), np.diff(indptr.astype(np.int64)))
    info = cora.info()
    assert info["num_nodes"] == 2708


def _mapping_of(path) -> "list[tuple[int, int]]":
    """Address ranges of the process's mappings of `path` (/proc/self/maps)."""
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 6 and parts[5] == str(path):
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                out.append((lo, hi))
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_features_are_a_view_of_the_memory_map(cora, cora_path):
    f = cora.features
    start = f.__array_interface__["data"][0]
    end = start + f.nbytes
    maps = _mapping_of(cora_path / "feat.bin")
    assert maps, "feat.bin is not mapped"
    assert any(lo <= start and end <= hi for lo, hi in maps), (hex(start), maps)
    # Every access returns the same memory, never a copy; the dataset object is the base.
    assert np.shares_memory(f, cora.features)
    assert f.base is cora
    assert not f.flags.owndata
    # Labels and splits are views too.
    for arr, name in ((cora.labels, "label.bin"), (cora.train_idx, "train_set.bin")):
        a = arr.__array_interface__["data"][0]
        assert any(lo <= a < hi for lo, hi in _mapping_of(cora_path / name)), name
        assert arr.base is cora


def test_views_are_read_only_and_keep_the_dataset_alive(cora_path):
    ds = fanout.Dataset(cora_path)
    f = ds.features
    expected = float(np.asarray(f[:10], dtype=np.float64).sum())
    with pytest.raises(ValueError, match="read-only"):
        f[0, 0] = 1.0
    with pytest.raises(ValueError):
        f.setflags(write=True)
    del ds
    gc.collect()
    # The array's base holds the dataset, whose map is still valid.
    assert float(np.asarray(f[:10], dtype=np.float64).sum()) == expected


def test_f16_features_are_float16_views(sources, tmp_path):
    out = tmp_path / "cora16"
    s = fanout.import_npy(sources / "cora", out, f16=True)
    assert s["feat_dim"] == 1433
    ds = fanout.Dataset(out)
    assert ds.feat_dtype == "float16" and ds.features.dtype == np.float16
    ref = np.load(sources / "cora" / "node_feat.npy").astype(np.float16)
    assert np.array_equal(ds.features, ref)


def test_import_options_and_summary(sources, tmp_path):
    out = tmp_path / "sym"
    s = fanout.import_npy(sources / "cora", out, symmetrize=True, dedup=True)
    assert s["num_nodes"] == 2708 and s["format"] == "npy"
    assert s["build"]["input_arcs"] == 10556
    assert s["num_arcs"] == fanout.Dataset(out).num_edges
    report = fanout.verify(out)
    assert "indices.bin" in " ".join(report["checksums_verified"])
    # Topology only, with random learnable features.
    out2 = tmp_path / "rand"
    ei = tmp_path / "topo"
    ei.mkdir()
    np.save(ei / "edge_index.npy", np.load(sources / "cora" / "edge_index.npy"))
    s2 = fanout.import_npy(ei, out2, random_features=8, classes=3, train_frac=0.2)
    ds2 = fanout.Dataset(out2)
    assert (ds2.feat_dim, ds2.num_classes, s2["random_features"]) == (8, 3, True)
    assert len(ds2.train_idx) == s2["train"] > 0


def test_edgelist_import(tmp_path):
    src = tmp_path / "e.txt"
    src.write_text("# a triangle\n0 1\n1 2\n2 0\n")
    s = fanout.import_edgelist(src, tmp_path / "tri", symmetrize=True)
    assert (s["num_nodes"], s["num_arcs"]) == (3, 6)
    ds = fanout.Dataset(tmp_path / "tri")
    assert ds.features is None and ds.labels is None and len(ds.train_idx) == 0


def test_info_is_what_the_command_line_prints(fanout_cli, tmp_path):
    """`Dataset.info()` is `fanout dataset info --json`, stored partitions included."""
    ds = tmp_path / "tiny"
    assert run_cli(fanout_cli, "dataset", "gen", "--preset", "tiny", str(ds)).returncode == 0
    done = run_cli(fanout_cli, "dataset", "partition", "--method", "pagraph", "--parts", "2", str(ds))
    assert done.returncode == 0, done.stderr
    out = run_cli(fanout_cli, "dataset", "info", "--json", str(ds))
    assert out.returncode == 0, out.stderr
    cli = json.loads(out.stdout)
    mine = fanout.Dataset(ds).info()
    # How the open checked the ids depends on whether an earlier open left its stamp.
    cli.pop("id_check")
    mine.pop("id_check")
    assert mine == cli
    assert [p["name"] for p in mine["partitions"]] == ["pagraph-2"]
    assert sum(mine["partitions"][0]["stats"]["train"]) == mine["train"]


"""fanout.torch and the run API: tensors for PyG and DGL, a torch training loop over the
loader, fanout.train / fanout.evaluate, and checkpoints loaded into PyTorch modules that
reproduce fanout's evaluation."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fanout  # noqa: E402
import fanout.torch as ft  # noqa: E402


def test_block_tensors_for_pyg_and_dgl(cora):
    b = next(iter(fanout.NeighborLoader(cora, "train", [4, 6], 16)))
    tb = ft.to_torch(b)
    assert tb.x.data_ptr() == b._addresses["features"]  # torch shares the Rust buffer
    assert tb.x.shape == (len(b.input_nodes), cora.feat_dim)
    assert tb.y.dtype == torch.int64 and len(tb.y) == tb.num_seeds == b.num_seeds
    for blk, t in zip(b.blocks, tb.blocks):
        src, dst, num_src, num_dst = t
        assert (num_src, num_dst) == (blk.num_src, blk.num_dst)
        assert src.dtype == dst.dtype == torch.int64
        ei = ft.edge_index(blk)
        assert ei.shape == (2, blk.num_edges)
        assert torch.equal(ei[0], src) and torch.equal(ei[1], dst)
        assert np.array_equal(ei.numpy(), blk.edge_index())
        # CSR order: destinations ascending; row d's sources as the block lists them.
        assert torch.all(dst[1:] >= dst[:-1])
        d = num_dst - 1
        lo, hi = blk.indptr[d], blk.indptr[d + 1]
        assert np.array_equal(src[dst == d].numpy(), blk.indices[lo:hi])


def test_sage_conv_is_the_mean_over_block_edges():
    blk = ft.TorchBlock(torch.tensor([1, 2, 3, 0]), torch.tensor([0, 0, 0, 1]), 4, 3)
    conv = ft.SAGEConv(2, 2)
    with torch.no_grad():
        conv.lin_self.weight.copy_(torch.eye(2))
        conv.lin_neigh.weight.copy_(2 * torch.eye(2))
        conv.bias.fill_(1.0)
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0], [3.0, 0.0]])
    out = conv(x, blk)
    # d0: self (1,0) + 2 * mean((0,1),(2,2),(3,0)) + 1; d1: (0,1) + 2 * (1,0) + 1; d2: no edges
    expect = torch.tensor([[1 + 2 * 5 / 3 + 1, 0 + 2 + 1], [0 + 2 + 1, 1 + 0 + 1], [3.0, 3.0]])
    assert torch.allclose(out, expect)


def test_gcn_conv_normalises_by_block_degrees():
    blk = ft.TorchBlock(torch.tensor([1, 2, 1]), torch.tensor([0, 0, 1]), 3, 2)
    conv = ft.GCNConv(1, 1)
    with torch.no_grad():
        conv.lin.weight.fill_(1.0)
    x = torch.tensor([[1.0], [4.0], [9.0]])
    out = conv(x, blk)
    # out_deg: s1 = 2, s2 = 1; in_deg: d0 = 2, d1 = 1
    expect = torch.tensor([[4 / 2 ** 0.5 / 2 ** 0.5 + 9 / 1 / 2 ** 0.5], [4 / 2 ** 0.5]])
    assert torch.allclose(out, expect)


def test_torch_training_loop_over_the_loader(cora):
    torch.manual_seed(0)
    model = ft.GraphSAGE(cora.feat_dim, 64, cora.num_classes, num_layers=2, dropout=0.5)
    opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    train = fanout.NeighborLoader(cora, "train", [10, 25], 32, seed=0)
    losses = []
    for _ in range(10):
        model.train()
        for batch in train:
            tb = ft.to_torch(batch)
            loss = torch.nn.functional.cross_entropy(model(tb.blocks, tb.x), tb.y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    assert losses[-1] < losses[0]
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for batch in fanout.NeighborLoader(cora, "test", [10, 25], 256, shuffle=False):
            tb = ft.to_torch(batch)
            correct += (model(tb.blocks, tb.x).argmax(1) == tb.y).sum().item()
            total += tb.num_seeds
    assert total == 1000
    assert correct / total > 0.65  # chance is ~0.3; fanout's own GraphSAGE reaches ~0.79


def _eval_with_torch(model, ds_path, meta):
    ds = fanout.Dataset(ds_path)
    fanouts = [int(x) for x in meta["train.fanouts"].split(",")]
    loader = fanout.NeighborLoader(ds, "test", fanouts, int(meta["train.batch_size"]),
                                   shuffle=False, seed=int(meta["train.seed"]))
    correct = total = 0
    with torch.no_grad():
        for batch in loader.epoch(fanout.EVAL_EPOCH):
            tb = ft.to_torch(batch)
            keep = tb.y >= 0
            pred = model(tb.blocks, tb.x).argmax(1)
            correct += (pred[keep] == tb.y[keep]).sum().item()
            total += keep.sum().item()
    return correct / total


@pytest.mark.parametrize("model", ["sage", "gcn"])
def test_train_save_evaluate_and_load_into_torch(cora_path, tmp_path, model):
    ckpt = tmp_path / f"{model}.safetensors"
    metrics = tmp_path / "metrics.json"
    seen = []
    report = fanout.train(
        {"dataset": cora_path, "model": model, "hidden": 32, "batch_size": 32, "epochs": 4,
         "lr": 0.01, "weight_decay": 5e-4, "threads": 2, "save_model": ckpt},
        metrics_out=metrics, on_epoch=seen.append,
    )
    assert [m["epoch"] for m in seen] == [0, 1, 2, 3]
    assert report["model"] == model and len(report["epochs"]) == 4
    assert report["device"]["device"] == "cpu" and report["backend"] == "cpu"
    assert report["test_acc"] > 0.5
    assert json.loads(metrics.read_text())["test_acc"] == report["test_acc"]
    acc = fanout.evaluate(ckpt, cora_path, device="cpu")
    assert acc == pytest.approx(report["test_acc"], abs=1e-12)

    meta, cfg, tensors = fanout.read_checkpoint(ckpt)
    assert cfg["kind"] == model and cfg["in_dim"] == 1433 and cfg["num_classes"] == 7
    first = "layers.0.w_self" if model == "sage" else "layers.0.weight"
    assert tensors[first].shape == (1433, 32)  # in x out
    assert tensors["layers.0.bias"].shape == (1, 32)
    net = ft.load_checkpoint(ckpt)
    assert not net.training
    lin = net.layers[0].lin_self if model == "sage" else net.layers[0].lin
    assert torch.equal(lin.weight, torch.from_numpy(tensors[first]).T)
    # The PyTorch forward on the same batches reproduces fanout's evaluation.
    torch_acc = _eval_with_torch(net, cora_path, meta)
    assert torch_acc == pytest.approx(acc, abs=1.5e-3)  # at most one argmax tie flipped


def test_train_from_a_config_file_and_replay(cora_path, tmp_path):
    toml = tmp_path / "run.toml"
    toml.write_text(
        f'dataset = "{cora_path}"\nmodel = "sage"\nhidden = 16\nbatch_size = 64\nepochs = 2\n'
        'threads = 2\n[sampler]\nkind = "khop"\n'
    )
    metrics = tmp_path / "m.json"
    a = fanout.train(toml, metrics_out=metrics, device="cpu")
    b = fanout.train(metrics)  # a metrics file replays its run
    assert a["config"] == b["config"]
    assert a["test_acc"] == b["test_acc"]
    assert [e["loss"] for e in a["epochs"]] == [e["loss"] for e in b["epochs"]]


def test_train_takes_the_loaders_cache_dict(cora_path):
    """A cache dict as the loader takes it (a float ratio) is a run config's [cache] too."""
    m = fanout.train({"dataset": cora_path, "hidden": 8, "batch_size": 64, "epochs": 1,
                      "threads": 2, "cache": {"policy": "degree", "ratio": 0.1}})
    assert m["config"]["cache"]["ratio"] == "0.1"
    assert m["epochs"][0]["extract"]["bytes_from_cache"] > 0


def test_unsupported_checkpoint_kinds_are_refused(cora_path, tmp_path):
    ckpt = tmp_path / "gin.safetensors"
    fanout.train({"dataset": cora_path, "model": "gin", "hidden": 8, "batch_size": 64,
                  "epochs": 1, "fanouts": [3, 3], "threads": 2}, save_model=ckpt)
    with pytest.raises(NotImplementedError, match="gin checkpoint"):
        ft.load_checkpoint(ckpt)


def test_an_exception_in_on_epoch_stops_the_run_and_is_raised(cora_path, tmp_path):
    seen = []

    def stop_early(m):
        seen.append(m["epoch"])
        raise StopIteration(f"enough after epoch {m['epoch']}")

    import time

    t = time.monotonic()
    with pytest.raises(StopIteration, match="enough after epoch 0"):
        fanout.train({"dataset": cora_path, "hidden": 16, "batch_size": 32, "epochs": 5000,
                      "eval_every": 0, "threads": 2}, on_epoch=stop_early,
                     metrics_out=tmp_path / "m.json")
    assert seen == [0]
    # The epoch it finished is kept, marked as a run that stopped (as `fanout train` does).
    m = json.loads((tmp_path / "m.json").read_text())
    assert "interrupted" in m["stopped"] and m["test_acc"] is None
    assert [e["epoch"] for e in m["epochs"]] == [0]
    # The 5,000 epochs take minutes; stopped at the next step, the call returns in well under
    # a second (30 s leaves room for a loaded machine).
    assert time.monotonic() - t < 30, "the run went on after the callback raised"


def test_ctrl_c_stops_fanout_train_with_keyboard_interrupt(cora_path, tmp_path):
    """SIGINT while `fanout.train` runs in Rust: KeyboardInterrupt within a step, not at the
    end of a 10,000-epoch run."""
    import signal
    import subprocess
    import time
    import sys

    started = tmp_path / "started"
    # The child installs Python's own SIGINT handler: a shell that starts the tests in the
    # background passes SIGINT on ignored, and Python then keeps ignoring it.
    script = f"""
import fanout, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
def mark(m):
    open({str(started)!r}, "w").close()
t = time.monotonic()
try:
    fanout.train({{"dataset": {str(cora_path)!r}, "hidden": 16, "batch_size": 32,
                  "epochs": 10000, "eval_every": 0, "threads": 2}}, on_epoch=mark)
except KeyboardInterrupt:
    print("KeyboardInterrupt after", round(time.monotonic() - t, 1))
    sys.exit(7)
"""
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not started.exists() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert p.poll() is None, p.communicate()
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 7, (out, err)
    assert "KeyboardInterrupt after" in out
    assert "panicked" not in err

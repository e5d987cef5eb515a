"""fanout.report: the pictures of `fanout report`, from what fanout.train returns or from files."""

from __future__ import annotations

import json
import os

import pytest

import fanout

from conftest import run_cli


@pytest.fixture(scope="module")
def run(cora_path, tmp_path_factory):
    """A short training run on cora: its metrics dict and its metrics file."""
    path = tmp_path_factory.mktemp("run") / "run.json"
    m = fanout.train(
        {"dataset": cora_path, "epochs": 3, "threads": 2, "seed": 1}, metrics_out=path
    )
    return m, path


def test_a_run_becomes_a_picture_from_the_dict_and_from_the_file(run, tmp_path):
    metrics, path = run
    out = fanout.report(metrics, tmp_path / "from_dict.svg")
    svg = (tmp_path / "from_dict.svg").read_text()
    assert out == str(tmp_path / "from_dict.svg")
    assert svg.lstrip().startswith("<svg") and svg.rstrip().endswith("</svg>")
    # The panels' titles are text, and the run's model and dataset are named.
    for words in ("loss", "accuracy", "floor", "sage", "cora"):
        assert words in svg, words
    # The file gives the same picture; the default name is the file's with .svg.
    assert fanout.report(path) == str(path.with_suffix(".svg"))
    assert path.with_suffix(".svg").read_text() == svg
    # PNG by the name's extension.
    fanout.report(path, tmp_path / "run.png")
    assert (tmp_path / "run.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cache_sim_rows_become_hit_rate_curves(cora_path, fanout_cli, tmp_path):
    sim = run_cli(fanout_cli, "cache-sim", "--dataset", str(cora_path), "--json")
    assert sim.returncode == 0, sim.stderr
    (tmp_path / "sim.json").write_text(sim.stdout)
    rows = [json.loads(line) for line in sim.stdout.splitlines() if line.strip()]
    policies = {r["policy"] for r in rows}
    assert len(policies) >= 2, policies
    fanout.report(tmp_path / "sim.json")
    svg = (tmp_path / "sim.svg").read_text()
    for p in policies:
        assert p in svg, p
    # The same rows as dicts (a list or a tuple) give the same picture.
    fanout.report(tuple(rows), tmp_path / "rows.svg")
    assert (tmp_path / "rows.svg").read_text() == svg


def test_bad_metrics_and_names_are_refused_before_writing(run, tmp_path):
    metrics, _ = run
    keep = tmp_path / "keep.svg"
    keep.write_text("an earlier picture")
    with pytest.raises(fanout.InvalidArgumentError, match=r"\.svg or \.png"):
        fanout.report(metrics, tmp_path / "run.pdf")
    broken = dict(metrics, epochs=[{k: v for k, v in metrics["epochs"][0].items() if k != "loss"}])
    with pytest.raises(fanout.InvalidArgumentError, match=r'metrics: .*"loss" is missing'):
        fanout.report(broken, keep)
    assert keep.read_text() == "an earlier picture"
    with pytest.raises(fanout.InvalidArgumentError, match="needed when the metrics are not a file"):
        fanout.report(metrics)
    with pytest.raises(fanout.InvalidArgumentError, match="got int"):
        fanout.report(3, keep)
    with pytest.raises(fanout.NotFoundError, match="none.json"):
        fanout.report(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(fanout.InvalidArgumentError, match=r"bad\.json: not JSON \(.* at line 1 column 2\)"):
        fanout.report(tmp_path / "bad.json", keep)
    assert keep.read_text() == "an earlier picture"
    # Metrics saved under a picture's name are not drawn over.
    odd = tmp_path / "metrics.svg"
    odd.write_text(json.dumps(metrics))
    with pytest.raises(fanout.InvalidArgumentError, match="would replace the metrics"):
        fanout.report(odd)
    assert json.loads(odd.read_text()) == json.loads(json.dumps(metrics))
    with pytest.raises(fanout.FanoutIOError):
        fanout.report(metrics, tmp_path / "no" / "such" / "dir.svg")
    # A picture that cannot be renamed into place (a folder holds its name) leaves no
    # temporary behind.
    (tmp_path / "taken.svg").mkdir()
    (tmp_path / "taken.svg" / "x").write_text("kept")
    with pytest.raises(fanout.FanoutIOError, match="cannot rename"):
        fanout.report(metrics, tmp_path / "taken.svg")
    assert (tmp_path / "taken.svg" / "x").read_text() == "kept"
    assert not list(tmp_path.glob(".*tmp*"))
    # A path as bytes; values JSON cannot hold are refused in one line.
    (tmp_path / "metrics2.json").write_text(json.dumps(metrics))
    assert fanout.report(os.fsencode(tmp_path / "metrics2.json")) == str(tmp_path / "metrics2.svg")
    assert (tmp_path / "metrics2.svg").read_text().lstrip().startswith("<svg")
    with pytest.raises(fanout.InvalidArgumentError, match="not JSON"):
        fanout.report(dict(metrics, extra=object()), tmp_path / "x.svg")

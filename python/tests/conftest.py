"""Shared fixtures: the small datasets of ../shared/datasets imported once per session, and
the `fanout` command-line binary for comparisons with the CLI."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

import fanout

REPO = Path(__file__).resolve().parents[2]


def _datasets_dir() -> Path:
    d = Path(os.environ.get("FANOUT_DATASETS", REPO.parent / "shared" / "datasets"))
    if not (d / "cora" / "edge_index.npy").exists():
        pytest.fail(
            f"{d}: the small datasets are missing (cora, citeseer as NumPy directories); "
            "keep ../shared/datasets beside the repository or set FANOUT_DATASETS"
        )
    return d


@pytest.fixture(scope="session")
def sources() -> Path:
    """The directory holding the NumPy sources (cora/, citeseer/)."""
    return _datasets_dir()


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("datasets")


@pytest.fixture(scope="session")
def cora_path(sources: Path, data_dir: Path) -> Path:
    out = data_dir / "cora"
    fanout.import_npy(sources / "cora", out)
    return out


@pytest.fixture(scope="session")
def citeseer_path(sources: Path, data_dir: Path) -> Path:
    out = data_dir / "citeseer"
    fanout.import_npy(sources / "citeseer", out)
    return out


@pytest.fixture(scope="session")
def cora(cora_path: Path) -> fanout.Dataset:
    return fanout.Dataset(cora_path)


@pytest.fixture()
def damaged_copy(cora_path: Path, tmp_path: Path):
    """A function returning a fresh copy of cora to damage."""

    def make(name: str = "broken") -> Path:
        dst = tmp_path / name
        shutil.copytree(cora_path, dst)
        return dst

    return make


def _find_cli() -> "Path | None":
    env = os.environ.get("FANOUT_BIN")
    if env:
        return Path(env)
    candidates = [REPO / "target" / p / "fanout" for p in ("debug", "release")]
    found = [c for c in candidates if c.exists()]
    return max(found, key=lambda c: c.stat().st_mtime) if found else None


@pytest.fixture(scope="session")
def fanout_cli() -> Path:
    """The `fanout` binary (FANOUT_BIN, else the newest of target/{debug,release}/fanout;
    scripts/python-tests.sh builds it)."""
    cli = _find_cli()
    if cli is None:
        pytest.skip("no fanout binary: run `cargo build --bin fanout` (scripts/python-tests.sh does)")
    return cli


def run_cli(cli: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(cli), *args], capture_output=True, text=True, timeout=300)

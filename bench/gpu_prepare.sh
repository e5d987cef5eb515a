#!/usr/bin/env bash
# Builds, on the CPU VM, everything the GPU scripts carry (issue 21; GUIDE §5), from the
# repository root, so that a session lent a GPU spends its device time running, not building.
# No GPU and no CUDA toolkit are needed here: fanout loads the driver, NVRTC and cuBLAS at run
# time. Both folders are ignored (.gitignore; the `run` tool carries ignored paths named in
# `carry`), and both have vanished from the CPU VM between sessions before, hence this script.
#
#   GPU_DIR (default .gpu), what bench/gpu_check.sh and the other gpu_*.sh scripts run:
#     fanout                  the CLI, --features cuda
#     cuda_sampling, cuda_kernels, split_speed        the examples the scripts time (the last
#                             is fanout-cache's, the extract split on the CPU)
#     sampler_matches_cpu, backend_matches_cpu, device_group, cuda_lib_tests
#                             fanout-cuda's test executables (the last: its unit tests)
#     fanout-*.whl            the Python package with --features cuda (abi3, any Python >= 3.9)
#   WHL_DIR (default .whl), what bench/pyg_vs_fanout_gpu.sh needs for PyTorch Geometric:
#     torch-scatter 2.1.2 and torch-sparse 0.6.18 (PyPI sdists), and WHL_DIR/site with the two
#     built CPU-only against the GPU image's Python and torch (KINDS.md: Python 3.12.3, torch
#     2.11.0+cu130, torch-geometric 2.8.0.post1, neither pyg-lib nor torch-sparse). Their
#     libraries call CPython's private `_Py*` functions through pybind11, which are not stable
#     across minor versions, so the site is built with the same minor Python (stop 51's was
#     built with 3.11).
#
# Environment: PY312 (a Python 3.12 interpreter; default the first of python3.12 and pyenv's
# 3.12 that runs), PYG_VENV (the venv that builds WHL_DIR/site, about 5 GB with torch's CUDA
# runtime wheels; default target/pyg-venv; the wheel is built with maturin from a small venv of
# its own, target/maturin-venv), SKIP_GPU=1 or SKIP_WHL=1 to build one folder only. Both
# steps are idempotent. Time on the 2-core VM: about 5 minutes for the cargo builds and the
# wheel from a warm target; a first run then takes 11 more for the rest (649 s in stop 60:
# 77 s for the venv, 545 s for the two sdists).
# Then check the carry size (`du -sh .gpu .whl`; the limit is 64 MiB a call) and run, e.g.,
# `ONLY_TESTS=1 bash bench/gpu_check.sh` with carry [".gpu"] and
# `MODELS=gcn bash bench/pyg_vs_fanout_gpu.sh` with carry [".gpu", ".whl"].
set -euo pipefail
cd "$(dirname "$0")/.."
G=$(realpath -m "${GPU_DIR:-.gpu}"); W=$(realpath -m "${WHL_DIR:-.whl}")
for d in "$G" "$W"; do # .gitignore names the defaults; the `run` tool carries only ignored paths
  case $d in "$PWD"/*) ;; *) echo "error: $d is outside the repository; the run tool carries only paths in it" >&2; exit 1 ;; esac
  mkdir -p "$d"; git check-ignore -q "$d" || { echo "error: $d is not ignored by git; add it to .git/info/exclude" >&2; exit 1; }
done
TORCH=2.11.0 PYG=2.8.0.post1
VENV=${PYG_VENV:-$PWD/target/pyg-venv}
mkdir -p target
step() { echo; echo "=== $* ($(date +%T))"; }

is312() { "$1" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2> /dev/null; }
venv() { # the build venv: Python 3.12 (the image's minor version), the image's torch and PyG
  if [ ! -x "$VENV/bin/python" ]; then
    # pyenv's shim for python3.12 exists even when it cannot run 3.12: try each candidate.
    local py="" c
    for c in ${PY312:-} "$(command -v python3.12 || true)" "$HOME"/.pyenv/versions/3.12*/bin/python; do
      [ -n "$c" ] && is312 "$c" && { py=$c; break; }
    done
    [ -n "$py" ] || { echo "error: no runnable Python 3.12 (tried PY312, python3.12, pyenv's); set PY312" >&2; exit 1; }
    "$py" -m venv "$VENV"
  fi
  is312 "$VENV/bin/python" || { echo "error: $VENV is not a Python 3.12 venv; remove it or set PYG_VENV" >&2; exit 1; }
  if ! "$VENV/bin/python" -c "import torch, torch_geometric as g
assert torch.__version__.split('+')[0] == '$TORCH' and g.__version__ == '$PYG'" 2> /dev/null; then
    step "build venv $VENV: torch $TORCH, torch-geometric $PYG (PyPI)"
    "$VENV/bin/python" -m pip install -q "torch==$TORCH" "torch-geometric==$PYG" numpy scipy \
      setuptools wheel
  fi
}

if [ -z "${SKIP_GPU:-}" ]; then
  step "fanout and its examples, --features cuda"
  cargo build --release -q --features cuda
  cargo build --release -q --features cuda -p fanout-cuda --example cuda_sampling --example cuda_kernels
  cargo build --release -q -p fanout-cache --example split_speed
  mkdir -p "$G"
  T=${CARGO_TARGET_DIR:-target}/release
  cp "$T/fanout" "$T"/examples/{cuda_sampling,cuda_kernels,split_speed} "$G/"
  step "fanout-cuda's test executables"
  # cargo names test executables with a hash; its JSON messages say which file is which target.
  cargo test --release -q --features cuda -p fanout-cuda --no-run --message-format=json \
    | python3 -c '
import json, shutil, sys
names = {"lib": "cuda_lib_tests"}
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-message":  # a warning or error: show it as cargo would
        print(m["message"]["rendered"], file=sys.stderr)
    if m.get("reason") != "compiler-artifact" or not m.get("executable") or not m["profile"]["test"]:
        continue
    t = m["target"]
    name = names.get(t["kind"][0], t["name"])
    shutil.copy(m["executable"], sys.argv[1] + "/" + name)
    print(" ", name)
' "$G"
  find "$G" -maxdepth 1 -type f -perm -u+x -exec strip {} + # the executables, not the wheel
  step "the Python package, --features cuda (log in target/maturin.log)"
  MV=$PWD/target/maturin-venv
  [ -x "$MV/bin/maturin" ] || { python3 -m venv "$MV" && "$MV/bin/python" -m pip install -q 'maturin>=1.5,<2'; }
  rm -f "$G"/fanout-*.whl
  (cd python && PATH="$MV/bin:$PATH" maturin build --release --strip --features cuda -o "$G" > ../target/maturin.log 2>&1) \
    || { tail -n 20 target/maturin.log >&2; exit 1; }
  ls -la "$G"
fi

if [ -z "${SKIP_WHL:-}" ]; then
  venv
  mkdir -p "$W"
  for p in torch-scatter:2.1.2 torch-sparse:0.6.18; do
    n=${p%%:*}; v=${p##*:}
    [ -f "$W/$n-$v.tar.gz" ] && continue
    step "$n $v sdist (PyPI)"
    # `pip download` of these sdists runs their setup.py, which imports torch: take the file,
    # and check it against the sha256 the index gives with its link.
    l=$(curl -sf "https://pypi.org/simple/$n/" | grep -o "https://[^\"]*/${n//-/[-_]}-$v.tar.gz#sha256=[0-9a-f]*" | head -1 || true)
    [ -n "$l" ] || { echo "error: $n $v not found on PyPI's simple index" >&2; exit 1; }
    curl -sfL -o "$W/$n-$v.tar.gz.tmp" "${l%%#*}" || { echo "error: could not download ${l%%#*}" >&2; exit 1; }
    echo "${l##*=}  $W/$n-$v.tar.gz.tmp" | sha256sum -c --quiet || { echo "error: ${l%%#*}: sha256 differs" >&2; exit 1; }
    mv "$W/$n-$v.tar.gz.tmp" "$W/$n-$v.tar.gz"
  done
  if ! PYTHONPATH=$W/site "$VENV/bin/python" -c "import torch_sparse, torch_scatter" 2> /dev/null; then
    step "torch-scatter and torch-sparse, CPU only, into $W/site (logs in target/pyg-build-*.log)"
    rm -rf "$W/site.tmp"
    # setuptools builds an sdist's extensions one after the other unless told to run them in
    # parallel (torch-sparse has a dozen); DIST_EXTRA_CONFIG adds that setting to the build.
    printf '[build_ext]\nparallel = %s\n' "$(nproc)" > target/pyg-parallel.cfg
    for p in torch-scatter:2.1.2 torch-sparse:0.6.18; do
      n=${p%%:*}; v=${p##*:}
      DIST_EXTRA_CONFIG=$PWD/target/pyg-parallel.cfg FORCE_ONLY_CPU=1 "$VENV/bin/python" -m pip install -v --no-build-isolation \
        --no-deps --no-index --no-cache-dir --target "$W/site.tmp" "$W/$n-$v.tar.gz" \
        > "target/pyg-build-$n.log" 2>&1 || { echo "error: $n did not build: target/pyg-build-$n.log" >&2; exit 1; }
    done
    rm -rf "$W/site" && mv "$W/site.tmp" "$W/site"
  fi
  step "check: PyG's NeighborLoader samples with $W/site"
  PYTHONPATH=$W/site "$VENV/bin/python" -c '
import torch, torch_geometric, torch_sparse
from torch_geometric.loader import NeighborLoader
from torch_geometric.data import Data
assert torch_geometric.typing.WITH_TORCH_SPARSE, "torch_geometric does not see torch_sparse"
e = torch.randint(0, 1000, (2, 20000))
batch = next(iter(NeighborLoader(Data(x=torch.randn(1000, 8), edge_index=e), [10, 5], batch_size=64)))
print("torch", torch.__version__, "pyg", torch_geometric.__version__, "torch_sparse", torch_sparse.__version__,
      "- one batch:", batch.num_nodes, "vertices,", batch.edge_index.size(1), "edges")
'
  du -sh "$W"
fi
step "carry size (limit 64 MiB a call)"
du -sh "$G" "$W" 2> /dev/null || true

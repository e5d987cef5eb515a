#!/usr/bin/env bash
# fanout against PyTorch Geometric on the same GPU machine (issue 21; GUIDE §5), from the
# repository root: the products preset at full size (2,449,029 vertices), batch 8000, hidden 256,
# GCN 15,10,5, SAGE and GAT 10,25, 3 epochs each.
#
#   fanout: GPU_DIR/fanout --device cuda with every row on the GPU (`device`, what `auto` picks
#           there when the rows fit) and in page-locked host memory read in place (`uva`).
#   PyG:    bench/pyg_train.py on the same directory: NeighborLoader sampling on the CPU in 14
#           worker processes (torch-sparse's sampler: the GPU image has PyG 2.8 but neither
#           pyg-lib nor torch-sparse), the model on the GPU, features on the host (sliced by
#           the loader and copied per batch, PyG's usual set-up) or on the GPU.
#
# Build both folders on the CPU VM first with `bash bench/gpu_prepare.sh`, and carry GPU_DIR
# (default .gpu, with `fanout`) and WHL_DIR (default .whl). WHL_DIR/site holds torch_scatter and
# torch_sparse built there, CPU only, in a venv of the GPU image's Python 3.12 and torch 2.11
# (/work/.library/device/KINDS.md); their libraries are loaded by torch.ops.load_library but
# call CPython's private `_Py*` functions through pybind11, so they are built for that same
# minor Python (stop 51's copy was built with 3.11). If they do not import there, the PyG runs
# are skipped and the import error is printed, unless BUILD=1: then the two sdists in WHL_DIR
# are built on the GPU machine (in stop 51 that failed for torch-sparse and had not finished
# torch-scatter after six minutes), each build's whole log in $OUT/build-NAME.log, ended after
# BUILD_TIMEOUT seconds (default 240).
#
# Environment: MODELS (default "gcn sage gat"), EPOCHS (3), DATA (the dataset folder, made if
# missing; default /tmp/products), PYG_TIMEOUT (seconds a PyG run may take, default 200),
# DEADLINE (default 570): a step whose time limit would end past DEADLINE seconds from the
# start is skipped, and says so, so that a call with a 600 s limit returns whatever ran.
# Output: the log in $OUT/pyg_vs_fanout.log, every run's JSON and stderr in $OUT/runs as each run
# ends, and a table (bench/pyg_table.py; run it again on the CPU machine over the runs of
# several calls put in one folder).
#
# Time: torch-sparse's sampler is single-threaded and took 1.6-1.8 s a batch at 10,25 and
# 4.3-5.2 s at 15,10,5 on the products preset at full size (CPU VM), so each PyG run takes a
# minute or more. A session has 15 minutes of device time in all, starts included: make one
# call with MODELS=gcn and, if time is left, one with MODELS="sage gat" (a fresh machine
# regenerates the dataset, within a 150 s limit; its time there was not recorded).
set -uo pipefail
G=${GPU_DIR:-.gpu}; W=${WHL_DIR:-.whl}; R=${OUT:-/tmp/out}; M=$R/runs; mkdir -p $M
. "$(dirname "$0")/gpu_env.sh"
exec > >(tee $R/pyg_vs_fanout.log) 2>&1
DEADLINE=${DEADLINE:-570}; SECONDS=0
fits() { # fits SECONDS_NEEDED NAME: true if a step of that time limit ends before DEADLINE
  [ $((SECONDS + $1)) -le $DEADLINE ] && return 0
  echo "skipped: $2 (its $1 s limit would end past DEADLINE=$DEADLINE s; $SECONDS s used)"; return 1
}
nvidia-smi -L; nproc; df -h /dev/shm | tail -1
python3 -c "import sys, torch; print(sys.version.split()[0], 'torch', torch.__version__)"
PYG=1
if PYTHONPATH=$W/site python3 -c "import torch_sparse, torch_scatter" 2> $R/prebuilt.err; then
  SITE=$W/site; echo "torch_sparse and torch_scatter from $W/site"
elif [ -n "${BUILD:-}" ]; then
  SITE=/tmp/pyg-site
  step "build torch-scatter and torch-sparse (CPU only; $W/site did not import: $R/prebuilt.err)"
  # setuptools builds an sdist's extensions one after the other unless told to run them in
  # parallel (torch-sparse has a dozen); DIST_EXTRA_CONFIG adds that setting to the build.
  printf '[build_ext]\nparallel = 16\n' > /tmp/parallel.cfg
  export FORCE_ONLY_CPU=1 MAX_JOBS=16 DIST_EXTRA_CONFIG=/tmp/parallel.cfg
  B=$SECONDS; pids=""
  for p in torch-scatter torch-sparse; do
    # Each build in its own session, so that the deadline below can end it and every compiler
    # it started (in stop 51 a build outlived its `timeout` and took the rest of the call).
    setsid python3 -m pip install -v --no-build-isolation --no-deps --no-index --no-cache-dir \
      --target $SITE $W/$p-*.tar.gz > $R/build-$p.log 2>&1 &
    pids="$pids $!"
  done
  while [ $((SECONDS - B)) -lt ${BUILD_TIMEOUT:-240} ] && jobs -r | grep -q .; do sleep 2; done
  for pid in $pids; do kill -KILL -- -$pid 2> /dev/null && echo "build $pid stopped at the deadline"; done
  wait
  echo "built in $((SECONDS - B)) s"; tail -n 3 $R/build-*.log
else
  PYG=; echo "PyG runs skipped: $W/site does not import (BUILD=1 builds the sdists here):"; tail -n 5 $R/prebuilt.err
fi
if [ -n "$PYG" ]; then
  export PYTHONPATH=$SITE
  python3 -c "import torch, torch_geometric, torch_sparse; print('torch', torch.__version__, 'pyg', torch_geometric.__version__, 'torch_sparse', torch_sparse.__version__, 'sampler', torch_geometric.typing.WITH_TORCH_SPARSE)" || PYG=
fi
D=${DATA:-/tmp/products}
if [ ! -f $D/meta.txt ] && fits 150 "the dataset"; then
  step "products dataset (2449029)"
  timeout -k 5 150 $G/fanout --quiet dataset gen --preset products --nodes 2449029 $D > /dev/null
fi
EPOCHS=${EPOCHS:-3}
for model in ${MODELS:-gcn sage gat}; do
  f=10,25; [ $model = gcn ] && f=15,10,5
  for place in device uva; do
    fits 150 "fanout $model $place" || continue
    step "fanout $model $place"
    timeout -k 5 150 $G/fanout train --dataset $D --epochs $EPOCHS --batch-size 8000 --hidden 256 \
      --device cuda --model $model --fanouts $f --feature-placement $place --eval-every 0 \
      --metrics-out $M/fanout-$model-$place.json 2>&1 | grep -E "^epoch|^test|error" | tail -4
  done
  [ -n "$PYG" ] || continue
  for feats in device host; do
    fits ${PYG_TIMEOUT:-200} "pyg $model features $feats" || continue
    step "pyg $model features $feats"
    timeout -k 5 ${PYG_TIMEOUT:-200} python3 "$(dirname "$0")/pyg_train.py" --dataset $D --epochs $EPOCHS \
      --batch-size 8000 --hidden 256 --device cuda --model $model --fanouts $f --features $feats \
      --num-workers 14 --eval-every 0 > $M/pyg-$model-$feats.json 2> $M/pyg-$model-$feats.err
    tail -n 4 $M/pyg-$model-$feats.err
  done
done
step "compare"
python3 "$(dirname "$0")/pyg_table.py" $M
step done

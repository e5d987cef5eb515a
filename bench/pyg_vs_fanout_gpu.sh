#!/usr/bin/env bash
# fanout against PyTorch Geometric on the same GPU machine (issue 21; GUIDE §5), from the
# repository root: the products preset at full size (2,449,029 vertices), batch 8000, hidden 256,
# GCN 15,10,5, SAGE and GAT 10,25, 3 epochs each.
#
#   fanout: GPU_DIR/fanout --device cuda with the rows on the GPU (`device`, its default there)
#           and in page-locked host memory read in place (`uva`).
#   PyG:    bench/pyg_train.py on the same directory: NeighborLoader sampling on the CPU in 14
#           worker processes (torch-sparse's sampler; the GPU image has PyG 2.8 but neither
#           pyg-lib nor torch-sparse, so torch-scatter and torch-sparse are built here, CPU
#           only, from the sdists in WHL_DIR), the model on the GPU, features on the host
#           (sliced by the loader and copied per batch, PyG's usual set-up) or on the GPU.
#
# Build both folders on the CPU VM first with `bash bench/gpu_prepare.sh`, and carry GPU_DIR
# (default .gpu, with `fanout`) and WHL_DIR (default .whl). WHL_DIR/site holds torch_scatter and
# torch_sparse built there, CPU only, in a venv of the GPU image's Python 3.12 and torch 2.11
# (KINDS.md); their libraries are loaded by torch.ops.load_library but call CPython's private
# `_Py*` functions through pybind11, so they are built for that same minor Python (stop 51's
# copy was built with 3.11). Where `import torch_sparse, torch_scatter` fails with them anyway, the two sdists
# in WHL_DIR (torch-scatter 2.1.2 and torch-sparse 0.6.18, unmodified, from PyPI) are built here
# instead, each build's whole log in $OUT/build-NAME.log, within BUILD_TIMEOUT seconds.
#
# Output: the log in $OUT/pyg_vs_fanout.log, every run's JSON in $OUT/pyg.tgz, and a table
# (bench/pyg_table.py).
#
# Time: in stop 51 the build on the GPU machine (16 cores) failed for torch-sparse and had not
# finished torch-scatter after six minutes, hence the prebuilt copy (on the 2-core VM the two
# took 157 s and 644 s in stop 60). torch-sparse's sampler is
# single-threaded and took 1.6-1.8 s a batch at 10,25 and 4.3-5.2 s at 15,10,5 on the products
# preset at full size (CPU VM), so each PyG run takes a minute or more; give the call two of
# the device's 10-minute limits (MODELS="gcn" and MODELS="sage gat", the dataset kept in /tmp on
# a warm machine, which is given back after 30 idle seconds).
set -uo pipefail
G=${GPU_DIR:-.gpu}; W=${WHL_DIR:-.whl}; R=${OUT:-/tmp/out}; M=/tmp/m-pyg; mkdir -p $M $R
. "$(dirname "$0")/gpu_env.sh"
exec > >(tee $R/pyg_vs_fanout.log) 2>&1
nvidia-smi -L; nproc; python3 -c "import sys, torch; print(sys.version.split()[0], 'torch', torch.__version__)"
SITE=/tmp/site
if PYTHONPATH=$W/site python3 -c "import torch_sparse, torch_scatter" 2> $R/prebuilt.err; then
  SITE=$W/site; echo "torch_sparse and torch_scatter from $W/site"
elif ! PYTHONPATH=$SITE python3 -c "import torch_sparse" 2> /dev/null; then
step "build torch-scatter and torch-sparse (CPU only; $W/site did not import: $R/prebuilt.err)"
# setuptools builds an sdist's extensions one after the other unless told to run them in
# parallel (torch-sparse has a dozen); DIST_EXTRA_CONFIG adds that setting to the build.
printf '[build_ext]\nparallel = 16\n' > /tmp/parallel.cfg
export FORCE_ONLY_CPU=1 MAX_JOBS=16 DIST_EXTRA_CONFIG=/tmp/parallel.cfg
SECONDS=0; pids=""
for p in torch-scatter torch-sparse; do
  # Each build in its own session, so that the deadline below can end it and every compiler
  # it started (in stop 51 a build outlived its `timeout` and took the rest of the call).
  setsid python3 -m pip install -v --no-build-isolation --no-deps --no-index --no-cache-dir \
    --target $SITE $W/$p-*.tar.gz > $R/build-$p.log 2>&1 &
  pids="$pids $!"
done
while [ $SECONDS -lt ${BUILD_TIMEOUT:-240} ] && jobs -r | grep -q .; do sleep 2; done
for pid in $pids; do kill -KILL -- -$pid 2> /dev/null && echo "build $pid stopped at the deadline"; done
wait
echo "built in $SECONDS s"; tail -n 3 $R/build-*.log
fi
export PYTHONPATH=$SITE
python3 -c "import torch, torch_geometric, torch_sparse; print('torch', torch.__version__, 'pyg', torch_geometric.__version__, 'torch_sparse', torch_sparse.__version__, 'sampler', torch_geometric.typing.WITH_TORCH_SPARSE)"
D=${DATA:-/tmp/products}
if [ ! -f $D/meta.txt ]; then
  step "products dataset (2449029)"
  timeout -k 5 150 $G/fanout --quiet dataset gen --preset products --nodes 2449029 $D > /dev/null
fi
EPOCHS=${EPOCHS:-3}
for model in ${MODELS:-gcn sage gat}; do
  f=10,25; [ $model = gcn ] && f=15,10,5
  for place in device uva; do
    step "fanout $model $place"
    timeout -k 5 150 $G/fanout train --dataset $D --epochs $EPOCHS --batch-size 8000 --hidden 256 \
      --device cuda --model $model --fanouts $f --feature-placement $place --eval-every 0 \
      --metrics-out $M/fanout-$model-$place.json 2>&1 | grep -E "^epoch|^test|error" | tail -4
  done
  for feats in device host; do
    step "pyg $model features $feats"
    timeout -k 5 ${PYG_TIMEOUT:-200} python3 "$(dirname "$0")/pyg_train.py" --dataset $D --epochs $EPOCHS \
      --batch-size 8000 --hidden 256 --device cuda --model $model --fanouts $f --features $feats \
      --num-workers 14 --eval-every 0 > $M/pyg-$model-$feats.json 2> $M/pyg-$model-$feats.err
    tail -n 4 $M/pyg-$model-$feats.err
  done
done
step "compare"
python3 "$(dirname "$0")/pyg_table.py" $M
tar czf $R/pyg.tgz -C /tmp m-pyg
step done

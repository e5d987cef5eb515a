#!/usr/bin/env bash
# Creates .venv-peers with DGL on CPU (GUIDE section 4), the peer of the sampling benchmark.
# Idempotent: does nothing when .venv-peers already imports dgl and torch.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv-peers}
if [ -x "$VENV/bin/python" ] && DGLBACKEND=pytorch "$VENV/bin/python" -c "import dgl, torch" 2>/dev/null; then
  echo "$VENV: dgl $(DGLBACKEND=pytorch "$VENV/bin/python" -c 'import dgl; print(dgl.__version__)' 2>/dev/null) ready"
  exit 0
fi
python3 -m venv "$VENV"
# DGL 2.1.0 ships its graphbolt library only up to torch 2.2.1.
"$VENV/bin/pip" install torch==2.2.1 dgl==2.1.0 torchdata==0.7.1 "numpy<2" pandas pydantic pyyaml psutil scipy
DGLBACKEND=pytorch "$VENV/bin/python" -c "import dgl, torch; print('dgl', dgl.__version__, 'torch', torch.__version__)"

#!/usr/bin/env bash
# Installs hybrid (editable) with its dependencies and test extra.
# torch first, pinned: on a machine without a GPU the CPU wheel `torch==2.13.0+cpu` -- from a local wheel
# directory or index when pip is configured with one (this project's CI machine), else from PyTorch's CPU index
# (PyPI's Linux `torch==2.13.0` is the multi-GB CUDA build, as is an unpinned torch).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    "$PY" -m pip install -q "torch>=2.4,<=2.14.1"
  else
    "$PY" -m pip install -q "torch==2.13.0+cpu" 2>/dev/null \
      || "$PY" -m pip install -q torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
  fi
fi
# test + bench: the suite runs every benchmark's --quick mode with its peers (megatron-core among them) and checks
# the indexed dataset byte for byte against megatron-core's reader
"$PY" -m pip install -q -e ".[test,bench]" 2>&1 | grep -v -E "^WARNING: Running pip as|^\[notice\]" || true
# DeepSpeed's JIT ops (CPU Adam; the shared-memory collectives deepspeed.initialize loads on CPU) built now, once,
# under hybrid's build lock: a first build inside a test's or benchmark's time limit, killed there, would leave
# torch's build lock behind and hang every later DeepSpeed run (hybrid/zero/cpu_adam_build.py)
"$PY" -m hybrid.zero.cpu_adam_build 2>&1 | grep -v -E "real_accelerator.py|^\[" || true
"$PY" -c "import hybrid, models, torch, transformers; print(f'hybrid ready: torch {torch.__version__}, transformers {transformers.__version__}')"

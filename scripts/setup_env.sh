#!/usr/bin/env bash
# Create .venv at the repo root (once) with torch pinned to the local CPU wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
if ! .venv/bin/python -c "import torch, onnxruntime, msar_export" >/dev/null 2>&1; then
    # Pinned first, so nothing else can make pip resolve a multi-GB CUDA torch.
    .venv/bin/pip install -q torch==2.13.0
    .venv/bin/pip install -q -e ".[test]"
fi

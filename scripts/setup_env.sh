#!/usr/bin/env bash
# Create .venv at the repo root (once) with torch pinned to the local CPU wheel,
# the test tools and TensorRT-RTX (the `rtx` extra: a real TensorRT parser and
# builder that need no GPU, so the suite builds real engines).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
if ! .venv/bin/python -c "import torch, xdist, pytest_timeout, onnxruntime, msar_export, tensorrt_rtx, onnx_graphsurgeon, onnxconverter_common, onnxsim, onnxoptimizer, onnxslim, onnxruntime_genai" >/dev/null 2>&1; then
    # Pinned first, so nothing else can make pip resolve a multi-GB CUDA torch.
    .venv/bin/pip install -q torch==2.13.0
    .venv/bin/pip install -q torch==2.13.0 -e ".[test,rtx,genai]"
fi
# The native msar kernels for ONNX Runtime (plugins/msarOrtOps): headers fetched once into a
# cache, the library rebuilt only when its sources change.  Without them the function bodies run.
if headers=$(./scripts/fetch_ort_headers.sh); then
    .venv/bin/python -m msar_export.kernels.ort_ops --sources plugins --headers "$headers" || true
fi

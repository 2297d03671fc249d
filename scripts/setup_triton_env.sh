#!/usr/bin/env bash
# Create .venv-triton at the repo root (once): the Triton Inference Server that
# `msar-export serve` launches, and the client side of `msar-export loadtest`.
#
# Why a second venv: nvidia-pytriton (it ships the `tritonserver` binary, the
# Python backend and its stubs) pins numpy<2, and tritonclient[grpc] pins
# protobuf<7; the main .venv has numpy 2 and protobuf 7.
# torch is pinned to the local CPU wheel and installed first, so pip never
# resolves a multi-GB CUDA build. This package goes in editable, with its own
# dependencies resolved together with numpy<2 (so `import msar_export` works
# there whatever its __init__ grows to need).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
CHECK="import pytriton, tritonclient.grpc, tritonclient.http, onnxruntime, onnx, torch, msar_export.serving.cli"
if [ ! -x .venv-triton/bin/python ]; then
    "$PY" -m venv .venv-triton
fi
# Keep the venv out of `git status` whatever .gitignore says.
echo '*' > .venv-triton/.gitignore
if ! .venv-triton/bin/python -c "$CHECK" >/dev/null 2>&1; then
    .venv-triton/bin/pip install -q torch==2.13.0
    .venv-triton/bin/pip install -q torch==2.13.0 "numpy<2" "nvidia-pytriton>=0.5" onnxruntime -e .
fi
.venv-triton/bin/python -c "$CHECK"
echo ".venv-triton ready: $(.venv-triton/bin/python -c 'import importlib.metadata as m; print(*(f"{p} {m.version(p)}" for p in ("nvidia-pytriton", "tritonclient", "onnxruntime", "numpy", "torch")), sep=", ")')"

#!/usr/bin/env bash
# GPU check of the msar plugin kernels, for a machine with an NVIDIA GPU, nvcc
# and PyTorch (TensorRT not needed):
#   1. builds plugins/*Kernel.cu into a shared library with a C ABI (nvcc),
#   2. runs it through ctypes on torch CUDA tensors against the eager mixer and
#      a float64 reference (sources 1..25, d 40..2048, B*T up to 64k;
#      float32/float16/bfloat16), times it with CUDA events against a
#      device-to-device copy, prints a table and writes results JSON.
# Takes a few minutes (budgeted under 5). Without a GPU it prints "skipped: no CUDA device" and exits 0.
#
#   scripts/gpu_check.sh [--quick]          # --quick: correctness only
# Needs a CUDA build of PyTorch and the project's dependencies (pip install -e .).
# Environment: PYTHON (default .venv/bin/python or python3), NVCC (default nvcc),
#              MSAR_GPU_CHECK_DIR (default build/gpu_check).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-}
if [ -z "$PY" ]; then
    if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
NVCC=${NVCC:-nvcc}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # msar_export from this checkout
OUT_DIR=${MSAR_GPU_CHECK_DIR:-build/gpu_check}

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1; then
    echo "skipped: no CUDA device"
    exit 0
fi
if ! command -v "$NVCC" >/dev/null 2>&1; then
    echo "gpu_check: nvcc not found (set NVCC or put the CUDA toolkit on PATH)" >&2
    exit 1
fi

# Compile for the GPU that is here (its compute capability, as torch reports it).
ARCH=$("$PY" -c "import torch; a, b = torch.cuda.get_device_capability(); print(f'{a}{b}')")
mkdir -p "$OUT_DIR"
LIB="$OUT_DIR/libmsar_kernels.so"
echo "# building $LIB for sm_$ARCH"
"$NVCC" -O3 -std=c++17 -shared -Xcompiler -fPIC -lineinfo \
    -gencode "arch=compute_$ARCH,code=sm_$ARCH" -Iplugins/common \
    plugins/msarFusedMixerPlugin/fusedMixerKernel.cu plugins/msarDepthRetrievalPlugin/depthRetrievalKernel.cu \
    -o "$LIB"

exec "$PY" scripts/gpu_check.py --lib "$LIB" --out "$OUT_DIR/results.json" "$@"

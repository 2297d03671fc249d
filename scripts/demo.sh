#!/usr/bin/env bash
# Set up .venv, reuse (or train) the default checkpoint, and run every stage of
# the pipeline on it: eager generation, ONNX export (custom ops, decomposed,
# decode), ONNX Runtime generation, parity check, TensorRT build (skipped
# without TensorRT).  Outputs go to runs/demo/.
#   ./scripts/demo.sh            reuse checkpoints/default (committed)
#   ./scripts/demo.sh --retrain  train the three residual kinds again (~4 min on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
START=$SECONDS
stage() { printf '\n[%dm%02ds] == %s\n' $(((SECONDS - START) / 60)) $(((SECONDS - START) % 60)) "$*"; }
stage "environment (.venv; created on the first run)"
./scripts/setup_env.sh
X=".venv/bin/msar-export"
CKPT=checkpoints/default
OUT=runs/demo
mkdir -p "$OUT"

if [ "${1:-}" = "--retrain" ] || [ ! -f "$CKPT/msar/model.safetensors" ]; then
    CKPT=runs/default
    stage "train (msar, standard, attnres; fixed seed) -> $CKPT"
    $X train -o "$CKPT"
fi

stage "eager generation"
$X generate "$CKPT/msar" --prompt "def __init__(self" --max-new-tokens 48

stage "export: msar custom ops (prefill), decomposed, decode graph"
$X export "$CKPT/msar" -o "$OUT/msar.onnx"
$X export "$CKPT/msar" -o "$OUT/msar.decomposed.onnx" --decomposed
$X export "$CKPT/msar" -o "$OUT/msar.decode.onnx" --decode

stage "ONNX Runtime generation (decode graph)"
$X generate --onnx "$OUT/msar.decode.onnx" --prompt "def __init__(self" --max-new-tokens 48

if $X --help | grep -q " check "; then
    stage "parity check: eager vs ONNX Runtime (vs TensorRT when installed), per layer"
    $X check "$CKPT/msar" --onnx "$OUT/msar.onnx" --report "$OUT/report"
fi

if $X --help | grep -q " build "; then
    stage "TensorRT engine build"
    if .venv/bin/python -c "import tensorrt" >/dev/null 2>&1; then
        $X build "$OUT/msar.onnx" -o "$OUT/msar.plan"
    elif .venv/bin/python -c "import tensorrt_rtx" >/dev/null 2>&1; then
        # TensorRT-RTX builds without a GPU; the decomposed graph needs no plugin library.
        $X build "$OUT/msar.decomposed.onnx" -o "$OUT/msar.decomposed.plan" --backend tensorrt-rtx
    else
        echo "skipped: TensorRT is not installed here (import tensorrt fails); see docs/tensorrt.md"
    fi
fi
stage "ecosystem tools: onnx's ReferenceEvaluator on the custom-op file (docs/interop.md)"
$X onnx reference "$OUT/msar.onnx"

stage "benchmark smoke run (tiny model; the full run is: msar-export bench -o benchmarks)"
$X bench --quick --no-compile -o "$OUT/bench"
stage "done: outputs in $OUT"

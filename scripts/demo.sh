#!/usr/bin/env bash
# Set up .venv, reuse (or train) the default checkpoint, and run every stage of
# the pipeline on it: eager generation, ONNX export (custom ops, decomposed,
# decode), ONNX Runtime generation, parity check, TensorRT build (TensorRT-RTX
# here: no GPU needed), the ecosystem's reference evaluator, a benchmark smoke
# run.  Outputs go to runs/demo/; each stage prints the time since the start.
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
$X generate "$CKPT/msar" --prompt "def __init__(self" --max-new-tokens 32

# The three exports are independent: run side by side, each into its own log,
# printed whole when all are done.
stage "export: msar custom ops (prefill), decomposed, decode graph (side by side)"
declare -A EXPORTS=([msar]="" [msar.decomposed]="--decomposed" [msar.decode]="--decode")
pids=()
for name in "${!EXPORTS[@]}"; do
    # shellcheck disable=SC2086  # the flag is one word or none
    $X export "$CKPT/msar" -o "$OUT/$name.onnx" ${EXPORTS[$name]} > "$OUT/$name.export.log" 2>&1 &
    pids+=($!)
done
failed=0
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
for name in msar msar.decomposed msar.decode; do cat "$OUT/$name.export.log"; done
[ "$failed" = 0 ] || { echo "an export failed (logs above)"; exit 1; }

# The benchmark smoke run needs none of the files above: it runs in the background
# while the later stages use the exports, and its output follows at the end.
$X bench --quick --no-compile -o "$OUT/bench" > "$OUT/bench.log" 2>&1 &
BENCH=$!

stage "ONNX Runtime generation (decode graph)"
$X generate --onnx "$OUT/msar.decode.onnx" --prompt "def __init__(self" --max-new-tokens 32

stage "parity check: eager vs ONNX Runtime (vs TensorRT when installed), per layer"
$X check "$CKPT/msar" --onnx "$OUT/msar.onnx" --report "$OUT/report"

stage "TensorRT engine build"
if .venv/bin/python -c "import tensorrt" >/dev/null 2>&1; then
    $X build "$OUT/msar.onnx" -o "$OUT/msar.plan"
elif .venv/bin/python -c "import tensorrt_rtx" >/dev/null 2>&1; then
    # TensorRT-RTX builds without a GPU; the decomposed graph needs no plugin library.
    $X build "$OUT/msar.decomposed.onnx" -o "$OUT/msar.decomposed.plan" --backend tensorrt-rtx
else
    echo "skipped: TensorRT is not installed here (import tensorrt fails); see docs/tensorrt.md"
fi

stage "ecosystem tools: onnx's ReferenceEvaluator on the custom-op file (docs/interop.md)"
$X onnx reference "$OUT/msar.onnx"

stage "benchmark smoke run (tiny model, started after the exports; the full run is: msar-export bench -o benchmarks)"
bench_rc=0
wait "$BENCH" || bench_rc=$?
cat "$OUT/bench.log"
[ "$bench_rc" = 0 ] || { echo "the benchmark smoke run failed (log above)"; exit 1; }
stage "done: outputs in $OUT"

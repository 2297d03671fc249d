#!/usr/bin/env bash
# Compile-only check of every msar plugin source (no linking, no GPU, no TensorRT
# libraries), through plugins/CMakeLists.txt: its object targets
# msar_kernel_objects (nvcc) and msar_glue_objects (the TensorRT glue).
#
#   plugins/compile_check.sh                                   # kernels only, glue skipped
#   TENSORRT_INCLUDE_DIR=/path/to/TensorRT/include plugins/compile_check.sh
#
# Environment: MSAR_CUDA_ARCHS (default "80 90"; "none" skips the kernels), NVCC
# (used as CMAKE_CUDA_COMPILER when set; a broken one fails the check), CXX,
# MSAR_COMPILE_STRICT (default 1: -Werror), MSAR_BUILD_DIR (a build folder to
# reuse; default a temporary one).
# Prints one line per target ("compiled:", "FAILED:", "skipped:") and a summary;
# exits non-zero if configuring or any compile failed.
set -u
cd "$(dirname "$0")"

ARCHS=${MSAR_CUDA_ARCHS:-"80 90"}
STRICT=${MSAR_COMPILE_STRICT:-1}
if [ -n "${MSAR_BUILD_DIR:-}" ]; then
    DIR=$MSAR_BUILD_DIR
else
    DIR=$(mktemp -d "${TMPDIR:-/tmp}/msar_compile_check.XXXXXX")
    trap 'rm -rf "$DIR"' EXIT
fi

defs=(-DMSAR_WERROR=$([ "$STRICT" = 1 ] && echo ON || echo OFF) "-DTENSORRT_INCLUDE_DIR=${TENSORRT_INCLUDE_DIR:-}")
if [ "$ARCHS" = "none" ]; then
    defs+=(-DMSAR_CUDA=OFF)
else
    # -real: machine code only; embedding PTX too would double nvcc's time for nothing checked
    real=$(printf '%s-real;' $ARCHS)
    defs+=(-DMSAR_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=${real%;}")
    [ -n "${NVCC:-}" ] && defs+=("-DCMAKE_CUDA_COMPILER=$NVCC")
fi

mkdir -p "$DIR"
LOG="$DIR/msar-compile-check-configure.log"
if ! cmake -S . -B "$DIR" -G Ninja "${defs[@]}" >"$LOG" 2>&1; then
    echo "FAILED: configure"
    sed 's/^/  /' "$LOG"
    echo "compile_check: 0 compiled, 1 failed"
    exit 1
fi
skipped=$(sed -n 's/^-- msar: skipping /skipped: /p' "$LOG")

compiled=0
failed=0
for target in msar_kernel_objects msar_glue_objects; do
    ninja -C "$DIR" -t query "$target" >/dev/null 2>&1 || continue  # not configured here: reported as skipped
    case $target in
        msar_kernel_objects) what="sm_${ARCHS// / sm_}" ;;
        *) what="TensorRT headers" ;;
    esac
    if cmake --build "$DIR" --target "$target" >"$DIR/$target.log" 2>&1; then
        echo "compiled: $target ($what)"
        compiled=$((compiled + 1))
    else
        echo "FAILED: $target ($what)"
        sed 's/^/  /' "$DIR/$target.log"
        failed=$((failed + 1))
    fi
done
[ -n "$skipped" ] && echo "$skipped"
echo "compile_check: $compiled compiled, $failed failed"
[ "$failed" -eq 0 ]

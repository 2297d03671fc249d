#!/usr/bin/env bash
# Compile-only check of every msar plugin source (no linking, no GPU, no TensorRT libraries).
#
#   plugins/compile_check.sh                                   # kernels only, glue skipped
#   TENSORRT_INCLUDE_DIR=/path/to/TensorRT/include plugins/compile_check.sh
#
# Kernels (.cu): nvcc -c for each arch in MSAR_CUDA_ARCHS (default "80 90"; "none" skips them).
# Glue (.cpp):   g++ -c -std=c++17 -Wall -Wextra -Werror against the TensorRT headers
#                (MSAR_COMPILE_STRICT=0 drops -Werror).
# Prints one line per compile ("compiled:", "FAILED:", "skipped:") and a summary;
# exits non-zero if any compile failed.
set -u
cd "$(dirname "$0")"

NVCC=${NVCC:-nvcc}
CXX=${CXX:-g++}
ARCHS=${MSAR_CUDA_ARCHS:-"80 90"}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}
STRICT=${MSAR_COMPILE_STRICT:-1}

KERNELS=(msarFusedMixerPlugin/fusedMixerKernel.cu msarDepthRetrievalPlugin/depthRetrievalKernel.cu)
GLUE=(common/msarPlugins.cpp msarFusedMixerPlugin/fusedMixerPlugin.cpp msarDepthRetrievalPlugin/depthRetrievalPlugin.cpp)

OUT=$(mktemp -d "${TMPDIR:-/tmp}/msar_compile_check.XXXXXX")
trap 'rm -rf "$OUT"' EXIT

# The CUDA headers, for g++ (TensorRT's headers include cuda_runtime_api.h).
cuda_include() {
    local c
    for c in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda; do
        if [ -n "$c" ] && [ -f "$c/include/cuda_runtime_api.h" ]; then
            echo "$c/include"
            return
        fi
    done
    # Ask nvcc where its headers are (works for wrapper scripts too).
    "$NVCC" --dryrun -c -x cu /dev/null -o /dev/null 2>&1 | sed -n 's/.*INCLUDES="*-I\([^" ]*\).*/\1/p' | head -n 1
}

jobs_list=()   # "name|command" entries
skipped=()

if [ "$ARCHS" = "none" ]; then
    skipped+=("skipped: ${KERNELS[*]} (MSAR_CUDA_ARCHS=none)")
elif command -v "$NVCC" >/dev/null 2>&1; then
    for src in "${KERNELS[@]}"; do
        for arch in $ARCHS; do
            obj="$OUT/$(basename "$src" .cu).sm_$arch.o"
            jobs_list+=("$src (sm_$arch)|$NVCC -c -std=c++17 -O3 -gencode arch=compute_$arch,code=sm_$arch -Icommon $src -o $obj")
        done
    done
else
    skipped+=("skipped: ${KERNELS[*]} (nvcc not found: put it on PATH or set NVCC)")
fi

if [ -n "${TENSORRT_INCLUDE_DIR:-}" ] && [ -f "${TENSORRT_INCLUDE_DIR}/NvInferRuntime.h" ]; then
    cuda_inc=$(cuda_include)
    if [ -z "$cuda_inc" ]; then
        skipped+=("skipped: ${GLUE[*]} (CUDA headers not found: set CUDA_HOME)")
    else
        werror=""
        [ "$STRICT" = "1" ] && werror="-Werror"
        for src in "${GLUE[@]}"; do
            obj="$OUT/$(basename "$src" .cpp).o"
            jobs_list+=("$src (TensorRT headers)|$CXX -c -std=c++17 -fPIC -Wall -Wextra $werror -DMSAR_STATIC_REGISTRATION=1 -isystem ${TENSORRT_INCLUDE_DIR} -isystem $cuda_inc -Icommon $src -o $obj")
        done
    fi
elif [ -n "${TENSORRT_INCLUDE_DIR:-}" ]; then
    skipped+=("skipped: ${GLUE[*]} (no TensorRT headers: ${TENSORRT_INCLUDE_DIR}/NvInferRuntime.h does not exist)")
else
    skipped+=("skipped: ${GLUE[*]} (no TensorRT headers: set TENSORRT_INCLUDE_DIR)")
fi

# Run the compiles, JOBS at a time.
pids=()
for i in "${!jobs_list[@]}"; do
    cmd=${jobs_list[$i]#*|}
    ( eval "$cmd" >"$OUT/$i.log" 2>&1; echo $? >"$OUT/$i.rc" ) &
    pids+=($!)
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do
        sleep 0.2
    done
done
wait

compiled=0
failed=0
for i in "${!jobs_list[@]}"; do
    name=${jobs_list[$i]%%|*}
    rc=$(cat "$OUT/$i.rc" 2>/dev/null || echo 1)
    if [ "$rc" = "0" ]; then
        echo "compiled: $name"
        compiled=$((compiled + 1))
    else
        echo "FAILED: $name"
        echo "  command: ${jobs_list[$i]#*|}"
        sed 's/^/  /' "$OUT/$i.log"
        failed=$((failed + 1))
    fi
done
for s in "${skipped[@]+"${skipped[@]}"}"; do
    echo "$s"
done
echo "compile_check: $compiled compiled, $failed failed, ${#skipped[@]} group(s) skipped"
[ "$failed" -eq 0 ]

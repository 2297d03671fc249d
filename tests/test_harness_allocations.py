"""Issue 23 defect 3: `enqueue` may not allocate. The plugin harness (plugins/tests/pluginHarness.cpp) counts the
calls of the resource context's IGpuAllocator (how FusedMixer allocated its transposed taps before the fix) and, on
the CPU emulation, cudaMalloc/cudaMallocAsync (plugins/tests/emulatedCudaMemory.cpp). The negative control puts
each kind of allocation back into a copy of FusedMixer's enqueue and the harness must fail, naming it; the normal
harness passes in the dry run (tests/test_gpu_check.py) and CTest."""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess

import pytest
from plugin_build import PLUGINS, emulation, trt_headers

from msar_export import kernels as K


def test_emulation_counts_direct_cuda_allocations():
    """The counter the harness reads sees cudaMalloc and cudaMallocAsync (a check that cannot see them passes
    whatever enqueue does)."""
    lib = ctypes.CDLL(str(emulation().path))
    count = lib.msarEmuCudaAllocations
    before = count()
    p = ctypes.c_void_p()
    assert lib.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(64)) == 0 and p.value
    assert lib.cudaFree(p) == 0
    assert lib.cudaMallocAsync(ctypes.byref(p), ctypes.c_size_t(64), None) == 0 and p.value
    assert lib.cudaFreeAsync(p, None) == 0
    assert count() - before == 2


# The old defect, FusedMixer's taps from the context's allocator on the first enqueue (freed by the context's
# destructor), or a direct per-enqueue CUDA scratch; MSAR_PUT_BACK picks one, so one build serves both.
PUT_BACK_MEMBERS = """
    nvinfer1::IPluginV3* attachToContext(nvinfer1::IPluginResourceContext* context) noexcept override
    {
        auto* plugin = static_cast<FusedMixerPlugin*>(clone());
        plugin->mAllocator = context != nullptr ? context->getGpuAllocator() : nullptr;
        return plugin;
    }
    ~FusedMixerPlugin() override
    {
        if (mTaps != nullptr)
        {
            mAllocator->deallocateAsync(mTaps, nullptr);
        }
    }
    nvinfer1::IGpuAllocator* mAllocator{nullptr};
    mutable void* mTaps{nullptr};
};"""

PUT_BACK_ENQUEUE = """    char const* putBack = std::getenv("MSAR_PUT_BACK");
    if (putBack != nullptr && std::string(putBack) == "allocator" && mAllocator != nullptr && mTaps == nullptr)
    {
        mTaps = mAllocator->allocateAsync(4096, 256, 0, stream);
    }
    if (putBack != nullptr && std::string(putBack) == "cuda")
    {
        void* scratch = nullptr;
        static_cast<void>(cudaMallocAsync(&scratch, 4096, stream));
        static_cast<void>(cudaFreeAsync(scratch, stream));
    }
    return dispatchDType(type,"""


def put_back(src) -> None:
    folder = src / "msarFusedMixerPlugin"
    header, body = folder / "fusedMixerPlugin.h", folder / "fusedMixerPlugin.cpp"
    h, b = header.read_text(), body.read_text()
    end_of_class = "        cudaStream_t stream) const;\n};"
    assert h.count(end_of_class) == 1 and b.count("    return dispatchDType(type,") == 1
    header.write_text(h.replace(end_of_class, "        cudaStream_t stream) const;\n" + PUT_BACK_MEMBERS))
    body.write_text("#include <cstdlib>\n#include <string>\n" + b.replace("    return dispatchDType(type,",
                                                                          PUT_BACK_ENQUEUE))


@pytest.fixture(scope="module")
def put_back_harness(tmp_path_factory):
    if trt_headers() is None:
        pytest.skip("set TENSORRT_INCLUDE_DIR to the TensorRT include/ folder: the harness drives the plugin glue")
    reason = K.tools_unavailable()
    if reason:
        pytest.skip(f"cannot build plugins/ through CMake: {reason}")
    tmp = tmp_path_factory.mktemp("put_back")
    src = tmp / "plugins"
    shutil.copytree(PLUGINS, src)
    put_back(src)
    build = K.CMakeBuild(src, tensorrt_include=trt_headers(), defines={"MSAR_CUDA": "OFF"}, build_dir=tmp / "build")
    if not build.has_target("pluginHarness"):
        pytest.skip(f"pluginHarness is not built here: {build.configure()}")
    return build.built("pluginHarness")


@pytest.mark.slow
@pytest.mark.parametrize("kind, message", [
    ("allocator", "enqueue allocated through the resource context's IGpuAllocator: 3 allocate/allocateAsync and "
                  "3 deallocate/deallocateAsync calls"),
    ("cuda", "enqueue called cudaMalloc/cudaMallocAsync 15 times"),  # 5 shapes x 3 contexts
])
def test_harness_fails_when_enqueue_allocates(put_back_harness, kind, message):
    """Negative control for defect 3: plugins/ copied with an allocation put back into FusedMixer's enqueue, the
    emulation harness built (a few minutes of g++). Every output check before it passes (the patch breaks nothing
    else); the allocation check fails with a line naming the allocation, on the first op and dtype it sees."""
    r = subprocess.run([str(put_back_harness)], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "MSAR_PUT_BACK": kind})
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    failed = [line for line in r.stdout.splitlines() if line.startswith("FAILED")]
    assert failed[0] == f"FAILED: FusedMixer float32: {message}", r.stdout[-2000:]
    assert len(failed) == 2 and re.fullmatch(r"FAILED line \d+: allocator\.allocations == 0 .*", failed[1]), failed

/*
 * A tiny CUDA-on-CPU shim, for tests only: compiles the msar kernel sources
 * (.cu) with g++ and runs them with one std::thread per CUDA thread, so the
 * real kernel code - tiling, reduce-scatter, online softmax, indexing - can
 * be checked against the eager PyTorch mixer on a machine without a GPU.
 *
 * What it emulates: threadIdx/blockIdx/blockDim/gridDim (x only), dynamic
 * shared memory (MSAR_DYNAMIC_SHARED, one block at a time, NaN-poisoned), __syncthreads, __syncwarp and
 * __shfl_xor_sync (lockstep through per-warp barriers), vector loads and
 * stores (loadVec/storeVec copy the bytes) and the device attributes a
 * launcher plans with (deviceAttribute). Blocks of a launch run one after another; launches from
 * different host threads may run at once (each block's dims and shared memory are its threads' own),
 * as two TensorRT execution contexts on two threads would;
 * "device pointers" are host pointers. Not emulated: timing, memory ordering
 * subtleties, anything the kernels do not use. A misaligned vector access
 * is recorded and the launch reports cudaErrorMisalignedAddress, as a GPU
 * would.
 *
 * Usage: force-included before each .cu file compiled as C++ (-include; the
 * msar_emulation target of plugins/tests/CMakeLists.txt).
 */
#ifndef MSAR_CUDA_HOST_EMULATION_H
#define MSAR_CUDA_HOST_EMULATION_H

#ifndef MSAR_HOST_EMULATION
#define MSAR_HOST_EMULATION 1
#endif

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "../common/msarKernelTypes.h"

#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#define __launch_bounds__(...)

namespace msar_emu
{

struct Dim
{
    unsigned x{1}, y{1}, z{1};
};

struct Warp
{
    explicit Warp(int lanes)
        : bar(lanes)
    {
    }
    std::barrier<> bar;
    float buf[32]{};
};

struct Block
{
    explicit Block(int threads)
        : bar(threads)
    {
        for (int w = 0; w < (threads + 31) / 32; ++w)
        {
            int const lanes = threads - 32 * w < 32 ? threads - 32 * w : 32;
            warps.emplace_back(std::make_unique<Warp>(lanes));
        }
    }
    std::barrier<> bar;
    std::vector<std::unique_ptr<Warp>> warps;
};

inline thread_local Dim tThreadIdx;
inline thread_local Dim tBlockIdx;
inline thread_local Dim tBlockDim;
inline thread_local Dim tGridDim;
inline thread_local Block* tBlock = nullptr;
inline thread_local std::vector<float>* tShared = nullptr;

//! Dynamic shared memory of the running block (each emulated thread points at its block's).
inline std::vector<float>& sharedMemory()
{
    return *tShared;
}

inline int envOr(char const* name, int fallback)
{
    char const* env = std::getenv(name);
    return env != nullptr && std::atoi(env) > 0 ? std::atoi(env) : fallback;
}

/*!
 * What the launchers ask of the device: an H200 unless MSAR_EMU_SM_COUNT says
 * how many SMs (tests set 1 to keep a small shape off the split-source path)
 * or MSAR_EMU_SMEM_OPTIN how many bytes of shared memory a block may opt in to
 * (tests set a few KiB so that a small shape takes the warp kernel, as one
 * token's z over 227 KiB does on an H200).
 */
inline int deviceAttribute(cudaDeviceAttr attr, int fallback)
{
    switch (attr)
    {
    case cudaDevAttrMultiProcessorCount: return envOr("MSAR_EMU_SM_COUNT", 132);
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: return envOr("MSAR_EMU_SMEM_OPTIN", 227 * 1024);
    default: return fallback;
    }
}

//! cudaFuncSetAttribute calls the kernels would have made (msarKernelCommon.cuh: setMaxDynamicShared).
inline std::atomic<int> gFuncAttributeCalls{0};

//! A misaligned vector access, as the GPU would fault on it; the launch then reports cudaErrorMisalignedAddress.
inline std::atomic<bool> gMisaligned{false};

inline void checkAligned(void const* p, size_t bytes)
{
    if (reinterpret_cast<uintptr_t>(p) % bytes != 0)
    {
        gMisaligned = true;
    }
}

inline int32_t takeFault()
{
    return gMisaligned.exchange(false) ? MSAR_STATUS_CUDA_ERROR + static_cast<int32_t>(cudaErrorMisalignedAddress)
                                      : 0;
}

inline Warp& currentWarp()
{
    return *tBlock->warps[tThreadIdx.x / 32];
}

template <typename... P>
struct Launch
{
    void (*kernel)(P...);
    unsigned grid;
    unsigned block;
    size_t shmem;

    template <typename... A>
    void operator()(A&&... args) const
    {
        for (unsigned b = 0; b < grid; ++b)
        {
            // Fresh, poisoned shared memory per block: a read before a write shows up as NaN.
            std::vector<float> shared(shmem / sizeof(float) + 1, std::nanf(""));
            Block blk(static_cast<int>(block));
            std::vector<std::thread> threads;
            threads.reserve(block);
            for (unsigned t = 0; t < block; ++t)
            {
                threads.emplace_back([&, b, t]() {
                    tThreadIdx = Dim{t, 0, 0};
                    tBlockIdx = Dim{b, 0, 0};
                    tBlockDim = Dim{block, 1, 1};
                    tGridDim = Dim{grid, 1, 1};
                    tBlock = &blk;
                    tShared = &shared;
                    kernel(args...);
                    // A thread that returns early leaves its barriers.
                    currentWarp().bar.arrive_and_drop();
                    blk.bar.arrive_and_drop();
                });
            }
            for (auto& th : threads)
            {
                th.join();
            }
        }
    }
};

template <typename... P>
Launch<P...> launch(void (*kernel)(P...), unsigned grid, unsigned block, size_t shmem)
{
    return Launch<P...>{kernel, grid, block, shmem};
}

} // namespace msar_emu

//! For the tests (ctypes): how many times the launchers opted a kernel in to more shared memory. Weak: every
//! kernel source includes this header, the library keeps one definition.
extern "C" __attribute__((weak, visibility("default"))) int msarEmuFuncAttributeCalls()
{
    return msar_emu::gFuncAttributeCalls.load();
}

#define threadIdx (::msar_emu::tThreadIdx)
#define blockIdx (::msar_emu::tBlockIdx)
#define blockDim (::msar_emu::tBlockDim)
#define gridDim (::msar_emu::tGridDim)

inline void __syncthreads()
{
    msar_emu::tBlock->bar.arrive_and_wait();
}

inline void __syncwarp(unsigned = 0xffffffffu)
{
    msar_emu::currentWarp().bar.arrive_and_wait();
}

inline float __shfl_xor_sync(unsigned, float v, int laneMask)
{
    auto& w = msar_emu::currentWarp();
    unsigned const lane = msar_emu::tThreadIdx.x % 32;
    w.buf[lane] = v;
    w.bar.arrive_and_wait();
    float const r = w.buf[lane ^ static_cast<unsigned>(laneMask)];
    w.bar.arrive_and_wait();
    return r;
}

inline float rsqrtf(float x)
{
    return 1.0F / std::sqrt(x);
}

#endif // MSAR_CUDA_HOST_EMULATION_H

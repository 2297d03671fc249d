/*
 * Device helpers shared by the msar kernels: dtype conversion and warp
 * reductions. Included by .cu files only.
 */
#ifndef MSAR_KERNEL_COMMON_CUH
#define MSAR_KERNEL_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include <mutex>
#include <set>
#include <utility>

#include "msarKernelTypes.h"

namespace msar
{
namespace kernels
{

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarpSize = 32;

__device__ __forceinline__ float toFloat(float v)
{
    return v;
}

__device__ __forceinline__ float toFloat(__half v)
{
    return __half2float(v);
}

__device__ __forceinline__ float toFloat(__nv_bfloat16 v)
{
    return __bfloat162float(v);
}

template <typename T>
__device__ __forceinline__ T fromFloat(float v);

template <>
__device__ __forceinline__ float fromFloat<float>(float v)
{
    return v;
}

template <>
__device__ __forceinline__ __half fromFloat<__half>(float v)
{
    return __float2half_rn(v);
}

template <>
__device__ __forceinline__ __nv_bfloat16 fromFloat<__nv_bfloat16>(float v)
{
    return __float2bfloat16_rn(v);
}

template <int N>
__device__ __forceinline__ void zeroFill(float (&a)[N])
{
#pragma unroll
    for (int k = 0; k < N; ++k)
    {
        a[k] = 0.F;
    }
}

//! Sum over the warp; every lane gets the total.
__device__ __forceinline__ float warpAllReduceSum(float v)
{
#pragma unroll
    for (int off = kWarpSize / 2; off > 0; off >>= 1)
    {
        v += __shfl_xor_sync(kFullMask, v, off);
    }
    return v;
}

__device__ __forceinline__ float warpAllReduceMax(float v)
{
#pragma unroll
    for (int off = kWarpSize / 2; off > 0; off >>= 1)
    {
        v = fmaxf(v, __shfl_xor_sync(kFullMask, v, off));
    }
    return v;
}

/*!
 * Reduce-scatter of S values per lane over the warp (S a multiple of 32):
 * each step halves the values a lane holds, exchanging the half it gives away
 * with its partner (S/2 + S/4 + ... shuffles instead of 5*S for a full
 * all-reduce). Afterwards lane L holds the warp sums of the original indices
 * L*(S/32) .. L*(S/32) + S/32 - 1 in v[0 .. S/32).
 */
template <int S, int OFF>
struct WarpReduceScatter
{
    static __device__ __forceinline__ void run(float* v, int lane)
    {
        constexpr int H = S / 2;
        bool const upper = (lane & OFF) != 0;
#pragma unroll
        for (int k = 0; k < H; ++k)
        {
            float const give = upper ? v[k] : v[k + H];
            float const keep = upper ? v[k + H] : v[k];
            v[k] = keep + __shfl_xor_sync(kFullMask, give, OFF);
        }
        WarpReduceScatter<H, OFF / 2>::run(v, lane);
    }
};

template <int S>
struct WarpReduceScatter<S, 0>
{
    static __device__ __forceinline__ void run(float*, int) {}
};

/*!
 * Element offset of token t of sequence b in a [B, T, w] tensor. Always 64-bit:
 * B*T*w passes 2^31 at real prefill shapes (e.g. 64 x 8192 x 8192), and a
 * 32-bit product would wrap silently. __host__ so plugins/tests/indexTest.cpp
 * checks it without allocating such a tensor.
 */
__host__ __device__ __forceinline__ int64_t tokenOffset(int64_t b, int64_t t, int64_t seq, int64_t w)
{
    return (b * seq + t) * w;
}

//! An unsigned type of N bytes, for one vector memory instruction.
template <int N>
struct RawOf;
template <>
struct RawOf<16>
{
    using type = uint4;
};
template <>
struct RawOf<8>
{
    using type = uint2;
};
template <>
struct RawOf<4>
{
    using type = unsigned int;
};
template <>
struct RawOf<2>
{
    using type = unsigned short;
};

/*!
 * V consecutive elements through one V*sizeof(T)-byte load (p aligned to it,
 * which the launchers check). The emulation copies bytes instead (a type-punned
 * host load would break g++'s aliasing rules) and records a misaligned p.
 */
template <typename T, int V>
__device__ __forceinline__ void loadVec(T const* p, float (&out)[V])
{
    constexpr int N = V * static_cast<int>(sizeof(T));
    alignas(N) T e[V];
#if defined(MSAR_HOST_EMULATION)
    ::msar_emu::checkAligned(p, N);
    memcpy(e, p, N);
#else
    *reinterpret_cast<typename RawOf<N>::type*>(e) = *reinterpret_cast<typename RawOf<N>::type const*>(p);
#endif
#pragma unroll
    for (int k = 0; k < V; ++k)
    {
        out[k] = toFloat(e[k]);
    }
}

template <typename T, int V>
__device__ __forceinline__ void storeVec(T* p, float const (&in)[V])
{
    constexpr int N = V * static_cast<int>(sizeof(T));
    alignas(N) T e[V];
#pragma unroll
    for (int k = 0; k < V; ++k)
    {
        e[k] = fromFloat<T>(in[k]);
    }
#if defined(MSAR_HOST_EMULATION)
    ::msar_emu::checkAligned(p, N);
    memcpy(p, e, N);
#else
    *reinterpret_cast<typename RawOf<N>::type*>(p) = *reinterpret_cast<typename RawOf<N>::type const*>(e);
#endif
}

//! V float32 values in loads of at most 16 bytes (p aligned to min(16, 4*V) bytes).
template <int V>
__device__ __forceinline__ void loadFloats(float const* p, float (&out)[V])
{
    if constexpr (V % 4 == 0)
    {
#pragma unroll
        for (int k = 0; k < V; k += 4)
        {
            float q[4];
            loadVec<float, 4>(p + k, q);
#pragma unroll
            for (int j = 0; j < 4; ++j)
            {
                out[k + j] = q[j];
            }
        }
    }
    else
    {
        loadVec<float, V>(p, out);
    }
}

//! True when every pointer is aligned to `bytes` (vector loads need it).
inline bool alignedTo(void const* const* ptrs, int32_t count, size_t bytes)
{
    for (int32_t i = 0; i < count; ++i)
    {
        if (reinterpret_cast<uintptr_t>(ptrs[i]) % bytes != 0)
        {
            return false;
        }
    }
    return true;
}

inline int32_t cudaStatus(cudaError_t e)
{
    return e == cudaSuccess ? MSAR_STATUS_OK : MSAR_STATUS_CUDA_ERROR + static_cast<int32_t>(e);
}

/*
 * Kernel launches and dynamic shared memory go through these macros so that
 * plugins/tests/cudaHostEmulation.h can run the same kernel source on the CPU
 * (MSAR_HOST_EMULATION, g++):
 *   MSAR_DYNAMIC_SHARED(float, smem);
 *   MSAR_LAUNCH(kernel, grid, block, sharedBytes, stream)(args...);
 */
/*
 * What a launcher asks of the device (SM count, opt-in shared memory per block)
 * goes through these, so the emulation can answer for a chosen GPU shape
 * (cudaHostEmulation.h: MSAR_EMU_SM_COUNT).
 */
#if defined(MSAR_HOST_EMULATION)
#define MSAR_DYNAMIC_SHARED(type, name) type* name = reinterpret_cast<type*>(::msar_emu::sharedMemory().data())
#define MSAR_LAUNCH(kernel, grid, block, shmem, stream)                                                             \
    (static_cast<void>(stream), ::msar_emu::launch(kernel, grid, block, shmem))
inline int32_t launchStatus()
{
    return ::msar_emu::takeFault();
}
inline int deviceAttribute(cudaDeviceAttr attr, int fallback)
{
    return ::msar_emu::deviceAttribute(attr, fallback);
}
inline int currentDevice()
{
    return 0;
}
template <typename K>
inline int32_t setMaxDynamicShared(K, int)
{
    ++::msar_emu::gFuncAttributeCalls; // counted: tests check it happens once per kernel and device
    return MSAR_STATUS_OK;
}
#else
#define MSAR_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#define MSAR_LAUNCH(kernel, grid, block, shmem, stream) kernel<<<grid, block, shmem, stream>>>
inline int32_t launchStatus()
{
    return cudaStatus(cudaGetLastError());
}
inline int deviceAttribute(cudaDeviceAttr attr, int fallback)
{
    int dev = 0;
    int value = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&value, attr, dev) != cudaSuccess)
    {
        return fallback;
    }
    return value;
}
inline int currentDevice()
{
    int dev = 0;
    return cudaGetDevice(&dev) == cudaSuccess ? dev : -1;
}
template <typename K>
inline int32_t setMaxDynamicShared(K kernel, int bytes)
{
    return cudaStatus(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}
#endif

/*!
 * Above 48 KiB of dynamic shared memory a kernel must opt in. cudaFuncSetAttribute is process-wide and not
 * stream-ordered, so it is done once per kernel and device, under a lock, to the device's whole opt-in limit:
 * set per launch to the launch's size, two threads with different d could lower the limit under each other's
 * launch ("too much shared memory"), and a call during CUDA-graph capture is avoidable work. Launches of up to
 * the limit then need nothing more; over it they are refused here.
 */
template <typename K>
inline int32_t allowDynamicShared(K kernel, size_t bytes)
{
    if (bytes <= 48 * 1024)
    {
        return MSAR_STATUS_OK;
    }
    int const limit = deviceAttribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, 48 * 1024);
    if (bytes > static_cast<size_t>(limit))
    {
        return MSAR_STATUS_UNSUPPORTED;
    }
    static std::mutex lock;
    static std::set<std::pair<void const*, int>> done; // (kernel, device) pairs already opted in
    std::pair<void const*, int> const key{reinterpret_cast<void const*>(kernel), currentDevice()};
    std::lock_guard<std::mutex> guard(lock);
    if (done.count(key) != 0)
    {
        return MSAR_STATUS_OK;
    }
    int32_t const st = setMaxDynamicShared(kernel, limit);
    if (st == MSAR_STATUS_OK)
    {
        done.insert(key);
    }
    return st;
}

} // namespace kernels
} // namespace msar

#endif // MSAR_KERNEL_COMMON_CUH

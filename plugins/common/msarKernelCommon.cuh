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
#if defined(MSAR_HOST_EMULATION)
#define MSAR_DYNAMIC_SHARED(type, name) type* name = reinterpret_cast<type*>(::msar_emu::sharedMemory().data())
#define MSAR_LAUNCH(kernel, grid, block, shmem, stream)                                                             \
    (static_cast<void>(stream), ::msar_emu::launch(kernel, grid, block, shmem))
inline int32_t launchStatus()
{
    return MSAR_STATUS_OK;
}
#else
#define MSAR_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#define MSAR_LAUNCH(kernel, grid, block, shmem, stream) kernel<<<grid, block, shmem, stream>>>
inline int32_t launchStatus()
{
    return cudaStatus(cudaGetLastError());
}
#endif

} // namespace kernels
} // namespace msar

#endif // MSAR_KERNEL_COMMON_CUH

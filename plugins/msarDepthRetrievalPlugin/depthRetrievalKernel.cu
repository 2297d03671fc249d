/*
 * msar::DepthRetrieval kernel: per-stream softmax retrieval over depth from
 * already expanded views (the decode path, and attnres prefill).
 *
 * One block per row (b, t, r) of d channels, two passes over the n views of
 * that row: pass 1 reduces sum(v^2) and q.v per view (warp shuffles, one
 * partial per warp in shared memory, a single __syncthreads), the softmax
 * over the n scores runs in one warp, pass 2 writes z = sum_i alpha_i v_i
 * (the second read of the row's views is an L1/L2 hit). float32 inside.
 */
#include "depthRetrievalKernel.h"

#include "../common/msarKernelCommon.cuh"

#include <math.h>

namespace msar
{
namespace kernels
{
namespace
{

struct ViewTable
{
    void const* ptr[MSAR_MAX_SOURCES];
};

template <typename T>
struct RetrievalParams
{
    T const* query; // [m, d]
    T* out;         // [rows, d]
    int64_t rows;   // B * T * m
    int64_t m;
    int64_t d;
    int32_t n;
    float eps;
};

template <typename T>
__global__ void depthRetrievalKernel(RetrievalParams<T> const p, ViewTable const src)
{
    MSAR_DYNAMIC_SHARED(float, smem);
    int const lane = threadIdx.x % kWarpSize;
    int const warp = threadIdx.x / kWarpSize;
    int const nWarps = blockDim.x / kWarpSize;
    float* partial = smem;                  // [nWarps][n][2]: sum v^2, q.v
    float* weight = smem + nWarps * p.n * 2; // [n]: scores, then softmax weights

    for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x)
    {
        T const* q = p.query + (row % p.m) * p.d;
        int64_t const base = row * p.d;

        // pass 1: per-view partial sums
        for (int i = 0; i < p.n; ++i)
        {
            T const* v = static_cast<T const*>(src.ptr[i]) + base;
            float ss = 0.F;
            float qv = 0.F;
            for (int64_t c = threadIdx.x; c < p.d; c += blockDim.x)
            {
                float const x = toFloat(v[c]);
                ss = fmaf(x, x, ss);
                qv = fmaf(toFloat(q[c]), x, qv);
            }
            ss = warpAllReduceSum(ss);
            qv = warpAllReduceSum(qv);
            if (lane == 0)
            {
                partial[(warp * p.n + i) * 2] = ss;
                partial[(warp * p.n + i) * 2 + 1] = qv;
            }
        }
        __syncthreads();
        for (int i = threadIdx.x; i < p.n; i += blockDim.x)
        {
            float ss = 0.F;
            float qv = 0.F;
            for (int w = 0; w < nWarps; ++w)
            {
                ss += partial[(w * p.n + i) * 2];
                qv += partial[(w * p.n + i) * 2 + 1];
            }
            weight[i] = qv * rsqrtf(ss / static_cast<float>(p.d) + p.eps);
        }
        __syncthreads();

        // softmax over the n sources, in warp 0
        if (warp == 0)
        {
            float mx = -INFINITY;
            for (int i = lane; i < p.n; i += kWarpSize)
            {
                mx = fmaxf(mx, weight[i]);
            }
            mx = warpAllReduceMax(mx);
            float sum = 0.F;
            for (int i = lane; i < p.n; i += kWarpSize)
            {
                float const e = expf(weight[i] - mx);
                weight[i] = e;
                sum += e;
            }
            float const inv = 1.F / warpAllReduceSum(sum);
            for (int i = lane; i < p.n; i += kWarpSize)
            {
                weight[i] *= inv;
            }
        }
        __syncthreads();

        // pass 2: weighted sum
        for (int64_t c = threadIdx.x; c < p.d; c += blockDim.x)
        {
            float acc = 0.F;
            for (int i = 0; i < p.n; ++i)
            {
                acc = fmaf(weight[i], toFloat(static_cast<T const*>(src.ptr[i])[base + c]), acc);
            }
            p.out[base + c] = fromFloat<T>(acc);
        }
        __syncthreads(); // shared memory is reused by the next row
    }
}

} // namespace
} // namespace kernels

template <typename T>
int32_t depthRetrievalForward(MsarDepthRetrievalArgs const& a, cudaStream_t stream)
{
    using namespace kernels;
    int32_t const n = a.n_sources;
    if (n < 1 || n > MSAR_MAX_SOURCES || a.views == nullptr || a.batch < 0 || a.seq < 0 || a.n_streams < 1
        || a.d < 1 || !(a.eps > 0.F))
    {
        return MSAR_STATUS_INVALID_ARGUMENT;
    }
    int64_t const rows = a.batch * a.seq * a.n_streams;
    if (rows == 0)
    {
        return MSAR_STATUS_OK;
    }
    if (a.query == nullptr || a.out == nullptr)
    {
        return MSAR_STATUS_INVALID_ARGUMENT;
    }
    ViewTable src{};
    for (int32_t i = 0; i < n; ++i)
    {
        if (a.views[i] == nullptr)
        {
            return MSAR_STATUS_INVALID_ARGUMENT;
        }
        src.ptr[i] = a.views[i];
    }
    RetrievalParams<T> p{};
    p.query = static_cast<T const*>(a.query);
    p.out = static_cast<T*>(a.out);
    p.rows = rows;
    p.m = a.n_streams;
    p.d = a.d;
    p.n = n;
    p.eps = a.eps;

    // About 8 channels per thread, between one warp and 256 threads.
    int64_t threads = (a.d / 8 + kWarpSize - 1) / kWarpSize * kWarpSize;
    threads = threads < kWarpSize ? kWarpSize : (threads > 256 ? 256 : threads);
    int64_t const blocks = rows < (1 << 20) ? rows : (1 << 20);
    size_t const smemBytes = (static_cast<size_t>(threads / kWarpSize) * n * 2 + n) * sizeof(float);
    auto kernel = depthRetrievalKernel<T>;
    MSAR_LAUNCH(kernel, static_cast<unsigned>(blocks), static_cast<unsigned>(threads), smemBytes, stream)(p, src);
    return launchStatus();
}

template int32_t depthRetrievalForward<float>(MsarDepthRetrievalArgs const&, cudaStream_t);
template int32_t depthRetrievalForward<__half>(MsarDepthRetrievalArgs const&, cudaStream_t);
template int32_t depthRetrievalForward<__nv_bfloat16>(MsarDepthRetrievalArgs const&, cudaStream_t);

} // namespace msar

extern "C" int32_t msarDepthRetrievalForward(int32_t dtype, MsarDepthRetrievalArgs const* args, cudaStream_t stream)
{
    if (args == nullptr)
    {
        return MSAR_STATUS_INVALID_ARGUMENT;
    }
    switch (dtype)
    {
    case MSAR_DTYPE_FLOAT32: return msar::depthRetrievalForward<float>(*args, stream);
    case MSAR_DTYPE_FLOAT16: return msar::depthRetrievalForward<__half>(*args, stream);
    case MSAR_DTYPE_BFLOAT16: return msar::depthRetrievalForward<__nv_bfloat16>(*args, stream);
    default: return MSAR_STATUS_UNSUPPORTED;
    }
}

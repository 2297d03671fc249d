/*
 * msar::DepthRetrieval kernel: per-stream softmax retrieval over depth from
 * already expanded views (the decode path, attnres prefill, and the
 * cached-view prefill that scripts/gpu_check.py times against FusedMixer).
 *
 * Work per row (b, t, r) of d channels, float32 inside:
 *   pass 1: the block's warps split the n views, each warp reduces sum(v^2)
 *           and q.v of its views over all d with 16-byte loads (V channels per
 *           lane) and writes the score; no cross-warp partials;
 *   softmax over the n scores in warp 0;
 *   pass 2: z = sum_i alpha_i v_i over the block's slice of the channels.
 * A decode step has only B*m rows (4 at B=1), so each row is also split into
 * up to `slices` channel slices, one block of up to 1024 threads each: every slice's block repeats
 * pass 1 over the whole row (an L2 hit after the first, since the kernel has
 * no workspace to share the scores) and writes only its slice. Prefill rows
 * are plenty: one slice, blocks stride over rows.
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

constexpr int kRetrievalThreads = 256;
//! Decode rows are few and every slice's block walks the whole row in pass 1: 32 warps keep enough
//! 16-byte loads in flight to cover L2 latency on one SM (docs/kernels.md).
constexpr int kDecodeThreads = 1024;

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
    int64_t chunks;   // d / V
    int64_t slices;   // channel slices per row
    int32_t n;
    float eps;
};

/*!
 * QS: the row's query is staged in shared memory as float32 once per row, so
 * that pass 1 spends no load or conversion on it per view (about a quarter of
 * pass 1's instructions); only where d floats fit the default 48 KiB.
 */
template <typename T, int V, bool QS>
__global__ void __launch_bounds__(kDecodeThreads) depthRetrievalKernel(RetrievalParams<T> const p, ViewTable const src)
{
    MSAR_DYNAMIC_SHARED(float, smem);
    float* qf = smem;                     // [d] if QS: the query of this row's stream
    float* weight = smem + (QS ? p.d : 0); // [n]: scores, then softmax weights
    int const lane = threadIdx.x % kWarpSize;
    int const warp = threadIdx.x / kWarpSize;
    int const nWarps = blockDim.x / kWarpSize;
    int64_t const perSlice = (p.chunks + p.slices - 1) / p.slices;

    for (int64_t job = blockIdx.x; job < p.rows * p.slices; job += gridDim.x)
    {
        int64_t const row = job / p.slices;
        int64_t const slice = job - row * p.slices;
        T const* q = p.query + (row % p.m) * p.d;
        int64_t const base = row * p.d;
        if constexpr (QS)
        {
            for (int64_t ch = threadIdx.x; ch < p.chunks; ch += blockDim.x)
            {
                float w[V];
                loadVec<T, V>(q + ch * V, w);
#pragma unroll
                for (int e = 0; e < V; ++e)
                {
                    qf[ch * V + e] = w[e];
                }
            }
            __syncthreads();
        }

        for (int i = warp; i < p.n; i += nWarps)
        {
            T const* v = static_cast<T const*>(src.ptr[i]) + base;
            float ss = 0.F;
            float qv = 0.F;
            for (int64_t ch = lane; ch < p.chunks; ch += kWarpSize)
            {
                float x[V];
                float w[V];
                loadVec<T, V>(v + ch * V, x);
                if constexpr (QS)
                {
                    loadFloats<V>(qf + ch * V, w);
                }
                else
                {
                    loadVec<T, V>(q + ch * V, w);
                }
#pragma unroll
                for (int e = 0; e < V; ++e)
                {
                    ss = fmaf(x[e], x[e], ss);
                    qv = fmaf(w[e], x[e], qv);
                }
            }
            ss = warpAllReduceSum(ss);
            qv = warpAllReduceSum(qv);
            if (lane == 0)
            {
                weight[i] = qv * rsqrtf(ss / static_cast<float>(p.d) + p.eps);
            }
        }
        __syncthreads();
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

        int64_t const end = (slice + 1) * perSlice < p.chunks ? (slice + 1) * perSlice : p.chunks;
        for (int64_t ch = slice * perSlice + threadIdx.x; ch < end; ch += blockDim.x)
        {
            float acc[V];
            zeroFill(acc);
            for (int i = 0; i < p.n; ++i)
            {
                float x[V];
                loadVec<T, V>(static_cast<T const*>(src.ptr[i]) + base + ch * V, x);
#pragma unroll
                for (int e = 0; e < V; ++e)
                {
                    acc[e] = fmaf(weight[i], x[e], acc[e]);
                }
            }
            storeVec<T, V>(p.out + base + ch * V, acc);
        }
        __syncthreads(); // the weights are rewritten by the next job
    }
}

template <typename T, int V>
int32_t launchRetrieval(RetrievalParams<T> p, ViewTable const& src, cudaStream_t stream)
{
    p.chunks = p.d / V;
    // Enough blocks for twice the SMs when rows are few, but at least 32 chunks per slice.
    int64_t const target = 2 * static_cast<int64_t>(deviceAttribute(cudaDevAttrMultiProcessorCount, 132));
    int64_t slices = p.rows < target ? (target + p.rows - 1) / p.rows : 1;
    int64_t const maxSlices = p.chunks / kWarpSize > 1 ? p.chunks / kWarpSize : 1;
    p.slices = slices < maxSlices ? slices : maxSlices;
    int64_t const jobs = p.rows * p.slices;
    int64_t const blocks = jobs < (1 << 20) ? jobs : (1 << 20);
    int64_t const maxThreads = p.slices > 1 ? kDecodeThreads : kRetrievalThreads;
    int64_t threads = (p.chunks + kWarpSize - 1) / kWarpSize * kWarpSize;
    threads = threads > maxThreads ? maxThreads : threads;
    size_t const staged = static_cast<size_t>(p.d + p.n) * sizeof(float);
    if (staged <= 48 * 1024)
    {
        auto kernel = depthRetrievalKernel<T, V, true>;
        MSAR_LAUNCH(kernel, static_cast<unsigned>(blocks), static_cast<unsigned>(threads), staged, stream)(p, src);
        return launchStatus();
    }
    auto kernel = depthRetrievalKernel<T, V, false>;
    MSAR_LAUNCH(kernel, static_cast<unsigned>(blocks), static_cast<unsigned>(threads), p.n * sizeof(float), stream)(
        p, src);
    return launchStatus();
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

    constexpr int V = 16 / static_cast<int>(sizeof(T));
    void const* vecPtrs[] = {a.query, a.out};
    if (a.d % V == 0 && alignedTo(vecPtrs, 2, 16) && alignedTo(a.views, n, 16))
    {
        return launchRetrieval<T, V>(p, src, stream);
    }
    return launchRetrieval<T, 1>(p, src, stream);
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

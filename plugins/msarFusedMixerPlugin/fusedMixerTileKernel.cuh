/*
 * The tile kernel of msar::FusedMixer. Included by fusedMixerKernel.cu only.
 *
 * A block owns TS consecutive tokens of one sequence and every channel: its
 * threads split d into chunks of V channels, each read with one vector load
 * of up to 16 bytes (fusedMixerPlan.h trades width for tokens per block;
 * V = 1 when d or a pointer is not aligned). Sources are read from HBM once:
 * the retrieved streams z^(r) of the tile stay in shared memory
 * ([TS][m][d] float32) while an online softmax walks the sources, and the
 * gates are applied once at the end. Per source:
 *
 *   1. every thread computes its chunks' views (conv taps, in T, loaded once
 *      per tile and used for the TS tokens) and partial sum(v^2), q.v per
 *      (stream, token); one warp reduce-scatter, one row per warp in shared
 *      memory;
 *   2. warp 0 finishes the scores and the online softmax (running max and
 *      denominator per (stream, token)) and publishes e = exp(s - max) and the
 *      rescale of the old z;
 *   3. every thread recomputes its chunks' views (the rows are L1/L2 hits:
 *      the block read them in step 1) and updates z = z * rescale + e * v.
 *
 * Recomputing the views instead of keeping them: they would cost MB*TS*V
 * floats per chunk per thread across the barrier, or another [TS][m][d] of
 * shared memory, which halves TS (and tap reuse, the binding limit in
 * docs/kernels.md) or does not fit at d = 4096.
 *
 * When B*T gives fewer tiles than twice the SMs (decode-sized prefill), each
 * tile's sources are split into ranges handled by separate blocks that write
 * their unnormalised z and (max, denominator) to the workspace; mergeKernel
 * combines them by log-sum-exp and applies the gates.
 */
#ifndef MSAR_FUSED_MIXER_TILE_KERNEL_CUH
#define MSAR_FUSED_MIXER_TILE_KERNEL_CUH

#include "fusedMixerParams.cuh"

namespace msar
{
namespace kernels
{
namespace
{

/*!
 * Views of one source for channels c..c+V-1 and tokens t0..t0+TS-1:
 * v[0][t] = x[t], v[r][t] = sum_{delta < k_r} w_r[k_r-1-delta] * x[t-delta]
 * (Conv1d order), zero before t = 0. The loop over delta keeps the TS
 * current rows in registers and shifts them by one token per step, so each
 * input row and each tap is loaded once per tile.
 */
template <typename T, int MB, int TS, int V>
__device__ __forceinline__ void tileViews(T const* __restrict__ x, T const* __restrict__ taps,
    MixerParams<T> const& p, int64_t t0, int64_t c, float (&v)[MB][TS][V])
{
    // Row and tap pointers step back by d per delta: one 64-bit add each instead of an
    // index product per load (the loop is issue-bound: docs/kernels.md).
    T const* row = x + t0 * p.d + c;
    T const* tap[MB];
#pragma unroll
    for (int r = 1; r < MB; ++r)
    {
        tap[r] = taps + static_cast<int64_t>(p.offs[r] + p.ks[r] - 1) * p.d + c; // delta = 0 is tap k_r - 1
    }
    float cur[TS][V];
#pragma unroll
    for (int t = 0; t < TS; ++t)
    {
        if (t0 + t < p.seq)
        {
            loadVec<T, V>(row + t * p.d, cur[t]);
        }
        else
        {
            zeroFill(cur[t]);
        }
#pragma unroll
        for (int e = 0; e < V; ++e)
        {
            v[0][t][e] = cur[t][e];
#pragma unroll
            for (int r = 1; r < MB; ++r)
            {
                v[r][t][e] = 0.F;
            }
        }
    }
    // Unrolled by TS so that the shift of cur[] becomes register renaming, not moves.
#pragma unroll TS
    for (int delta = 0; delta < p.kmax; ++delta)
    {
        if (delta > 0)
        {
#pragma unroll
            for (int t = TS - 1; t > 0; --t)
            {
#pragma unroll
                for (int e = 0; e < V; ++e)
                {
                    cur[t][e] = cur[t - 1][e];
                }
            }
            row -= p.d;
            if (t0 - delta >= 0)
            {
                loadVec<T, V>(row, cur[0]);
            }
            else
            {
                zeroFill(cur[0]);
            }
        }
#pragma unroll
        for (int r = 1; r < MB; ++r)
        {
            if (r < p.m && delta < p.ks[r])
            {
                float w[V];
                loadVec<T, V>(tap[r], w);
                tap[r] -= p.d;
#pragma unroll
                for (int t = 0; t < TS; ++t)
                {
#pragma unroll
                    for (int e = 0; e < V; ++e)
                    {
                        v[r][t][e] = fmaf(w[e], cur[t][e], v[r][t][e]);
                    }
                }
            }
        }
    }
}

//! f(c, views) for every chunk of V channels the calling thread owns.
template <typename T, int MB, int TS, int V, typename F>
__device__ __forceinline__ void forEachChunk(
    T const* __restrict__ x, T const* __restrict__ taps, MixerParams<T> const& p, int64_t t0, F&& f)
{
    for (int64_t ch = threadIdx.x; ch < p.nChunks; ch += blockDim.x)
    {
        int64_t const c = ch * V;
        float v[MB][TS][V];
        tileViews<T, MB, TS, V>(x, taps, p, t0, c, v);
        f(c, v);
    }
}

//! Shared-memory layout of the tile and merge kernels (floats; tileSmemBytes in fusedMixerPlan.h).
template <int MB, int TS>
struct TileSmem
{
    float* z;     // [TS][m][d]
    float* red;   // [warps][32]
    float* coefE; // [MB*TS]: exp(s - max) of the current source
    float* coefS; // [MB*TS]: rescale of the old z
    float* stat;  // [2][MB*TS]: running max, denominator
    float* gates; // [MB*TS]: g / denominator
    float* wts;   // [kMaxSplits][MB*TS]: merge weights

    __device__ TileSmem(float* base, int m, int64_t d)
    {
        z = base;
        red = z + static_cast<int64_t>(TS) * m * d;
        coefE = red + (blockDim.x / kWarpSize) * kWarpSize;
        coefS = coefE + MB * TS;
        stat = coefS + MB * TS;
        gates = stat + 2 * MB * TS;
        wts = gates + MB * TS;
    }
};

//! Block sum of 32 values per thread: afterwards red[w*32 + k] holds warp w's sum of value k.
__device__ __forceinline__ void blockPartials(float (&acc)[32], float* red)
{
    int const lane = threadIdx.x % kWarpSize;
    WarpReduceScatter<32, kWarpSize / 2>::run(acc, lane);
    red[(threadIdx.x / kWarpSize) * kWarpSize + lane] = acc[0];
    __syncthreads();
}

__device__ __forceinline__ float sumOverWarps(float const* red, int k)
{
    float s = 0.F;
    int const nWarps = blockDim.x / kWarpSize;
    for (int w = 0; w < nWarps; ++w)
    {
        s += red[w * kWarpSize + k];
    }
    return s;
}

/*!
 * From the tile's unnormalised z and denominators (sm.stat) to the output:
 * logit_g = sum_r W_g,r . z^(r) / den^(r), g = sigmoid(a * logit + b),
 * h = sum_r g^(r) z^(r) / den^(r).
 */
template <typename T, int MB, int TS, int V>
__device__ void finishTile(MixerParams<T> const& p, TileSmem<MB, TS> const& sm, int64_t seqOffset, int64_t t0)
{
    float acc[32];
    zeroFill(acc);
    for (int64_t ch = threadIdx.x; ch < p.nChunks; ch += blockDim.x)
    {
        int64_t const c = ch * V;
#pragma unroll
        for (int r = 0; r < MB; ++r)
        {
            if (r < p.m)
            {
                float zt[TS][V];
#pragma unroll
                for (int t = 0; t < TS; ++t)
                {
                    float const inv = 1.F / sm.stat[MB * TS + r * TS + t];
#pragma unroll
                    for (int e = 0; e < V; ++e)
                    {
                        zt[t][e] = sm.z[(static_cast<int64_t>(t) * p.m + r) * p.d + c + e] * inv;
                    }
                }
#pragma unroll
                for (int g = 0; g < MB; ++g)
                {
                    if (g < p.m)
                    {
                        float w[V];
                        loadVec<T, V>(p.gateW + (static_cast<int64_t>(g) * p.m + r) * p.d + c, w);
#pragma unroll
                        for (int t = 0; t < TS; ++t)
                        {
#pragma unroll
                            for (int e = 0; e < V; ++e)
                            {
                                acc[g * TS + t] = fmaf(w[e], zt[t][e], acc[g * TS + t]);
                            }
                        }
                    }
                }
            }
        }
    }
    blockPartials(acc, sm.red);
    int const k = threadIdx.x;
    if (k < MB * TS && k / TS < p.m)
    {
        float const logit = sumOverWarps(sm.red, k);
        float const zg = fmaf(toFloat(p.gateScale[0]), logit, toFloat(p.gateB[k / TS]));
        sm.gates[k] = 1.F / (1.F + expf(-zg)) / sm.stat[MB * TS + k];
    }
    __syncthreads();
    T* out = p.out + seqOffset;
    for (int64_t ch = threadIdx.x; ch < p.nChunks; ch += blockDim.x)
    {
        int64_t const c = ch * V;
#pragma unroll
        for (int t = 0; t < TS; ++t)
        {
            if (t0 + t < p.seq)
            {
                float h[V];
                zeroFill(h);
                for (int r = 0; r < p.m; ++r)
                {
                    float const g = sm.gates[r * TS + t];
#pragma unroll
                    for (int e = 0; e < V; ++e)
                    {
                        h[e] = fmaf(g, sm.z[(static_cast<int64_t>(t) * p.m + r) * p.d + c + e], h[e]);
                    }
                }
                storeVec<T, V>(out + (t0 + t) * p.d + c, h);
            }
        }
    }
}

template <typename T, int MB, int TS, int V>
__global__ void __launch_bounds__(kTileThreads) tileMixerKernel(MixerParams<T> const p, SourceTable const src)
{
    static_assert(2 * MB * TS <= 32, "one reduce-scatter row per warp holds sum(v^2) and q.v");
    MSAR_DYNAMIC_SHARED(float, smem);
    TileSmem<MB, TS> const sm(smem, p.m, p.d);
    int64_t const tile = blockIdx.x / p.splits;
    int const split = static_cast<int>(blockIdx.x % p.splits);
    int64_t const b = tile / p.tilesPerSeq;
    int64_t const t0 = (tile - b * p.tilesPerSeq) * TS;
    int64_t const seqOffset = tokenOffset(b, 0, p.seq, p.d);
    int const i0 = split * p.n / p.splits;
    int const i1 = (split + 1) * p.n / p.splits;
    int64_t const zFloats = static_cast<int64_t>(TS) * p.m * p.d;

    for (int64_t k = threadIdx.x; k < zFloats; k += blockDim.x)
    {
        sm.z[k] = 0.F;
    }
    // Softmax state of (stream, token) k = r*TS + t, held by thread k of warp 0.
    int const k = threadIdx.x;
    bool const owner = k < MB * TS;
    float runMax = -INFINITY;
    float runDen = 0.F;

    for (int i = i0; i < i1; ++i)
    {
        T const* x = static_cast<T const*>(src.ptr[i]) + seqOffset;
        T const* taps = p.taps + static_cast<int64_t>(i) * p.K * p.d;
        float acc[32];
        zeroFill(acc);
        forEachChunk<T, MB, TS, V>(x, taps, p, t0, [&](int64_t c, auto const& v) {
#pragma unroll
            for (int r = 0; r < MB; ++r)
            {
                if (r < p.m)
                {
                    float q[V];
                    loadVec<T, V>(p.query + r * p.d + c, q);
#pragma unroll
                    for (int t = 0; t < TS; ++t)
                    {
#pragma unroll
                        for (int e = 0; e < V; ++e)
                        {
                            acc[r * TS + t] = fmaf(v[r][t][e], v[r][t][e], acc[r * TS + t]);
                            acc[MB * TS + r * TS + t] = fmaf(q[e], v[r][t][e], acc[MB * TS + r * TS + t]);
                        }
                    }
                }
            }
        });
        blockPartials(acc, sm.red);
        if (owner)
        {
            float const ss = sumOverWarps(sm.red, k);
            float const qv = sumOverWarps(sm.red, MB * TS + k);
            float const s = qv * rsqrtf(ss / static_cast<float>(p.d) + p.eps);
            float const newMax = fmaxf(runMax, s);
            float const rescale = expf(runMax - newMax); // 0 on the first source
            float const e = expf(s - newMax);
            runDen = fmaf(runDen, rescale, e);
            runMax = newMax;
            sm.coefE[k] = e;
            sm.coefS[k] = rescale;
        }
        __syncthreads();
        forEachChunk<T, MB, TS, V>(x, taps, p, t0, [&](int64_t c, auto const& v) {
#pragma unroll
            for (int r = 0; r < MB; ++r)
            {
                if (r < p.m)
                {
#pragma unroll
                    for (int t = 0; t < TS; ++t)
                    {
                        float const e = sm.coefE[r * TS + t];
                        float const rescale = sm.coefS[r * TS + t];
                        float* zr = sm.z + (static_cast<int64_t>(t) * p.m + r) * p.d + c;
#pragma unroll
                        for (int j = 0; j < V; ++j)
                        {
                            zr[j] = fmaf(zr[j], rescale, e * v[r][t][j]);
                        }
                    }
                }
            }
        });
        // No barrier here: the next write of sm.red and sm.coef* comes after the next blockPartials barrier.
    }
    if (owner)
    {
        sm.stat[k] = runMax;
        sm.stat[MB * TS + k] = runDen;
    }
    __syncthreads();
    if (p.splits > 1)
    {
        float* slot = p.partial + static_cast<int64_t>(blockIdx.x) * p.slotFloats;
        for (int64_t j = threadIdx.x; j < zFloats; j += blockDim.x)
        {
            slot[j] = sm.z[j];
        }
        if (owner)
        {
            slot[zFloats + k] = runMax;
            slot[zFloats + MB * TS + k] = runDen;
        }
        return;
    }
    finishTile<T, MB, TS, V>(p, sm, seqOffset, t0);
}

/*!
 * One block per tile: the splits' partial results combined by log-sum-exp,
 * z = sum_s exp(max_s - M) z_s, den = sum_s exp(max_s - M) den_s, then the gates.
 */
template <typename T, int MB, int TS, int V>
__global__ void __launch_bounds__(kTileThreads) mergeKernel(MixerParams<T> const p)
{
    MSAR_DYNAMIC_SHARED(float, smem);
    TileSmem<MB, TS> const sm(smem, p.m, p.d);
    int64_t const tile = blockIdx.x;
    int64_t const b = tile / p.tilesPerSeq;
    int64_t const t0 = (tile - b * p.tilesPerSeq) * TS;
    int64_t const zFloats = static_cast<int64_t>(TS) * p.m * p.d;
    int64_t const slotFloats = p.slotFloats;
    float const* slots = p.partial + tile * p.splits * slotFloats;
    int const k = threadIdx.x;
    if (k < MB * TS)
    {
        float mx = -INFINITY;
        for (int s = 0; s < p.splits; ++s)
        {
            mx = fmaxf(mx, slots[s * slotFloats + zFloats + k]);
        }
        float den = 0.F;
        for (int s = 0; s < p.splits; ++s)
        {
            float const w = expf(slots[s * slotFloats + zFloats + k] - mx);
            sm.wts[s * MB * TS + k] = w;
            den = fmaf(w, slots[s * slotFloats + zFloats + MB * TS + k], den);
        }
        sm.stat[MB * TS + k] = den;
    }
    __syncthreads();
    for (int64_t j = threadIdx.x; j < zFloats; j += blockDim.x)
    {
        int64_t const t = j / (p.m * p.d);
        int64_t const r = (j / p.d) % p.m;
        float const* w = sm.wts + r * TS + t;
        float acc = 0.F;
        for (int s = 0; s < p.splits; ++s)
        {
            acc = fmaf(w[s * MB * TS], slots[s * slotFloats + j], acc);
        }
        sm.z[j] = acc;
    }
    __syncthreads();
    finishTile<T, MB, TS, V>(p, sm, tokenOffset(b, 0, p.seq, p.d), t0);
}

} // namespace
} // namespace kernels
} // namespace msar

#endif // MSAR_FUSED_MIXER_TILE_KERNEL_CUH

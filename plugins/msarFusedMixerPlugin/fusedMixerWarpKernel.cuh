/*
 * The warp kernel of msar::FusedMixer, for shapes whose per-token z (m*d
 * floats) does not fit the tile kernel's shared memory (m = 8 streams with d
 * above about 7k), and wherever the plan's cost model (fusedMixerPlan.h) says
 * it is faster. Included by fusedMixerKernel.cu only.
 *
 * One warp owns a tile of TS consecutive tokens of one sequence; its 32 lanes
 * stride over the d channels. For a lane's channel c the causal window streams
 * through registers and every tap is used for the TS tokens of the tile.
 * Holding z for a tile would not fit, so it uses linearity:
 *
 *   logit_p = sum_r sum_c W[p, r*d + c] z^(r)_c = sum_r sum_i alpha_i^(r) u_{i,r,p}
 *   with u_{i,r,p} = sum_c W[p, r*d + c] x_i^(r)_c
 *
 * Pass 1 (per source i): per-lane partial sums of sum(v^2), q.v and u for
 *   every (stream, token) of the tile, one warp reduce-scatter, then an online
 *   softmax over sources held by the lanes that own a (stream, token) pair.
 * Pass 2: coefficients g^(r) * alpha_i^(r) replace the scores; every lane
 *   recomputes its channel's views and writes h_c = sum_i sum_r coef * x_i^(r)_c.
 * So each source is read twice and the conv is evaluated twice (see docs/kernels.md).
 */
#ifndef MSAR_FUSED_MIXER_WARP_KERNEL_CUH
#define MSAR_FUSED_MIXER_WARP_KERNEL_CUH

#include "fusedMixerParams.cuh"

namespace msar
{
namespace kernels
{
namespace
{

constexpr int kWarpsPerBlock = 4;
constexpr size_t kWarpSmemBudget = 48 * 1024; // no opt-in needed on any supported GPU

/*!
 * Views of one source at channel c for the TS tokens t0..t0+TS-1:
 * v[0][t] = x[t], v[r][t] = sum_{delta < k_r} w_r[k_r-1-delta] * x[t-delta]
 * (Conv1d order: tap j multiplies token t-(k_r-1-j)); zero before t = 0.
 *
 * The loop runs over delta (how far back), keeping cur[t] = x[t0+t-delta] in
 * registers: each step shifts the TS values by one token and loads one new
 * one, so a lane reads TS + kmax - 1 inputs and every tap once, and uses each
 * tap for TS tokens. The 4-way unroll lets the compiler rename the shifted
 * registers instead of moving them.
 */
template <typename T, int MB, int TS>
__device__ __forceinline__ void computeViews(T const* __restrict__ x, T const* __restrict__ taps,
    MixerParams<T> const& p, int64_t t0, int64_t c, float (&v)[MB][TS])
{
    float cur[TS];
#pragma unroll
    for (int t = 0; t < TS; ++t)
    {
        cur[t] = t0 + t < p.seq ? toFloat(x[(t0 + t) * p.d + c]) : 0.F;
        v[0][t] = cur[t];
#pragma unroll
        for (int r = 1; r < MB; ++r)
        {
            v[r][t] = 0.F;
        }
    }
#pragma unroll 4
    for (int delta = 0; delta < p.kmax; ++delta)
    {
        if (delta > 0)
        {
#pragma unroll
            for (int t = TS - 1; t > 0; --t)
            {
                cur[t] = cur[t - 1];
            }
            int64_t const tt = t0 - delta;
            cur[0] = tt >= 0 ? toFloat(x[tt * p.d + c]) : 0.F;
        }
#pragma unroll
        for (int r = 1; r < MB; ++r)
        {
            if (r < p.m && delta < p.ks[r])
            {
                // delta = 0 (current token) is tap index k_r - 1 of stream r.
                float const w = toFloat(taps[static_cast<int64_t>(p.offs[r] + p.ks[r] - 1 - delta) * p.d + c]);
#pragma unroll
                for (int t = 0; t < TS; ++t)
                {
                    v[r][t] = fmaf(w, cur[t], v[r][t]);
                }
            }
        }
    }
}

template <typename T, int MB>
__global__ void __launch_bounds__(kWarpsPerBlock* kWarpSize)
    warpMixerKernel(MixerParams<T> const p, SourceTable const src)
{
    constexpr int TS = WarpTile<MB>::TS; // fusedMixerPlan.h: its cost model counts the same tiles
    constexpr int NP = ((MB * (MB + 2) * TS + kWarpSize - 1) / kWarpSize) * kWarpSize;
    constexpr int PER_LANE = NP / kWarpSize;
    // Partial-sum layout: [0, MB*TS) sum v^2, [MB*TS, 2*MB*TS) q.v, then u[r][p][t].
    constexpr int SS = 0;
    constexpr int QV = MB * TS;
    constexpr int UU = 2 * MB * TS;

    MSAR_DYNAMIC_SHARED(float, smem);
    int const lane = threadIdx.x % kWarpSize;
    int const warp = threadIdx.x / kWarpSize;
    int64_t const tile = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarpSize) + warp;
    if (tile >= p.nTiles)
    {
        return; // warp-uniform: no block-wide synchronisation below
    }
    int64_t const b = tile / p.tilesPerSeq;
    int64_t const t0 = (tile - b * p.tilesPerSeq) * TS;
    int64_t const seqOffset = b * p.seq * p.d;

    float* coef = smem + static_cast<int64_t>(warp) * p.smemPerWarp; // [n][MB][TS]: scores, then coefficients
    float* scratch = coef + p.n * MB * TS;                            // [NP]
    float* gates = scratch + NP;                                      // [MB][TS]

    // Lanes < m*TS own one (stream, token) pair of the tile.
    bool const owner = lane < p.m * TS;
    int const orow = lane / TS;
    int const otok = lane % TS;
    float runMax = -INFINITY;
    float runDen = 0.F;
    float runU[MB];
#pragma unroll
    for (int g = 0; g < MB; ++g)
    {
        runU[g] = 0.F;
    }

    // ---- pass 1: scores, online softmax over sources, alpha-weighted u ----
    for (int i = 0; i < p.n; ++i)
    {
        T const* x = static_cast<T const*>(src.ptr[i]) + seqOffset;
        T const* taps = p.taps + static_cast<int64_t>(i) * p.K * p.d;
        float acc[NP];
#pragma unroll
        for (int k = 0; k < NP; ++k)
        {
            acc[k] = 0.F;
        }
        for (int64_t c = lane; c < p.d; c += kWarpSize)
        {
            float v[MB][TS];
            computeViews<T, MB, TS>(x, taps, p, t0, c, v);
#pragma unroll
            for (int r = 0; r < MB; ++r)
            {
                if (r < p.m)
                {
                    float const q = toFloat(p.query[r * p.d + c]);
#pragma unroll
                    for (int t = 0; t < TS; ++t)
                    {
                        acc[SS + r * TS + t] = fmaf(v[r][t], v[r][t], acc[SS + r * TS + t]);
                        acc[QV + r * TS + t] = fmaf(q, v[r][t], acc[QV + r * TS + t]);
                    }
                }
            }
#pragma unroll
            for (int g = 0; g < MB; ++g)
            {
                if (g < p.m)
                {
                    T const* wrow = p.gateW + static_cast<int64_t>(g) * p.m * p.d + c;
#pragma unroll
                    for (int r = 0; r < MB; ++r)
                    {
                        if (r < p.m)
                        {
                            float const w = toFloat(wrow[r * p.d]);
#pragma unroll
                            for (int t = 0; t < TS; ++t)
                            {
                                acc[UU + (r * MB + g) * TS + t] = fmaf(w, v[r][t], acc[UU + (r * MB + g) * TS + t]);
                            }
                        }
                    }
                }
            }
        }
        WarpReduceScatter<NP, kWarpSize / 2>::run(acc, lane);
#pragma unroll
        for (int k = 0; k < PER_LANE; ++k)
        {
            scratch[lane * PER_LANE + k] = acc[k];
        }
        __syncwarp();
        if (owner)
        {
            float const ss = scratch[SS + orow * TS + otok];
            float const qv = scratch[QV + orow * TS + otok];
            float const s = qv * rsqrtf(ss / static_cast<float>(p.d) + p.eps);
            coef[(i * MB + orow) * TS + otok] = s;
            float const newMax = fmaxf(runMax, s);
            float const rescale = expf(runMax - newMax); // 0 on the first source
            float const e = expf(s - newMax);
            runDen = fmaf(runDen, rescale, e);
#pragma unroll
            for (int g = 0; g < MB; ++g)
            {
                if (g < p.m)
                {
                    runU[g] = fmaf(runU[g], rescale, e * scratch[UU + (orow * MB + g) * TS + otok]);
                }
            }
            runMax = newMax;
        }
        __syncwarp(); // scratch is rewritten by the next source
    }

    // ---- gates: logit_g = sum_r U[r][g] / den[r] ----
    float invDen = 0.F;
    if (owner)
    {
        invDen = 1.F / runDen;
#pragma unroll
        for (int g = 0; g < MB; ++g)
        {
            if (g < p.m)
            {
                scratch[(orow * MB + g) * TS + otok] = runU[g] * invDen;
            }
        }
    }
    __syncwarp();
    if (owner)
    {
        int const g = orow; // lane reinterpreted as (gate, token)
        float logit = 0.F;
        for (int r = 0; r < p.m; ++r)
        {
            logit += scratch[(r * MB + g) * TS + otok];
        }
        float const z = fmaf(toFloat(p.gateScale[0]), logit, toFloat(p.gateB[g]));
        gates[g * TS + otok] = 1.F / (1.F + expf(-z));
    }
    __syncwarp();
    if (owner)
    {
        float const w = gates[orow * TS + otok] * invDen;
        for (int i = 0; i < p.n; ++i)
        {
            float* s = coef + (i * MB + orow) * TS + otok;
            *s = w * expf(*s - runMax); // g^(r) * alpha_i^(r)
        }
    }
    __syncwarp();

    // ---- pass 2: h_c = sum_i sum_r coef[i][r] * x_i^(r)_c ----
    T* out = p.out + seqOffset;
    for (int64_t c = lane; c < p.d; c += kWarpSize)
    {
        float h[TS];
#pragma unroll
        for (int t = 0; t < TS; ++t)
        {
            h[t] = 0.F;
        }
        for (int i = 0; i < p.n; ++i)
        {
            T const* x = static_cast<T const*>(src.ptr[i]) + seqOffset;
            T const* taps = p.taps + static_cast<int64_t>(i) * p.K * p.d;
            float v[MB][TS];
            computeViews<T, MB, TS>(x, taps, p, t0, c, v);
            float const* cf = coef + i * MB * TS;
#pragma unroll
            for (int r = 0; r < MB; ++r)
            {
                if (r < p.m)
                {
#pragma unroll
                    for (int t = 0; t < TS; ++t)
                    {
                        h[t] = fmaf(cf[r * TS + t], v[r][t], h[t]);
                    }
                }
            }
        }
#pragma unroll
        for (int t = 0; t < TS; ++t)
        {
            if (t0 + t < p.seq)
            {
                out[(t0 + t) * p.d + c] = fromFloat<T>(h[t]);
            }
        }
    }
}

template <typename T, int MB>
int32_t launchWarpMixer(MixerParams<T> p, SourceTable const& src, int64_t batch, cudaStream_t stream)
{
    constexpr int TS = WarpTile<MB>::TS; // fusedMixerPlan.h: its cost model counts the same tiles
    constexpr int NP = ((MB * (MB + 2) * TS + kWarpSize - 1) / kWarpSize) * kWarpSize;
    p.tilesPerSeq = (p.seq + TS - 1) / TS;
    p.nTiles = batch * p.tilesPerSeq;
    int64_t const perWarp = static_cast<int64_t>(p.n) * MB * TS + NP + MB * TS;
    size_t const perWarpBytes = static_cast<size_t>(perWarp) * sizeof(float);
    int64_t warps = static_cast<int64_t>(kWarpSmemBudget / perWarpBytes);
    warps = warps > kWarpsPerBlock ? kWarpsPerBlock : warps;
    warps = warps > p.nTiles ? p.nTiles : warps;
    if (warps < 1)
    {
        return MSAR_STATUS_UNSUPPORTED; // too many sources for the per-warp score table
    }
    p.smemPerWarp = static_cast<int32_t>(perWarp);
    int64_t const blocks = (p.nTiles + warps - 1) / warps;
    if (blocks > 0x7fffffffLL)
    {
        return MSAR_STATUS_UNSUPPORTED;
    }
    auto kernel = warpMixerKernel<T, MB>;
    MSAR_LAUNCH(kernel, static_cast<unsigned>(blocks), static_cast<unsigned>(warps * kWarpSize),
        static_cast<size_t>(warps) * perWarpBytes, stream)(p, src);
    return launchStatus();
}

} // namespace
} // namespace kernels
} // namespace msar

#endif // MSAR_FUSED_MIXER_WARP_KERNEL_CUH

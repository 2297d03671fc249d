/*
 * msar::FusedMixer prefill kernel: causal conv views computed on the fly from
 * the raw sources, per-stream RMS-normalised softmax retrieval over depth,
 * scalar sigmoid gate per stream, gated sum. float32 arithmetic throughout.
 *
 * Work decomposition
 * ------------------
 * One warp owns a tile of TS consecutive tokens of one sequence; its 32 lanes
 * stride over the d channels. A block holds up to 4 warps on neighbouring
 * tiles, so the conv halo rows and the taps they share are L1 hits.
 *
 * For a lane's channel c, the window x[t0-(kmax-1) .. t0+TS-1, c] streams
 * through registers and every tap is loaded once per (source, channel) and
 * used for the TS tokens of the tile: the "kmax-token window shared by
 * neighbouring tokens" of MSAR_SPEC section 4. Taps, queries and gate weights
 * are read per tile, the raw sources per token; no expanded view ever goes to
 * memory.
 *
 * Each token's scores need a reduction over d before the softmax, and the
 * gates need the retrieved streams z^(r) (m*d values per token) before the
 * output. Holding z for a tile would cost TS*m*d floats per warp (128 KiB for
 * d = 2048, m = 4, TS = 4), so the kernel instead uses linearity:
 *
 *   logit_p = sum_r sum_c W[p, r*d + c] z^(r)_c = sum_r sum_i alpha_i^(r) u_{i,r,p}
 *   with u_{i,r,p} = sum_c W[p, r*d + c] x_i^(r)_c
 *
 * Pass 1 (per source i): per-lane partial sums of  sum(v^2), q.v  and  u  for
 *   every (stream, token) of the tile, one warp reduce-scatter, then an online
 *   softmax over sources (running max, denominator and alpha-weighted u) held
 *   by the lanes that own a (stream, token) pair. Scores go to shared memory.
 * Gates: logit_p = sum_r U_{r,p} / den_r, g = sigmoid(a * logit + b).
 * Pass 2: coefficients g^(r) * alpha_i^(r) replace the scores; every lane
 *   recomputes its channel's views and writes h_c = sum_i sum_r coef * x_i^(r)_c.
 *
 * So each source is read twice (the second read mostly from L2) and the conv
 * is evaluated twice; no global scratch besides the transposed taps.
 *
 * Not tuned yet: TS, the 4 warps per block and the register budget (ptxas:
 * 128-168 registers, no spills, i.e. about 12 resident warps per SM) are first
 * choices, to be measured with scripts/gpu_check.sh.
 */
#include "fusedMixerKernel.h"

#include "../common/msarKernelCommon.cuh"

#include <math.h>

namespace msar
{
namespace kernels
{
namespace
{

constexpr int kWarpsPerBlock = 4;
constexpr size_t kSmemBudget = 48 * 1024; // no opt-in needed on any supported GPU

//! Tokens per warp for a stream bucket: keeps the per-lane partial sums
//! (MB*(MB+2)*TS floats) at <= 96 registers.
template <int MB>
struct Tile;
template <>
struct Tile<2>
{
    static constexpr int TS = 8;
};
template <>
struct Tile<4>
{
    static constexpr int TS = 4;
};
template <>
struct Tile<8>
{
    static constexpr int TS = 1;
};

struct SourceTable
{
    void const* ptr[MSAR_MAX_SOURCES];
};

template <typename T>
struct MixerParams
{
    T const* query;     // [m, d]
    T const* gateW;     // [m, m*d]
    T const* gateB;     // [m]
    T const* gateScale; // []
    float const* taps;  // [n][K][d], workspace
    T* out;             // [B, T, d]
    int64_t seq;
    int64_t d;
    int64_t tilesPerSeq;
    int64_t nTiles;
    int32_t n;
    int32_t m;
    int32_t K;
    int32_t kmax;
    int32_t smemPerWarp; // floats
    float eps;
    int32_t ks[MSAR_MAX_STREAMS];   // kernel size per stream, ks[0] = 1
    int32_t offs[MSAR_MAX_STREAMS]; // first tap of stream r (r >= 1) within K
};

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
__device__ __forceinline__ void computeViews(T const* __restrict__ x, float const* __restrict__ taps,
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
                float const w = taps[static_cast<int64_t>(p.offs[r] + p.ks[r] - 1 - delta) * p.d + c];
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
    fusedMixerKernel(MixerParams<T> const p, SourceTable const src)
{
    constexpr int TS = Tile<MB>::TS;
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
        float const* taps = p.taps + static_cast<int64_t>(i) * p.K * p.d;
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
            float const* taps = p.taps + static_cast<int64_t>(i) * p.K * p.d;
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

//! conv_weight [N, d, K] (T) -> taps [n][K][d] float32, so a warp's tap loads are coalesced.
template <typename T>
__global__ void transposeTapsKernel(T const* __restrict__ w, float* __restrict__ taps, int64_t n, int64_t d, int64_t K)
{
    int64_t const total = n * K * d;
    for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
         idx += static_cast<int64_t>(gridDim.x) * blockDim.x)
    {
        int64_t const c = idx % d;
        int64_t const rest = idx / d;
        int64_t const k = rest % K;
        int64_t const i = rest / K;
        taps[idx] = toFloat(w[(i * d + c) * K + k]);
    }
}

template <typename T, int MB>
int32_t launchMixer(MixerParams<T> p, SourceTable const& src, int64_t batch, cudaStream_t stream)
{
    constexpr int TS = Tile<MB>::TS;
    constexpr int NP = ((MB * (MB + 2) * TS + kWarpSize - 1) / kWarpSize) * kWarpSize;
    p.tilesPerSeq = (p.seq + TS - 1) / TS;
    p.nTiles = batch * p.tilesPerSeq;
    int64_t const perWarp = static_cast<int64_t>(p.n) * MB * TS + NP + MB * TS;
    size_t const perWarpBytes = static_cast<size_t>(perWarp) * sizeof(float);
    int64_t warps = static_cast<int64_t>(kSmemBudget / perWarpBytes);
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
    auto kernel = fusedMixerKernel<T, MB>;
    MSAR_LAUNCH(kernel, static_cast<unsigned>(blocks), static_cast<unsigned>(warps * kWarpSize),
        static_cast<size_t>(warps) * perWarpBytes, stream)(p, src);
    return launchStatus();
}

} // namespace

//! conv_weight [N, d, K] -> taps [n][K][d] float32 on `stream`.
template <typename T>
int32_t prepareTaps(void const* convWeight, int32_t n, int64_t d, int64_t K, void* taps, cudaStream_t stream)
{
    int64_t const total = static_cast<int64_t>(n) * K * d;
    int64_t const threads = 256;
    int64_t blocks = (total + threads - 1) / threads;
    blocks = blocks > 4096 ? 4096 : blocks;
    auto kernel = transposeTapsKernel<T>;
    MSAR_LAUNCH(kernel, static_cast<unsigned>(blocks), static_cast<unsigned>(threads), 0, stream)(
        static_cast<T const*>(convWeight), static_cast<float*>(taps), static_cast<int64_t>(n), d, K);
    return launchStatus();
}

namespace
{

int64_t tapCount(int32_t const* ks, int32_t m)
{
    int64_t K = 0;
    for (int32_t r = 1; r < m; ++r)
    {
        K += ks[r];
    }
    return K;
}

} // namespace
} // namespace kernels

template <typename T>
int32_t fusedMixerForward(MsarFusedMixerArgs const& a, cudaStream_t stream)
{
    using namespace kernels;
    int32_t const n = a.n_sources;
    int32_t const m = a.n_streams;
    if (n < 1 || n > MSAR_MAX_SOURCES || m < 1 || m > MSAR_MAX_STREAMS || a.stream_kernels == nullptr
        || a.sources == nullptr || a.batch < 0 || a.seq < 0 || a.d < 1 || a.conv_rows < n || !(a.eps > 0.F))
    {
        return MSAR_STATUS_INVALID_ARGUMENT;
    }
    if (a.stream_kernels[0] != 1)
    {
        return MSAR_STATUS_INVALID_ARGUMENT;
    }
    MixerParams<T> p{};
    p.kmax = 1;
    int32_t offset = 0;
    for (int32_t r = 0; r < m; ++r)
    {
        int32_t const k = a.stream_kernels[r];
        if (k < 1 || k > MSAR_MAX_KERNEL)
        {
            return MSAR_STATUS_INVALID_ARGUMENT;
        }
        p.ks[r] = k;
        p.offs[r] = r == 0 ? 0 : offset;
        offset += r == 0 ? 0 : k;
        p.kmax = k > p.kmax ? k : p.kmax;
    }
    p.K = offset;
    if (a.batch == 0 || a.seq == 0)
    {
        return MSAR_STATUS_OK; // empty output
    }
    if (a.query == nullptr || a.gate_weight == nullptr || a.gate_bias == nullptr || a.gate_scale == nullptr
        || a.out == nullptr || (p.K > 0 && a.conv_weight == nullptr))
    {
        return MSAR_STATUS_INVALID_ARGUMENT;
    }
    SourceTable src{};
    for (int32_t i = 0; i < n; ++i)
    {
        if (a.sources[i] == nullptr)
        {
            return MSAR_STATUS_INVALID_ARGUMENT;
        }
        src.ptr[i] = a.sources[i];
    }
    bool const prepared = a.prepared_taps != nullptr;
    size_t const need = prepared ? 0 : msarFusedMixerWorkspaceSize(n, a.d, a.stream_kernels, m);
    if (need > 0 && (a.workspace == nullptr || a.workspace_size < need))
    {
        return MSAR_STATUS_WORKSPACE_TOO_SMALL;
    }
    p.query = static_cast<T const*>(a.query);
    p.gateW = static_cast<T const*>(a.gate_weight);
    p.gateB = static_cast<T const*>(a.gate_bias);
    p.gateScale = static_cast<T const*>(a.gate_scale);
    p.taps = static_cast<float const*>(prepared ? a.prepared_taps : a.workspace);
    p.out = static_cast<T*>(a.out);
    p.seq = a.seq;
    p.d = a.d;
    p.n = n;
    p.m = m;
    p.eps = a.eps;

    if (p.K > 0 && !prepared)
    {
        int32_t const st = kernels::prepareTaps<T>(a.conv_weight, n, a.d, p.K, a.workspace, stream);
        if (st != MSAR_STATUS_OK)
        {
            return st;
        }
    }
    if (m <= 2)
    {
        return launchMixer<T, 2>(p, src, a.batch, stream);
    }
    if (m <= 4)
    {
        return launchMixer<T, 4>(p, src, a.batch, stream);
    }
    return launchMixer<T, 8>(p, src, a.batch, stream);
}

template int32_t fusedMixerForward<float>(MsarFusedMixerArgs const&, cudaStream_t);
template int32_t fusedMixerForward<__half>(MsarFusedMixerArgs const&, cudaStream_t);
template int32_t fusedMixerForward<__nv_bfloat16>(MsarFusedMixerArgs const&, cudaStream_t);

} // namespace msar

extern "C" size_t msarFusedMixerWorkspaceSize(
    int32_t n_sources, int64_t d, int32_t const* stream_kernels, int32_t n_streams)
{
    if (n_sources < 1 || d < 1 || stream_kernels == nullptr || n_streams < 1)
    {
        return 0;
    }
    int64_t const K = msar::kernels::tapCount(stream_kernels, n_streams);
    size_t const bytes = static_cast<size_t>(n_sources) * static_cast<size_t>(K) * static_cast<size_t>(d) * sizeof(float);
    return (bytes + 255) / 256 * 256;
}

extern "C" int32_t msarFusedMixerPrepareTaps(int32_t dtype, void const* conv_weight, int32_t n_sources, int64_t d,
    int32_t const* stream_kernels, int32_t n_streams, void* taps, size_t taps_size, cudaStream_t stream)
{
    if (conv_weight == nullptr || taps == nullptr || n_sources < 1 || n_sources > MSAR_MAX_SOURCES || d < 1
        || stream_kernels == nullptr || n_streams < 1 || n_streams > MSAR_MAX_STREAMS)
    {
        return MSAR_STATUS_INVALID_ARGUMENT;
    }
    if (taps_size < msarFusedMixerWorkspaceSize(n_sources, d, stream_kernels, n_streams))
    {
        return MSAR_STATUS_WORKSPACE_TOO_SMALL;
    }
    int64_t const K = msar::kernels::tapCount(stream_kernels, n_streams);
    if (K == 0)
    {
        return MSAR_STATUS_OK;
    }
    switch (dtype)
    {
    case MSAR_DTYPE_FLOAT32: return msar::kernels::prepareTaps<float>(conv_weight, n_sources, d, K, taps, stream);
    case MSAR_DTYPE_FLOAT16: return msar::kernels::prepareTaps<__half>(conv_weight, n_sources, d, K, taps, stream);
    case MSAR_DTYPE_BFLOAT16:
        return msar::kernels::prepareTaps<__nv_bfloat16>(conv_weight, n_sources, d, K, taps, stream);
    default: return MSAR_STATUS_UNSUPPORTED;
    }
}

extern "C" int32_t msarFusedMixerForward(int32_t dtype, MsarFusedMixerArgs const* args, cudaStream_t stream)
{
    if (args == nullptr)
    {
        return MSAR_STATUS_INVALID_ARGUMENT;
    }
    switch (dtype)
    {
    case MSAR_DTYPE_FLOAT32: return msar::fusedMixerForward<float>(*args, stream);
    case MSAR_DTYPE_FLOAT16: return msar::fusedMixerForward<__half>(*args, stream);
    case MSAR_DTYPE_BFLOAT16: return msar::fusedMixerForward<__nv_bfloat16>(*args, stream);
    default: return MSAR_STATUS_UNSUPPORTED;
    }
}

/*
 * ScoredMixer on the CPU: FusedMixer's weighted sum and gate over given scores (SourceScores made
 * them once per source). One work item is one batch row's tile of kTile tokens, every channel, so a
 * node is one pass over the pool and nothing a worker writes is read by another:
 *   1. alpha = the softmax over the sources of the tile's (token, stream) scores, [n][m][kTile];
 *   2. per source, per vector of channels, one stream at a time: the stream's taps stay in registers
 *      while kR tokens' views are made from kR + k - 1 window rows (each loaded once) and added,
 *      weighted, into z ([nv][m][kTile] vectors: one channel vector's block is contiguous). The
 *      source's tile of rows is one contiguous run of memory, read in place; while one source is
 *      summed, the rows of the next one that the previous tile did not read are prefetched (the
 *      previous tile, usually the same thread's last item, left the others in L2);
 *   3. the gate logits from z (still in L2), the gates, h = sum_r g_r z_r, one row per token.
 * Tiles whose window reaches before t = 0 or past T, and sources that are not float32 rows of whole
 * vectors, read a zero-padded copy instead. Kernels up to views::kUnrolled run unrolled loops;
 * longer ones a loop with run-time bounds. The taps are the calling thread's and kept between calls
 * while they are small (fresh ones cost page faults on every call).
 */
#include "cpuConvViews.h"
#include "cpuKernels.h"
#include "cpuVector.h"

#include <algorithm>
#include <limits>

namespace msar::cpu
{
namespace
{

constexpr int64_t kMaxStreams = 8;
constexpr int64_t kR = 8;      // tokens whose views one register pass makes (kR + 12 taps: 20 registers)
constexpr int64_t kTile = 16;  // tokens per work item, a multiple of kR: z is kTile x m x d floats (128 KB at d 512)

//! The calling thread's taps ([n][nv][K][kVW]), kept between calls while they are small (0.8 MB at d 512,
//! 17 sources; given back after a call when over 16 MB).
thread_local std::vector<float> tTaps;

struct Prepared
{
    FusedMixerProblem const* p;
    int64_t m, dp, nv, H, tiles;
    StreamTaps st;  // K taps per source, stream r's first at st.offsets[r]
    float const* taps;               // the calling thread's tTaps (workers have their own, empty)
    std::vector<float> gate;         // [m out][m in][dp]
    float bias[kMaxStreams];
    float scale;
    std::vector<float const*> rows;  // per source: float32 rows, stride rs
    int64_t rs;
    std::vector<float> converted;    // sources that are not float32 rows of whole vectors
};

//! z[t] += a[t] * view_t for tokens t in [0, count), count a multiple of kR, one stream of kernel
//! K: the taps stay in registers and each window row is loaded once per kR tokens. x: the row of
//! token 0's first tap (token t - (K - 1)), rows rs floats apart; w: the stream's K taps.
template <int64_t K>
inline __attribute__((always_inline)) void slide(float const* x, int64_t rs, float const* w, float const* a, vf* z,
                                                 int64_t count)
{
    vf tap[K];
#pragma GCC unroll 16
    for (int64_t j = 0; j < K; ++j)
    {
        tap[j] = vload(w + j * kVW);
    }
    for (int64_t t0 = 0; t0 < count; t0 += kR)
    {
        vf acc[kR];
#pragma GCC unroll 16
        for (int64_t t = 0; t < kR; ++t)
        {
            acc[t] = vf{};
        }
#pragma GCC unroll 32
        for (int64_t u = 0; u < kR + K - 1; ++u)
        {
            vf const xv = vload(x + (t0 + u) * rs);
#pragma GCC unroll 16
            for (int64_t t = 0; t < kR; ++t)
            {
                if (u - t >= 0 && u - t < K)
                {
                    acc[t] += tap[u - t] * xv;
                }
            }
        }
#pragma GCC unroll 16
        for (int64_t t = 0; t < kR; ++t)
        {
            z[t0 + t] += vsplat(a[t0 + t]) * acc[t];
        }
    }
}

//! One stream's tokens [0, count) one at a time, any kernel k (the same arguments as slide).
inline void slideAny(int64_t k, float const* x, int64_t rs, float const* w, float const* a, vf* z, int64_t count)
{
    for (int64_t t = 0; t < count; ++t)
    {
        vf acc = vf{};
        for (int64_t j = 0; j < k; ++j)
        {
            acc += vload(w + j * kVW) * vload(x + (t + j) * rs);
        }
        z[t] += vsplat(a[t]) * acc;
    }
}

//! One stream of kernel k over the tile's kTile tokens.
inline void stream(int64_t k, float const* x, int64_t rs, float const* w, float const* a, vf* z)
{
    if (!withConstant<views::kUnrolled>(k, [&](auto K) { slide<decltype(K)::value>(x, rs, w, a, z, kTile); }))
    {
        slideAny(k, x, rs, w, a, z, kTile);
    }
}

//! The gate over the tile's z ([nv][M][kTile] vectors, W [M][M][dp]), channel vector outer so that z
//! is read in order: per token t < tn, g_o = sigmoid(scale * sum_r W[o][r] . z_r[t] + bias[o]), then
//! the output rows h_t = sum_r g_r z_r[t] (written in place when float32 rows of whole vectors, else
//! through `rows`, [kTile][dp], converted).
template <int64_t M>
void gateM(vf const* z, int64_t tn, Prepared const& P, float* rows, int64_t b, int64_t t0)
{
    FusedMixerProblem const& p = *P.p;
    float const* W = P.gate.data();
    vf acc[kTile][M] = {};
    for (int64_t c = 0; c < P.nv; ++c)
    {
        vf w[M * M];
        for (int64_t i = 0; i < M * M; ++i)
        {
            w[i] = vload(W + i * P.dp + c * kVW);
        }
        vf const* zc = z + c * M * kTile;
        for (int64_t t = 0; t < tn; ++t)
        {
            for (int64_t r = 0; r < M; ++r)
            {
                vf const zr = zc[r * kTile + t];
                for (int64_t o = 0; o < M; ++o)
                {
                    acc[t][o] += w[o * M + r] * zr;
                }
            }
        }
    }
    float g[kTile][M];
    for (int64_t t = 0; t < tn; ++t)
    {
        for (int64_t o = 0; o < M; ++o)
        {
            g[t][o] = 1.F / (1.F + std::exp(-(P.scale * hsum(acc[t][o]) + P.bias[o])));
        }
    }
    bool const direct = p.storage == Storage::kFloat32 && P.dp == p.d;
    float* out = direct ? static_cast<float*>(p.h) + (b * p.T + t0) * p.d : rows;
    for (int64_t c = 0; c < P.nv; ++c)
    {
        vf const* zc = z + c * M * kTile;
        for (int64_t t = 0; t < tn; ++t)
        {
            vf h = vsplat(g[t][0]) * zc[t];
            for (int64_t r = 1; r < M; ++r)
            {
                h += vsplat(g[t][r]) * zc[r * kTile + t];
            }
            vstore(out + t * P.dp + c * kVW, h);
        }
    }
    for (int64_t t = 0; !direct && t < tn; ++t)
    {
        storeRow(p.h, (b * p.T + t0 + t) * p.d, rows + t * P.dp, p.d, p.storage);
    }
}

struct TileBuffers
{
    std::vector<vf> z;         // [nv][m][kTile]
    std::vector<float> alpha;  // [n][m][kTile]
    std::vector<float> stage;  // one source's window rows, zero-padded, stride rs
    std::vector<float> h;      // [kTile][dp]: output rows that are converted or trimmed
};
thread_local TileBuffers tBuf;

//! alpha [n][m][kTile] of the tile's tokens (zero past tn): the softmax over the n sources.
void tileAlpha(FusedMixerProblem const& p, int64_t m, int64_t b, int64_t t0, int64_t tn, float* alpha)
{
    int64_t const n = p.n;
    std::fill_n(alpha, n * m * kTile, 0.F);
    for (int64_t t = 0; t < tn; ++t)
    {
        for (int64_t r = 0; r < m; ++r)
        {
            float max = -std::numeric_limits<float>::infinity();
            for (int64_t i = 0; i < n; ++i)
            {
                max = std::max(max, p.scores[((i * p.B + b) * p.T + t0 + t) * m + r]);
            }
            float sum = 0.F;
            for (int64_t i = 0; i < n; ++i)
            {
                float const e = std::exp(p.scores[((i * p.B + b) * p.T + t0 + t) * m + r] - max);
                alpha[(i * m + r) * kTile + t] = e;
                sum += e;
            }
            float const inv = 1.F / sum;
            for (int64_t i = 0; i < n; ++i)
            {
                alpha[(i * m + r) * kTile + t] *= inv;
            }
        }
    }
}

//! Asks for the lines of [first, first + count) floats, part `part` of `parts` equal shares.
inline void prefetchShare(float const* first, int64_t count, int64_t part, int64_t parts)
{
    int64_t const lines = (count + 15) / 16, from = lines * part / parts, to = lines * (part + 1) / parts;
    for (int64_t l = from; l < to; ++l)
    {
        __builtin_prefetch(first + l * 16, 0, 3);
    }
}

void tile(void* data, std::size_t item)
{
    Prepared& P = *static_cast<Prepared*>(data);
    FusedMixerProblem const& p = *P.p;
    int64_t const m = P.m, n = p.n, nv = P.nv, H = P.H, rs = P.rs, K = P.st.K, span = kTile + H;
    int64_t const b = static_cast<int64_t>(item) / P.tiles, t0 = static_cast<int64_t>(item) % P.tiles * kTile;
    int64_t const tn = std::min(kTile, p.T - t0);
    bool const inPlace = t0 - H >= 0 && t0 + kTile <= p.T;  // else rows outside [0, T) would be read
    TileBuffers& w = tBuf;
    w.z.resize(nv * m * kTile);  // each channel vector's block is zeroed before its first source
    w.alpha.resize(n * m * kTile);
    tileAlpha(p, m, b, t0, tn, w.alpha.data());
    if (!inPlace)
    {
        w.stage.resize(span * rs);
    }
    for (int64_t i = 0; i < n; ++i)
    {
        float const* x = P.rows[i] + (b * p.T + t0 - H) * rs;  // row u: token t0 - H + u
        if (!inPlace)
        {
            loadWindow(w.stage.data(), rs, P.rows[i], Storage::kFloat32, b, p.T, rs, t0 - H, span);
            x = w.stage.data();
        }
        float const* next = i + 1 < n && inPlace ? P.rows[i + 1] + (b * p.T + t0 - H) * rs : nullptr;
        float const* taps = P.taps + i * nv * K * kVW;
        float const* a = w.alpha.data() + i * m * kTile;
        for (int64_t c = 0; c < nv; ++c)
        {
            if (next != nullptr)
            {
                prefetchShare(next + H * rs, kTile * rs, c, nv);
            }
            float const* xc = x + c * kVW;
            float const* tp = taps + c * K * kVW;
            vf* zc = w.z.data() + c * m * kTile;
            if (i == 0)
            {
                std::fill_n(zc, m * kTile, vf{});
            }
            for (int64_t r = 1; r < m; ++r)
            {
                int64_t const k = p.kernels[r];
                stream(k, xc + (H - (k - 1)) * rs, rs, tp + P.st.offsets[r] * kVW, a + r * kTile, zc + r * kTile);
            }
            for (int64_t t = 0; t < kTile; ++t)  // after the streams: their loops brought the rows into L1
            {
                zc[t] += vsplat(a[t]) * vload(xc + (t + H) * rs);
            }
        }
    }
    w.h.resize(kTile * P.dp);
    if (!withConstant<kMaxStreams>(m, [&](auto M) { gateM<decltype(M)::value>(w.z.data(), tn, P, w.h.data(), b, t0); }))
    {
        throw std::invalid_argument("at most 8 streams");
    }
}

} // namespace

void scoredMixer(FusedMixerProblem const& p, Parallel const& parallel)
{
    Prepared P;
    P.p = &p;
    P.m = static_cast<int64_t>(p.kernels.size());
    P.st = streamTaps(p.kernels);
    P.H = P.st.kmax - 1;
    int64_t const K = P.st.K;
    int64_t const d = p.d, m = P.m, n = p.n;
    P.dp = padded(d);
    P.nv = P.dp / kVW;
    int64_t const dp = P.dp;
    tTaps.assign(n * P.nv * K * kVW, 0.F);
    std::vector<float> row(dp);
    for (int64_t i = 0; i < n; ++i)
    {
        for (int64_t j = 0; j < K; ++j)
        {
            loadRow(row.data(), p.conv_weight, (i * K + j) * d, d, dp, p.storage);
            for (int64_t c = 0; c < P.nv; ++c)
            {
                std::copy_n(row.data() + c * kVW, kVW, tTaps.data() + ((i * P.nv + c) * K + j) * kVW);
            }
        }
    }
    P.taps = tTaps.data();
    loadGate(p.gate_weight, p.gate_bias, p.gate_scale, m, d, dp, p.storage, P.gate, P.bias, &P.scale);
    if (p.storage == Storage::kFloat32 && dp == d)
    {
        P.rs = d;
        for (int64_t i = 0; i < n; ++i)
        {
            P.rows.push_back(static_cast<float const*>(p.sources[i]));
        }
    }
    else
    {
        P.rs = dp;
        P.converted.resize(n * p.B * p.T * dp);
        for (int64_t i = 0; i < n; ++i)
        {
            float* dst = P.converted.data() + i * p.B * p.T * dp;
            for (int64_t bt = 0; bt < p.B * p.T; ++bt)
            {
                loadRow(dst + bt * dp, p.sources[i], bt * d, d, dp, p.storage);
            }
            P.rows.push_back(dst);
        }
    }
    P.tiles = (p.T + kTile - 1) / kTile;
    parallel.run(static_cast<std::size_t>(p.B * P.tiles), 0, tile, &P);
    constexpr std::size_t kKeptFloats = std::size_t{4} << 20;  // 16 MB
    if (tTaps.capacity() > kKeptFloats)
    {
        tTaps = std::vector<float>{};
    }
}

} // namespace msar::cpu

/*
 * ScoredMixer on the CPU: FusedMixer's weighted sum and gate over given scores (SourceScores made
 * them once per source). With no scoring pass nothing has to be kept between passes over the
 * sources, so the loops run channel-vector outer and source inner:
 *   0. alpha = the softmax over the sources of each (token, stream)'s scores, [B][n][m][T] (one
 *      stream's weights contiguous in t);
 *   1. per (batch row, group of kGroup channel vectors), for a block of tokens: every source's rows
 *      for the group are copied into a contiguous stage (zeros before t = 0); then per channel vector
 *      and source, one stream at a time, the stream's taps stay in registers while kR tokens' views
 *      are made from kR + k - 1 window rows (each loaded once) and added, weighted, into z ([m]
 *      [tokens] vectors, L1). z goes to a block buffer and the gate logits' partial sums (per group) are
 *      taken while it is in L1;
 *   2. per token: the gates from the summed partial logits, h = sum_r g_r z_r.
 * Sources that are not float32 rows of whole vectors are converted once per call. Kernels up to
 * views::kUnrolled run unrolled loops; longer ones, and the tokens after the last whole kR, a loop
 * with run-time bounds. The scratch buffers are the calling thread's and kept between calls while
 * they are small (fresh ones cost page faults on every call).
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
constexpr int64_t kGroup = 4;                // channel vectors per work item of phase 1
constexpr int64_t kBlock = 64;               // tokens per block: the stage of 17 sources is 330 KB (L2)

//! The calling thread's scratch, kept between calls while it is small (taps 0.8 MB, z 0.5 MB at d 512,
//! 17 sources; at d 4096, 65 sources, T 4096 it would be 34 MB, and is given back after each call).
struct Scratch
{
    std::vector<float> taps, alpha, z, logitParts;

    void trim()
    {
        constexpr std::size_t kKeptFloats = std::size_t{4} << 20;  // 16 MB
        if (taps.capacity() + alpha.capacity() + z.capacity() + logitParts.capacity() > kKeptFloats)
        {
            *this = Scratch{};
        }
    }
};
thread_local Scratch tScratch;

//! One call's problem and buffers; the large ones are the calling thread's (workers read them
//! through these references).
struct Prepared
{
    FusedMixerProblem const* p;
    int64_t m, dp, nv, H, groups;
    StreamTaps st;  // K taps per source, stream r's first at st.offsets[r]
    std::vector<float>& taps = tScratch.taps;  // [nv][n][K][kVW]
    std::vector<float> gate;         // [m out][m in][dp]
    float bias[kMaxStreams];
    float scale;
    std::vector<float>& alpha = tScratch.alpha;  // [B][n][m][T]
    std::vector<float const*> rows;  // per source: float32 rows, stride rs
    int64_t rs;
    std::vector<float> converted;    // sources that are not float32 rows of whole vectors
    int64_t t0, tn;                  // the current block of tokens
    std::vector<float>& z = tScratch.z;  // [B][tn][m][dp]
    std::vector<float>& logitParts = tScratch.logitParts;  // [groups][B][tn][m]
};

constexpr int64_t kR = 8;  // tokens whose views one register pass makes (kR + 12 taps: 20 registers)

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

//! One stream's tokens [from, count) one at a time, any kernel k (the same arguments as slide).
inline void slideAny(int64_t k, float const* x, int64_t rs, float const* w, float const* a, vf* z, int64_t from,
                     int64_t count)
{
    for (int64_t t = from; t < count; ++t)
    {
        vf acc = vf{};
        for (int64_t j = 0; j < k; ++j)
        {
            acc += vload(w + j * kVW) * vload(x + (t + j) * rs);
        }
        z[t] += vsplat(a[t]) * acc;
    }
}

//! Stream of kernel k over `count` tokens: unrolled for whole kR runs, then the rest token by token.
inline void stream(int64_t k, float const* x, int64_t rs, float const* w, float const* a, vf* z, int64_t count)
{
    int64_t const whole = k <= views::kUnrolled ? count / kR * kR : 0;
    if (whole > 0)
    {
        withConstant<views::kUnrolled>(k, [&](auto K) { slide<decltype(K)::value>(x, rs, w, a, z, whole); });
    }
    slideAny(k, x, rs, w, a, z, whole, count);
}

//! Stores z ([m][tn] vectors) as [tn][m][dp] rows for the gate pass, and adds each token's gate logits'
//! vector partial sums (W's d-blocks for this vector of channels: gate[(o * m + r) * dp]) into
//! logits [tn][m]; the m x m weight vectors are loaded once per block.
template <int64_t M>
void gatePartsM(vf const* zb, int64_t tn, float const* gate, int64_t dp, float* dst, vf* logits)
{
    vf w[M * M];
    for (int64_t i = 0; i < M * M; ++i)
    {
        w[i] = vload(gate + i * dp);
    }
    for (int64_t tt = 0; tt < tn; ++tt)
    {
        vf z[M];
        for (int64_t r = 0; r < M; ++r)
        {
            z[r] = zb[r * tn + tt];
            vstore(dst + (tt * M + r) * dp, z[r]);
        }
        for (int64_t o = 0; o < M; ++o)
        {
            vf acc = logits[tt * M + o];
            for (int64_t r = 0; r < M; ++r)
            {
                acc += w[o * M + r] * z[r];
            }
            logits[tt * M + o] = acc;
        }
    }
}

void gateParts(int64_t m, vf const* zb, int64_t tn, float const* gate, int64_t dp, float* dst, vf* logits)
{
    if (!withConstant<kMaxStreams>(m, [&](auto M) { gatePartsM<decltype(M)::value>(zb, tn, gate, dp, dst, logits); }))
    {
        throw std::invalid_argument("at most 8 streams");
    }
}

thread_local std::vector<vf> tLogits, tZ;
thread_local std::vector<float> tStage;

//! Each source's rows of the block for one group of channel vectors, copied into a stage:
//! stage[i][u][kGroup vectors], row u = token t0 - H + u, zeros before t = 0 and after T (one spare
//! row after the block: the odd token's unused partner). Rows lie d floats apart in place, so the
//! loops would read them from a few L1 sets; a group's 256 contiguous bytes per row are read here.
void stageGroup(Prepared const& P, int64_t b, int64_t g, float* stage)
{
    FusedMixerProblem const& p = *P.p;
    int64_t const span = P.tn + P.H + 1, c0 = g * kGroup, vn = std::min(P.nv - c0, kGroup);
    for (int64_t i = 0; i < p.n; ++i)
    {
        for (int64_t u = 0; u < span; ++u)
        {
            int64_t const t = P.t0 - P.H + u;
            float* dst = stage + (i * span + u) * kGroup * kVW;
            if (t < 0 || t >= p.T)
            {
                std::fill_n(dst, vn * kVW, 0.F);
                continue;
            }
            float const* src = P.rows[i] + (b * p.T + t) * P.rs + c0 * kVW;
            for (int64_t v = 0; v < vn; ++v)
            {
                vstore(dst + v * kVW, vload(src + v * kVW));
            }
        }
    }
}

//! z of the block's tokens for one vector of channels (vector c, column cv of the stage) into the
//! block buffer, and the gate logits' vector partial sums into `logits` ([tn][m]).
void vectorBlock(Prepared& P, int64_t b, int64_t c, float const* stage, vf* logits)
{
    FusedMixerProblem const& p = *P.p;
    int64_t const m = P.m, n = p.n, dp = P.dp, nm = n * m, H = P.H, tn = P.tn, span = tn + H + 1;
    int64_t const rs = kGroup * kVW;
    float const* taps = P.taps.data() + c * n * P.st.K * kVW;
    float const* alpha = P.alpha.data() + b * nm * p.T + P.t0;  // [n][m][T]
    stage += (c % kGroup) * kVW;
    vf* zb = tZ.data();  // [m][tn]
    std::fill_n(zb, tn * m, vf{});
    for (int64_t i = 0; i < n; ++i)
    {
        float const* rows = stage + i * span * rs;  // row u: token t0 - H + u
        float const* tp = taps + i * P.st.K * kVW;
        float const* a = alpha + i * m * p.T;
        for (int64_t r = 1; r < m; ++r)
        {
            int64_t const k = p.kernels[r];
            stream(k, rows + (H - (k - 1)) * rs, rs, tp + P.st.offsets[r] * kVW, a + r * p.T, zb + r * tn, tn);
        }
        for (int64_t tt = 0; tt < tn; ++tt)  // after the streams: their loops brought the rows into L1
        {
            zb[tt] += vsplat(a[tt]) * vload(rows + (tt + H) * rs);
        }
    }
    gateParts(P.m, zb, tn, P.gate.data() + c * kVW, dp, P.z.data() + (b * tn * m) * dp + c * kVW, logits);
}

void phase1(void* data, std::size_t item)
{
    Prepared& P = *static_cast<Prepared*>(data);
    FusedMixerProblem const& p = *P.p;
    int64_t const b = static_cast<int64_t>(item) / P.groups, g = static_cast<int64_t>(item) % P.groups, m = P.m;
    if (static_cast<int64_t>(tLogits.size()) < P.tn * m)
    {
        tLogits.resize(P.tn * m);
        tZ.resize(P.tn * m);
    }
    tStage.resize(std::max<std::size_t>(tStage.size(), p.n * (P.tn + P.H + 1) * kGroup * kVW));
    std::fill_n(tLogits.data(), P.tn * m, vf{});
    stageGroup(P, b, g, tStage.data());
    for (int64_t c = g * kGroup; c < std::min(P.nv, (g + 1) * kGroup); ++c)
    {
        vectorBlock(P, b, c, tStage.data(), tLogits.data());
    }
    float* parts = P.logitParts.data() + ((g * p.B + b) * P.tn) * m;
    for (int64_t i = 0; i < P.tn * m; ++i)
    {
        parts[i] = hsum(tLogits[i]);
    }
}

thread_local std::vector<float> tH;

void phase2(void* data, std::size_t item)
{
    Prepared& P = *static_cast<Prepared*>(data);
    FusedMixerProblem const& p = *P.p;
    int64_t const b = static_cast<int64_t>(item) / P.tn, tt = static_cast<int64_t>(item) % P.tn, m = P.m, dp = P.dp;
    float g[kMaxStreams];
    for (int64_t o = 0; o < m; ++o)
    {
        float logit = 0.F;
        for (int64_t gi = 0; gi < P.groups; ++gi)
        {
            logit += P.logitParts[((gi * p.B + b) * P.tn + tt) * m + o];
        }
        g[o] = 1.F / (1.F + std::exp(-(P.scale * logit + P.bias[o])));
    }
    if (static_cast<int64_t>(tH.size()) < dp)
    {
        tH.resize(dp);
    }
    float const* z = P.z.data() + ((b * P.tn + tt) * m) * dp;
    for (int64_t c = 0; c < dp; c += kVW)
    {
        vf acc = vf{};
        for (int64_t r = 0; r < m; ++r)
        {
            acc += vsplat(g[r]) * vload(z + r * dp + c);
        }
        vstore(tH.data() + c, acc);
    }
    storeRow(p.h, (b * p.T + P.t0 + tt) * p.d, tH.data(), p.d, p.storage);
}

void softmax(void* data, std::size_t item)
{
    Prepared& P = *static_cast<Prepared*>(data);
    FusedMixerProblem const& p = *P.p;
    int64_t const bt = static_cast<int64_t>(item), b = bt / p.T, t = bt % p.T, n = p.n, m = P.m;
    float* out = P.alpha.data() + b * n * m * p.T + t;  // [B][n][m][T]
    for (int64_t r = 0; r < m; ++r)
    {
        float max = -std::numeric_limits<float>::infinity();
        for (int64_t i = 0; i < n; ++i)
        {
            max = std::max(max, p.scores[((i * p.B + b) * p.T + t) * m + r]);
        }
        float sum = 0.F;
        for (int64_t i = 0; i < n; ++i)
        {
            float const e = std::exp(p.scores[((i * p.B + b) * p.T + t) * m + r] - max);
            out[(i * m + r) * p.T] = e;
            sum += e;
        }
        float const inv = 1.F / sum;
        for (int64_t i = 0; i < n; ++i)
        {
            out[(i * m + r) * p.T] *= inv;
        }
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
    P.groups = (P.nv + kGroup - 1) / kGroup;
    int64_t const dp = P.dp;
    P.taps.assign(P.nv * n * K * kVW, 0.F);
    std::vector<float> row(dp);
    for (int64_t i = 0; i < n; ++i)
    {
        for (int64_t j = 0; j < K; ++j)
        {
            loadRow(row.data(), p.conv_weight, (i * K + j) * d, d, dp, p.storage);
            for (int64_t c = 0; c < P.nv; ++c)
            {
                std::copy_n(row.data() + c * kVW, kVW, P.taps.data() + ((c * n + i) * K + j) * kVW);
            }
        }
    }
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
    P.alpha.resize(p.B * p.T * n * m);
    parallel.run(static_cast<std::size_t>(p.B * p.T), 0, softmax, &P);
    P.z.resize(p.B * std::min(kBlock, p.T) * m * dp);
    P.logitParts.resize(P.groups * p.B * std::min(kBlock, p.T) * m);
    for (P.t0 = 0; P.t0 < p.T; P.t0 += kBlock)
    {
        P.tn = std::min(kBlock, p.T - P.t0);
        parallel.run(static_cast<std::size_t>(p.B * P.groups), 0, phase1, &P);
        parallel.run(static_cast<std::size_t>(p.B * P.tn), 0, phase2, &P);
    }
    tScratch.trim();
}

} // namespace msar::cpu

/*
 * ScoredMixer on the CPU: FusedMixer's weighted sum and gate over given scores (SourceScores made
 * them once per source). With no scoring pass nothing has to be kept between passes over the
 * sources, so the loops run channel-vector outer and source inner, with z in registers:
 *   0. alpha = the softmax over the sources of each (token, stream)'s scores, [B][T][n][m];
 *   1. per (batch row, group of kGroup channel vectors), for a block of tokens: every source's rows
 *      for the group are copied into a contiguous stage (zeros before t = 0), then for one vector
 *      of channels and two tokens z of every stream stays in registers, summed over the sources;
 *      each source's window rows (kmax + 1 of them) are loaded once into registers and every
 *      stream's taps read from L1 (one vector's taps of all sources: n x K x 64 B). z goes to a
 *      block buffer and the gate logits' partial sums (per group) are taken while it is in registers;
 *   2. per token: the gates from the summed partial logits, h = sum_r g_r z_r.
 * Sources that are not float32 rows of whole vectors are converted once per call. The unrolled
 * two-token loop is compiled for stream_kernels [1, 4, 8, 12]; other kernel lists take a loop with
 * run-time bounds.
 */
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

struct Prepared
{
    FusedMixerProblem const* p;
    int64_t m, dp, nv, H, groups;
    StreamTaps st;  // K taps per source, stream r's first at st.offsets[r]
    bool fast;                       // stream_kernels == [1, 4, 8, 12]
    std::vector<float> taps;         // [nv][n][K][kVW]
    std::vector<float> gate;         // [m out][m in][dp]
    float bias[kMaxStreams];
    float scale;
    std::vector<float> alpha;        // [B][T][n][m]
    std::vector<float const*> rows;  // per source: float32 rows, stride rs
    int64_t rs;
    std::vector<float> converted;    // sources that are not float32 rows of whole vectors
    int64_t t0, tn;                  // the current block of tokens
    std::vector<float> z;            // [B][tn][m][dp]
    std::vector<float> logitParts;   // [groups][B][tn][m]
};

//! Two tokens (t, t+1) of one channel vector, one source: rows[u] = x[t - H + u], u = 0..H+1.
template <int64_t H>
struct Fast4812
{
    template <int64_t k>
    static inline __attribute__((always_inline)) void stream(vf const* row, float const* taps, float a0, float a1,
                                                             vf& z0, vf& z1)
    {
        vf p0{}, q0{}, p1{}, q1{};  // even and odd taps apart: four independent FMA chains
#pragma GCC unroll 16
        for (int64_t j = 0; j < k; ++j)
        {
            vf const tap = vload(taps + j * kVW);
            int64_t const u = H + 1 - k + j;  // tap j multiplies token t-(k-1-j)
            if (j % 2 == 0)
            {
                p0 += tap * row[u];
                p1 += tap * row[u + 1];
            }
            else
            {
                q0 += tap * row[u];
                q1 += tap * row[u + 1];
            }
        }
        z0 += vsplat(a0) * (p0 + q0);
        z1 += vsplat(a1) * (p1 + q1);
    }

    static inline __attribute__((always_inline)) void source(float const* x, int64_t rs, float const* taps,
                                                             float const* a0, float const* a1, vf* z0, vf* z1)
    {
        vf row[H + 2];
#pragma GCC unroll 16
        for (int64_t u = 0; u < H + 2; ++u)
        {
            row[u] = vload(x + u * rs);
        }
        z0[0] += vsplat(a0[0]) * row[H];
        z1[0] += vsplat(a1[0]) * row[H + 1];
        stream<4>(row, taps, a0[1], a1[1], z0[1], z1[1]);
        stream<8>(row, taps + 4 * kVW, a0[2], a1[2], z0[2], z1[2]);
        stream<12>(row, taps + 12 * kVW, a0[3], a1[3], z0[3], z1[3]);
    }
};

//! One token of one channel vector, any kernels: z[r] += alpha[r] * view_r; x is the token's row in a
//! stage (rows rs floats apart, zeros before t = 0).
inline void anyToken(Prepared const& P, float const* x, int64_t rs, float const* taps, float const* a, vf* z)
{
    z[0] += vsplat(a[0]) * vload(x);
    for (int64_t r = 1; r < P.m; ++r)
    {
        int64_t const k = P.p->kernels[r];
        vf acc = vf{};
        for (int64_t j = 0; j < k; ++j)
        {
            acc += vload(taps + (P.st.offsets[r] + j) * kVW) * vload(x + (j - (k - 1)) * rs);
        }
        z[r] += vsplat(a[r]) * acc;
    }
}

constexpr int64_t kSourceGroup = 4;  // sources whose rows and taps L1 holds while z stays in registers

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
    float const* alpha = P.alpha.data() + (b * p.T + P.t0) * nm;
    stage += (c % kGroup) * kVW;
    vf* zb = tZ.data();  // [tn][m]
    std::fill_n(zb, tn * m, vf{});
    for (int64_t i0 = 0; i0 < n; i0 += kSourceGroup)
    {
        int64_t const i1 = std::min(n, i0 + kSourceGroup);
        if (P.fast)
        {
            for (int64_t tt = 0; tt < tn; tt += 2)
            {
                bool const pair = tt + 1 < tn;
                vf z0[4], z1[4];
                for (int64_t r = 0; r < 4; ++r)
                {
                    z0[r] = zb[tt * 4 + r];
                    z1[r] = pair ? zb[(tt + 1) * 4 + r] : vf{};
                }
                float const* a0 = alpha + tt * nm;
                float const* a1 = pair ? a0 + nm : a0;
                for (int64_t i = i0; i < i1; ++i)
                {
                    Fast4812<11>::source(stage + (i * span + tt) * rs, rs, taps + i * P.st.K * kVW, a0 + i * m,
                                         a1 + i * m, z0, z1);
                }
                for (int64_t r = 0; r < 4; ++r)
                {
                    zb[tt * 4 + r] = z0[r];
                    if (pair)
                    {
                        zb[(tt + 1) * 4 + r] = z1[r];
                    }
                }
            }
        }
        else
        {
            for (int64_t tt = 0; tt < tn; ++tt)
            {
                for (int64_t i = i0; i < i1; ++i)
                {
                    anyToken(P, stage + (i * span + tt + H) * rs, rs, taps + i * P.st.K * kVW, alpha + tt * nm + i * m,
                             zb + tt * m);
                }
            }
        }
    }
    for (int64_t tt = 0; tt < tn; ++tt)
    {
        vf const* z = zb + tt * m;
        float* dst = P.z.data() + ((b * tn + tt) * m) * dp + c * kVW;
        for (int64_t r = 0; r < m; ++r)
        {
            vstore(dst + r * dp, z[r]);
        }
        for (int64_t o = 0; o < m; ++o)
        {
            vf acc = logits[tt * m + o];
            for (int64_t r = 0; r < m; ++r)
            {
                acc += vload(P.gate.data() + (o * m + r) * dp + c * kVW) * z[r];
            }
            logits[tt * m + o] = acc;
        }
    }
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
    float* out = P.alpha.data() + bt * n * m;
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
            out[i * m + r] = e;
            sum += e;
        }
        float const inv = 1.F / sum;
        for (int64_t i = 0; i < n; ++i)
        {
            out[i * m + r] *= inv;
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
    P.fast = p.kernels == std::vector<int32_t>{1, 4, 8, 12};
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
}

} // namespace msar::cpu

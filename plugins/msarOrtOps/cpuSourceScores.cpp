/*
 * SourceScores on the CPU: one source's retrieval scores against the queries of every later mixer,
 * so that each ScoredMixer skips FusedMixer's scoring pass (its views made again for every mixer).
 * One work item is one (batch row, tile of kTile tokens). The tile's window (kmax-1 rows before it,
 * zeros before t = 0) is converted to float32 once; then per stream: the tile's views (L1), their
 * norms, and the dots against the P queries, 4 tokens x 4 queries per block so that each view and
 * query vector loaded feeds 4 FMAs.
 */
#include "cpuKernels.h"
#include "cpuVector.h"

#include <algorithm>
#include <stdexcept>

namespace msar::cpu
{
namespace
{

constexpr int64_t kTile = 16;  // tokens per work item: one stream's views of the tile stay in L1
constexpr int64_t kBlock = 4;  // tokens x queries whose dots are summed together

struct Prepared
{
    SourceScoresProblem const* p;
    int64_t m, dp, K, H, tiles;
    int64_t offsets[8];
    std::vector<float> taps;     // [K][dp]
    std::vector<float> queries;  // [m][P][dp]: one stream's queries together
};

thread_local std::vector<float> tWindow, tViews, tDots;

//! dots[t][p] = v_t . q_p over dp channels for tn <= kBlock tokens and pn <= kBlock queries.
inline void dotBlock(float const* v, int64_t tn, float const* q, int64_t pn, int64_t dp, float* dots, int64_t ld)
{
    vf acc[kBlock][kBlock] = {};
    for (int64_t c = 0; c < dp; c += kVW)
    {
        vf qv[kBlock], vv[kBlock];
        for (int64_t j = 0; j < kBlock; ++j)
        {
            qv[j] = j < pn ? vload(q + j * dp + c) : vf{};
            vv[j] = j < tn ? vload(v + j * dp + c) : vf{};
        }
        for (int64_t t = 0; t < kBlock; ++t)
        {
            for (int64_t j = 0; j < kBlock; ++j)
            {
                acc[t][j] += vv[t] * qv[j];
            }
        }
    }
    for (int64_t t = 0; t < tn; ++t)
    {
        for (int64_t j = 0; j < pn; ++j)
        {
            dots[t * ld + j] = hsum(acc[t][j]);
        }
    }
}

void tile(Prepared const& P, int64_t item)
{
    SourceScoresProblem const& p = *P.p;
    int64_t const dp = P.dp, d = p.d, m = P.m, H = P.H, b = item / P.tiles, t0 = (item % P.tiles) * kTile;
    int64_t const tn = std::min(kTile, p.T - t0), rows = H + tn;
    tWindow.resize(std::max<std::size_t>(tWindow.size(), rows * dp));
    tViews.resize(std::max<std::size_t>(tViews.size(), kTile * dp));
    tDots.resize(std::max<std::size_t>(tDots.size(), kTile * p.P));
    float* win = tWindow.data();
    float* views = tViews.data();
    for (int64_t u = 0; u < rows; ++u)
    {
        int64_t const t = t0 - H + u;
        if (t < 0)
        {
            std::fill_n(win + u * dp, dp, 0.F);  // zeros before the sequence start
        }
        else
        {
            loadRow(win + u * dp, p.source, (b * p.T + t) * d, d, dp, p.storage);
        }
    }
    for (int64_t r = 0; r < m; ++r)
    {
        int64_t const k = p.kernels[r];
        float const* taps = P.taps.data() + P.offsets[r] * dp;
        float rn[kTile];
        for (int64_t t = 0; t < tn; ++t)
        {
            float* v = views + t * dp;
            float const* first = win + (H + t - (k - 1)) * dp;  // tap j multiplies token t-(k-1-j)
            vf squares = vf{};
            for (int64_t c = 0; c < dp; c += kVW)
            {
                vf acc;
                if (r == 0)
                {
                    acc = vload(first + c);
                }
                else
                {
                    acc = vf{};
                    for (int64_t j = 0; j < k; ++j)
                    {
                        acc += vload(taps + j * dp + c) * vload(first + j * dp + c);
                    }
                }
                vstore(v + c, acc);
                squares += acc * acc;
            }
            rn[t] = 1.F / std::sqrt(hsum(squares) / static_cast<float>(d) + p.eps);
        }
        float const* q = P.queries.data() + r * p.P * dp;
        for (int64_t t = 0; t < tn; t += kBlock)
        {
            for (int64_t j = 0; j < p.P; j += kBlock)
            {
                dotBlock(views + t * dp, std::min(kBlock, tn - t), q + j * dp, std::min(kBlock, p.P - j), dp,
                         tDots.data() + t * p.P + j, p.P);
            }
        }
        for (int64_t j = 0; j < p.P; ++j)
        {
            float* out = p.scores + ((j * p.B + b) * p.T + t0) * m + r;
            for (int64_t t = 0; t < tn; ++t)
            {
                out[t * m] = tDots[t * p.P + j] * rn[t];
            }
        }
    }
}

} // namespace

void sourceScores(SourceScoresProblem const& p, Parallel const& parallel)
{
    Prepared P;
    P.p = &p;
    P.m = static_cast<int64_t>(p.kernels.size());
    if (P.m < 1 || P.m > 8 || p.kernels[0] != 1)
    {
        throw std::invalid_argument("stream_kernels must start with 1 and have at most 8 streams");
    }
    auto const [K, kmax] = streamTaps(p.kernels);
    P.K = K;
    P.H = kmax - 1;
    P.dp = padded(p.d);
    int64_t offset = 0;
    for (int64_t r = 1; r < P.m; ++r)
    {
        P.offsets[r] = offset;
        offset += p.kernels[r];
    }
    P.offsets[0] = 0;
    int64_t const dp = P.dp, d = p.d;
    P.taps.assign(K * dp, 0.F);
    for (int64_t j = 0; j < K; ++j)
    {
        loadRow(P.taps.data() + j * dp, p.conv_weight, j * d, d, dp, p.storage);
    }
    P.queries.assign(P.m * p.P * dp, 0.F);
    for (int64_t j = 0; j < p.P; ++j)
    {
        for (int64_t r = 0; r < P.m; ++r)
        {
            loadRow(P.queries.data() + (r * p.P + j) * dp, p.queries, (j * P.m + r) * d, d, dp, p.storage);
        }
    }
    P.tiles = (p.T + kTile - 1) / kTile;
    parallel.run(static_cast<std::size_t>(p.B * P.tiles), 0,
                 [](void* data, std::size_t item) { tile(*static_cast<Prepared const*>(data), static_cast<int64_t>(item)); },
                 &P);
}

} // namespace msar::cpu

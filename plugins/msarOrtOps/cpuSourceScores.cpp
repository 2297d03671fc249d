/*
 * SourceScores on the CPU: one source's retrieval scores against the queries of every later mixer,
 * so that each ScoredMixer skips FusedMixer's scoring pass (its views made again for every mixer).
 * One work item is one (batch row, tile of kTile tokens). The tile's window (kmax-1 rows before it)
 * is read in place when it lies inside the sequence in float32 rows of whole chunks, else converted to
 * float32 once, zeros before t = 0 and past T; then per stream: the tile's views (L1), their
 * norms, and the dots against the P queries, 4 tokens x 4 queries per block so that each view and
 * query vector loaded feeds 4 FMAs.
 */
#include "cpuConvViews.h"
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
    int64_t m, dp, H, tiles;
    StreamTaps st;  // K taps per source, stream r's first at st.offsets[r]
    int64_t chunks;
    std::vector<float> taps;     // [chunk][K][kChunk]: the order views::dispatchStream reads them
    std::vector<float> queries;  // [m][P][dp]: one stream's queries together
};

thread_local std::vector<float> tWindow, tViews, tDots;

//! dots[t][p] = v_t . q_p over dp channels for kBlock tokens (past the tile's end their views are
//! zeros' views, computed and not stored) and PN <= kBlock queries, known at compile time: no query
//! slot is padded with zeros (a padded slot cost a fifth of the dots over P = 1..17).
template <int64_t PN>
void dotBlock(float const* v, int64_t tn, float const* q, int64_t dp, float* dots, int64_t ld)
{
    vf acc[kBlock][PN] = {};
    for (int64_t c = 0; c < dp; c += kVW)
    {
        vf qv[PN], vv[kBlock];
        for (int64_t j = 0; j < PN; ++j)
        {
            qv[j] = vload(q + j * dp + c);
        }
        for (int64_t t = 0; t < kBlock; ++t)
        {
            vv[t] = vload(v + t * dp + c);
        }
        for (int64_t t = 0; t < kBlock; ++t)
        {
            for (int64_t j = 0; j < PN; ++j)
            {
                acc[t][j] += vv[t] * qv[j];
            }
        }
    }
    for (int64_t t = 0; t < tn; ++t)
    {
        for (int64_t j = 0; j < PN; ++j)
        {
            dots[t * ld + j] = hsum(acc[t][j]);
        }
    }
}

using views::kChunk;

//! The views of R tokens for one vector of channels, from views::dispatchStream: stored, and their
//! squares summed per token.
template <int64_t R>
struct ViewSink
{
    float* views;  // [kTile][dpc]: token t's view at views + t * dpc
    vf* squares;   // [kTile]
    int64_t dpc;   // the views' row stride (whole chunks)
    int64_t c0;    // this chunk's first channel
    void begin(int64_t) {}
    void take(int64_t s, int64_t cc, vf const* acc)
    {
        for (int64_t t = 0; t < R; ++t)
        {
            vstore(views + (s + t) * dpc + c0 + cc, acc[t]);
            squares[s + t] += acc[t] * acc[t];
        }
    }
    void end(int64_t) {}
};

void tile(Prepared const& P, int64_t item)
{
    SourceScoresProblem const& p = *P.p;
    int64_t const dp = P.dp, d = p.d, m = P.m, H = P.H, b = item / P.tiles, t0 = (item % P.tiles) * kTile;
    int64_t const tn = std::min(kTile, p.T - t0), rows = H + kTile, dpc = dp;
    tWindow.resize(std::max<std::size_t>(tWindow.size(), rows * dpc));
    tViews.resize(std::max<std::size_t>(tViews.size(), kTile * dpc));
    tDots.resize(std::max<std::size_t>(tDots.size(), kTile * p.P));
    float const* win = static_cast<float const*>(p.source) + (b * p.T + t0 - H) * d;
    float* views = tViews.data();
    if (p.storage != Storage::kFloat32 || dpc != d || t0 - H < 0 || t0 + kTile > p.T)
    {
        // a float32 copy, zeros before the sequence start and past its end; else the rows are read in place
        loadWindow(tWindow.data(), dpc, p.source, p.storage, b, p.T, d, t0 - H, rows);
        win = tWindow.data();
    }
    for (int64_t r = 0; r < m; ++r)
    {
        int64_t const k = p.kernels[r];
        vf squares[kTile] = {};
        for (int64_t ch = 0; ch < P.chunks; ++ch)
        {
            ViewSink<4> sink{views, squares, dpc, ch * kChunk};
            views::dispatchStream<kTile, 4>(k, win + (H - (k - 1)) * dpc + ch * kChunk, dpc,
                                            P.taps.data() + (ch * P.st.K + P.st.offsets[r]) * kChunk, sink);
        }
        float rn[kTile];
        for (int64_t t = 0; t < tn; ++t)
        {
            rn[t] = 1.F / std::sqrt(hsum(squares[t]) / static_cast<float>(d) + p.eps);
        }
        float const* q = P.queries.data() + r * p.P * dp;
        for (int64_t t = 0; t < tn; t += kBlock)
        {
            for (int64_t j = 0; j < p.P; j += kBlock)
            {
                withConstant<kBlock>(std::min(kBlock, p.P - j), [&](auto PN) {
                    dotBlock<decltype(PN)::value>(views + t * dpc, std::min(kBlock, tn - t), q + j * dp, dpc,
                                                 tDots.data() + t * p.P + j, p.P);
                });
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
    P.st = streamTaps(p.kernels);
    P.H = P.st.kmax - 1;
    int64_t const K = P.st.K;
    P.chunks = (p.d + kChunk - 1) / kChunk;
    P.dp = P.chunks * kChunk;  // whole chunks: the views' rows, as dispatchStream writes them
    int64_t const dp = P.dp, d = p.d;
    P.taps.assign(P.chunks * K * kChunk, 0.F);
    for (int64_t ch = 0; ch < P.chunks; ++ch)
    {
        int64_t const c0 = ch * kChunk, count = std::min(kChunk, d - c0);
        for (int64_t j = 0; j < K; ++j)
        {
            loadRow(P.taps.data() + (ch * K + j) * kChunk, p.conv_weight, j * d + c0, count, kChunk, p.storage);
        }
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

/*
 * SourceViews on the CPU: one work item is one (batch row, tile of tokens). The tile's window rows
 * (kmax-1 before it, then its own) are converted to float32 once (float32 rows of whole vectors are
 * read in place); every stream reads them from L1,
 * and each output row is written once, view by view, in the [B, T, m, d] layout DepthRetrieval reads.
 */
#include "cpuKernels.h"
#include "cpuVector.h"

#include <algorithm>

namespace msar::cpu
{
namespace
{

constexpr int64_t kTile = 32;

struct Prepared
{
    SourceViewsProblem const* p;
    int64_t dp, kmax, tiles;
    bool inPlace;               // float32 rows of whole vectors: window and taps read where they lie
    std::vector<float> copied;  // [K][dp] when not in place
    float const* taps;          // [K][dp]
};

thread_local std::vector<float> tWindow, tOut;

void tile(Prepared const& P, int64_t item)
{
    SourceViewsProblem const& p = *P.p;
    int64_t const dp = P.dp, d = p.d, b = item / P.tiles, t0 = (item % P.tiles) * kTile;
    int64_t const rows = std::min(kTile, p.T - t0), span = P.kmax - 1 + rows;
    auto const m = static_cast<int64_t>(p.kernels.size());
    if (static_cast<int64_t>(tWindow.size()) < span * dp)
    {
        tWindow.resize(span * dp);
    }
    if (static_cast<int64_t>(tOut.size()) < dp)
    {
        tOut.resize(dp);
    }
    // window row kmax-1+t is token t; this tile's rows start at window row t0. float32 rows of whole
    // vectors are read where they lie (a decode step's copies cost more than its arithmetic).
    int64_t const base = (b * (P.kmax - 1 + p.T) + t0) * d;
    float const* win = tWindow.data();
    if (P.inPlace)
    {
        win = static_cast<float const*>(p.window) + base;
    }
    else
    {
        for (int64_t i = 0; i < span; ++i)
        {
            loadRow(tWindow.data() + i * dp, p.window, base + i * d, d, dp, p.storage);
        }
    }
    for (int64_t t = 0; t < rows; ++t)
    {
        int64_t const out = ((b * p.T + t0 + t) * m) * d;
        float const* self = win + (P.kmax - 1 + t) * dp;
        storeRow(p.views, out, self, d, p.storage);
        int64_t offset = 0;
        for (int64_t r = 1; r < m; ++r)
        {
            int64_t const k = p.kernels[r];
            float const* first = self - (k - 1) * dp;  // tap j multiplies token t-(k-1-j)
            for (int64_t c = 0; c < dp; c += kVW)
            {
                vf acc = vf{};
                for (int64_t j = 0; j < k; ++j)
                {
                    acc += vload(P.taps + (offset + j) * dp + c) * vload(first + j * dp + c);
                }
                vstore(tOut.data() + c, acc);
            }
            storeRow(p.views, out + r * d, tOut.data(), d, p.storage);
            offset += k;
        }
    }
}

} // namespace

void sourceViews(SourceViewsProblem const& p, Parallel const& parallel)
{
    StreamTaps const st = streamTaps(p.kernels);
    int64_t const K = st.K, kmax = st.kmax;
    int64_t const dp = padded(p.d);
    Prepared P{&p, dp, kmax, (p.T + kTile - 1) / kTile, p.storage == Storage::kFloat32 && dp == p.d, {}, nullptr};
    if (P.inPlace)
    {
        P.taps = static_cast<float const*>(p.conv_weight);
    }
    else
    {
        P.copied.assign(K * dp, 0.F);
        for (int64_t j = 0; j < K; ++j)
        {
            loadRow(P.copied.data() + j * dp, p.conv_weight, j * p.d, p.d, dp, p.storage);
        }
        P.taps = P.copied.data();
    }
    // A decode step's views (a few rows) are over in microseconds: the pool would cost more.
    std::size_t const batch = p.B * p.T <= 8 ? 1 : 0;
    parallel.run(static_cast<std::size_t>(p.B * P.tiles), batch,
                 [](void* data, std::size_t item) { tile(*static_cast<Prepared const*>(data), static_cast<int64_t>(item)); },
                 &P);
}

} // namespace msar::cpu

/*
 * SourceViews on the CPU: one work item is one (batch row, tile of tokens). The tile's window rows
 * (kmax-1 before it, then its own) come from the history and the source where they lie (float32 rows
 * of whole vectors; others are converted to float32 once), as two runs of rows. Every
 * stream reads them from L1, and each output row is written once, view by view, in the [B, T, m, d]
 * layout DepthRetrieval reads. No [history; source] window is ever built: in a decode step that copy
 * (a Concat node per source) cost more than the views.
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
    int64_t const* offsets;     // stream r's first tap row
    bool inPlace;               // float32 rows of whole vectors: window and taps read where they lie
    std::vector<float> copied;  // [K][dp] when not in place
    float const* taps;          // [K][dp]
};

thread_local std::vector<float> tWindow, tOut;

//! stream r's taps over window rows first.. of `rows` rows, in two affine runs (a pointer table cost a
//! load per multiply-add): rows below `split` at lo + row * dp, the rest at hi + (row - split) * dp.
inline void convRow(float* out, float const* taps, float const* lo, float const* hi, int64_t split, int64_t first,
                    int64_t k, int64_t dp)
{
    int64_t const inLo = std::clamp<int64_t>(split - first, 0, k);
    float const* a = lo + first * dp;
    float const* b = hi + (first + inLo - split) * dp;
    for (int64_t c = 0; c < dp; c += kVW)
    {
        vf acc = vf{};
        for (int64_t j = 0; j < inLo; ++j)
        {
            acc += vload(taps + j * dp + c) * vload(a + j * dp + c);
        }
        for (int64_t j = inLo; j < k; ++j)
        {
            acc += vload(taps + j * dp + c) * vload(b + (j - inLo) * dp + c);
        }
        vstore(out + c, acc);
    }
}

void tile(Prepared const& P, int64_t item)
{
    SourceViewsProblem const& p = *P.p;
    int64_t const dp = P.dp, d = p.d, b = item / P.tiles, t0 = (item % P.tiles) * kTile, hist = P.kmax - 1;
    int64_t const rows = std::min(kTile, p.T - t0), span = hist + rows;
    auto const m = static_cast<int64_t>(p.kernels.size());
    if (static_cast<int64_t>(tWindow.size()) < span * dp)
    {
        tWindow.resize(span * dp);
    }
    if (static_cast<int64_t>(tOut.size()) < dp)
    {
        tOut.resize(dp);
    }
    // Window row w is token t0 + w - (kmax-1): the first `split` rows are history rows t0.., then tokens.
    int64_t const split = std::max<int64_t>(0, hist - t0);
    float const* lo = tWindow.data();
    float const* hi = tWindow.data() + split * dp;
    int64_t const* mask = p.mask + b * p.T;
    // a padded token anywhere in the window's token rows: the window is built, padding as zero rows
    int64_t const* const end = mask + t0 + rows;
    bool const padded = std::find(mask + std::max<int64_t>(0, t0 - hist), end, 0) != end;
    if (P.inPlace && !padded)
    {
        hi = static_cast<float const*>(p.source) + (b * p.T + t0 + split - hist) * d;
        lo = split > 0 ? static_cast<float const*>(p.history) + (b * hist + t0) * d : hi;  // no history rows: unused
        if (p.T <= 2)  // decode: cold rows, and the conv loops walk all of them at once, too many streams for
        {              // the hardware prefetcher (cold decode-size calls: 0.85-0.89x the time with this)
            prefetchRow(lo, split * dp);
            prefetchRow(hi, (span - split) * dp);
        }
    }
    else
    {
        for (int64_t w = 0; w < span; ++w)
        {
            int64_t const t = t0 + w - hist;
            if (t >= 0 && mask[t] == 0)
            {
                std::fill_n(tWindow.data() + w * dp, dp, 0.F);  // a padded token: a zero row (a Where's zero)
                continue;
            }
            loadRow(tWindow.data() + w * dp, t < 0 ? p.history : p.source,
                    t < 0 ? (b * hist + hist + t) * d : (b * p.T + t) * d, d, dp, p.storage);
        }
    }
    for (int64_t t = 0; t < rows; ++t)
    {
        int64_t const out = ((b * p.T + t0 + t) * m) * d;
        int64_t const self = hist + t;
        storeRow(p.views, out, self < split ? lo + self * dp : hi + (self - split) * dp, d, p.storage);
        for (int64_t r = 1; r < m; ++r)
        {
            int64_t const k = p.kernels[r];  // tap j multiplies token t-(k-1-j), window row self-(k-1)+j
            convRow(tOut.data(), P.taps + P.offsets[r] * dp, lo, hi, split, self - (k - 1), k, dp);
            storeRow(p.views, out + r * d, tOut.data(), d, p.storage);
        }
    }
}

} // namespace

void sourceViews(SourceViewsProblem const& p, Parallel const& parallel)
{
    StreamTaps const st = streamTaps(p.kernels);
    int64_t const K = st.K, kmax = st.kmax;
    int64_t const dp = padded(p.d);
    Prepared P{&p, dp, kmax, (p.T + kTile - 1) / kTile, st.offsets, p.storage == Storage::kFloat32 && dp == p.d, {}, nullptr};
    if (P.inPlace)
    {
        P.taps = static_cast<float const*>(p.conv_weight);
        if (p.T <= 2)
        {
            prefetchRow(P.taps, K * dp);
        }
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
    // A batch-1 decode step's views (a row) are over in microseconds: the pool would cost more.
    std::size_t const batch = p.B * p.T <= 2 ? 1 : 0;
    parallel.run(static_cast<std::size_t>(p.B * P.tiles), batch,
                 [](void* data, std::size_t item) { tile(*static_cast<Prepared const*>(data), static_cast<int64_t>(item)); },
                 &P);
}

} // namespace msar::cpu

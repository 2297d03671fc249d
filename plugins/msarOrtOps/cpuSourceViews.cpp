/*
 * SourceViews on the CPU: one work item is one (batch row, tile of tokens). The tile's window rows
 * (kmax-1 before it, then its own) come from `past` and `x` through a table of row pointers, so the
 * window is never assembled; float32 rows of whole vectors are read where they lie, other rows are
 * converted to float32 once. Every stream reads them from L1, and each output row is written once,
 * view by view, in the [B, T, m, d] layout DepthRetrieval reads. `present` (the window's last kmax-1
 * rows) is a copy of bytes: no rounding.
 */
#include "cpuKernels.h"
#include "cpuVector.h"

#include <algorithm>
#include <cstring>

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
thread_local std::vector<float const*> tRows;

//! Element offset of window row w (0 .. kmax-2: past, then x) of batch row b, and its tensor.
inline void const* windowRow(SourceViewsProblem const& p, int64_t kmax, int64_t b, int64_t w, int64_t& offset)
{
    if (w < kmax - 1)
    {
        offset = (b * (kmax - 1) + w) * p.d;
        return p.past;
    }
    offset = (b * p.T + w - (kmax - 1)) * p.d;
    return p.x;
}

void tile(Prepared const& P, int64_t item)
{
    SourceViewsProblem const& p = *P.p;
    int64_t const dp = P.dp, d = p.d, b = item / P.tiles, t0 = (item % P.tiles) * kTile;
    int64_t const rows = std::min(kTile, p.T - t0), span = P.kmax - 1 + rows;
    auto const m = static_cast<int64_t>(p.kernels.size());
    if (static_cast<int64_t>(tRows.size()) < span)
    {
        tRows.resize(span);
    }
    if (!P.inPlace && static_cast<int64_t>(tWindow.size()) < span * dp)
    {
        tWindow.resize(span * dp);
    }
    if (static_cast<int64_t>(tOut.size()) < dp)
    {
        tOut.resize(dp);
    }
    // this tile's rows start at window row t0
    for (int64_t i = 0; i < span; ++i)
    {
        int64_t offset;
        void const* src = windowRow(p, P.kmax, b, t0 + i, offset);
        if (P.inPlace)
        {
            tRows[i] = static_cast<float const*>(src) + offset;
        }
        else
        {
            loadRow(tWindow.data() + i * dp, src, offset, d, dp, p.storage);
            tRows[i] = tWindow.data() + i * dp;
        }
    }
    float const* const* win = tRows.data();
    for (int64_t t = 0; t < rows; ++t)
    {
        int64_t const out = ((b * p.T + t0 + t) * m) * d;
        int64_t const self = P.kmax - 1 + t;
        storeRow(p.views, out, win[self], d, p.storage);
        int64_t offset = 0;
        for (int64_t r = 1; r < m; ++r)
        {
            int64_t const k = p.kernels[r];
            float const* const* first = win + self - (k - 1);  // tap j multiplies token t-(k-1-j)
            for (int64_t c = 0; c < dp; c += kVW)
            {
                vf acc = vf{};
                for (int64_t j = 0; j < k; ++j)
                {
                    acc += vload(P.taps + (offset + j) * dp + c) * vload(first[j] + c);
                }
                vstore(tOut.data() + c, acc);
            }
            storeRow(p.views, out + r * d, tOut.data(), d, p.storage);
            offset += k;
        }
    }
}

//! present[b] = the window's rows T .. T+kmax-2, copied as bytes.
void keepState(SourceViewsProblem const& p, int64_t kmax)
{
    std::size_t const size = p.storage == Storage::kFloat32 ? sizeof(float) : sizeof(uint16_t);
    for (int64_t b = 0; b < p.B; ++b)
    {
        for (int64_t i = 0; i < kmax - 1; ++i)
        {
            int64_t offset;
            void const* src = windowRow(p, kmax, b, p.T + i, offset);
            std::memcpy(static_cast<char*>(p.present) + (b * (kmax - 1) + i) * p.d * size,
                        static_cast<char const*>(src) + offset * size, p.d * size);
        }
    }
}

} // namespace

void sourceViews(SourceViewsProblem const& p, Parallel const& parallel)
{
    auto const [K, kmax] = streamTaps(p.kernels);
    keepState(p, kmax);
    if (p.T == 0)
    {
        return;
    }
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

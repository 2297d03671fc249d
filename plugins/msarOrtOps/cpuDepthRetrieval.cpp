/*
 * DepthRetrieval on the CPU: one work item is one (batch row, token, stream).
 * Each source's view row is read once; its score and its contribution to the
 * running softmax sum are taken while the row is in L1.
 */
#include "cpuKernels.h"
#include "cpuVector.h"

#include <limits>

namespace msar::cpu
{
namespace
{

struct Prepared
{
    DepthRetrievalProblem const* p;
    int64_t dp;
    std::vector<float> query;  // [m][dp]
};

thread_local std::vector<float> tRow, tSum;

void row(Prepared const& P, int64_t item)
{
    DepthRetrievalProblem const& p = *P.p;
    int64_t const dp = P.dp, d = p.d, r = item % p.m;
    if (static_cast<int64_t>(tRow.size()) < dp)
    {
        tRow.resize(dp);
        tSum.resize(dp);
    }
    std::fill_n(tSum.data(), dp, 0.F);
    float max = -std::numeric_limits<float>::infinity(), den = 0.F;
    float const* q = P.query.data() + r * dp;
    // float32 rows of whole vectors are read where they lie: a copy would double a decode step's traffic
    bool const inPlace = p.storage == Storage::kFloat32 && dp == d;
    for (int64_t i = 0; i < p.n; ++i)
    {
        if (inPlace && i + 1 < p.n)
        {
            prefetchRow(static_cast<float const*>(p.views[i + 1]) + item * d, d);
        }
        float const* v = inPlace ? static_cast<float const*>(p.views[i]) + item * d : tRow.data();
        if (!inPlace)
        {
            loadRow(tRow.data(), p.views[i], item * d, d, dp, p.storage);
        }
        float dot, squares;
        dotAndSquares(q, v, dp, dot, squares);
        onlineAdd(tSum.data(), v, dp, score(dot, squares, d, p.eps), max, den);
    }
    float const inv = 1.F / den;
    for (int64_t c = 0; c < d; ++c)
    {
        tSum[c] *= inv;
    }
    storeRow(p.z, item * d, tSum.data(), d, p.storage);
}

} // namespace

void depthRetrieval(DepthRetrievalProblem const& p, Parallel const& parallel)
{
    Prepared P{&p, padded(p.d), {}};
    P.query.assign(p.m * P.dp, 0.F);
    for (int64_t r = 0; r < p.m; ++r)
    {
        loadRow(P.query.data() + r * P.dp, p.query, r * p.d, p.d, P.dp, p.storage);
    }
    // A batch-1 decode step's retrieval (one token, n x m x d floats) is over in microseconds: handing
    // it to the pool costs more than it saves. A batch-8 step's reads cold views for tens of us.
    constexpr int64_t kSerialFloats = int64_t{1} << 16;
    std::size_t const batch = p.B * p.T * p.m * p.n * p.d <= kSerialFloats ? 1 : 0;
    parallel.run(static_cast<std::size_t>(p.B * p.T * p.m), batch,
                 [](void* data, std::size_t item) { row(*static_cast<Prepared const*>(data), static_cast<int64_t>(item)); },
                 &P);
}

} // namespace msar::cpu

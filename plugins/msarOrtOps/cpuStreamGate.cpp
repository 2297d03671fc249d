/*
 * StreamGate on the CPU: one work item is one (batch row, token). Its m stream rows are converted
 * to float32 once; the m x m gate dot products and the gated sum read them from L1.
 */
#include "cpuKernels.h"
#include "cpuVector.h"

#include <cmath>

namespace msar::cpu
{
namespace
{

constexpr int64_t kMaxStreams = 8;  // streamTaps' bound

struct Prepared
{
    StreamGateProblem const* p;
    int64_t dp;
    std::vector<float> copied;  // the weight as float32 rows of dp, when it cannot be read in place
    float const* weight;        // [m][m][dp]: weight[o][r] is W[o, r*d:(r+1)*d]
    bool inPlace;               // float32 rows of whole vectors: z and the weight read where they lie
    std::vector<float> bias;    // [m]
    float scale;
};

thread_local std::vector<float> tZ, tH;

void row(Prepared const& P, int64_t item)
{
    StreamGateProblem const& p = *P.p;
    int64_t const dp = P.dp, d = p.d, m = p.m;
    // Each buffer on its own size: a thread that ran a gate of more streams keeps a tZ of m * dp
    // large enough for a wider gate of fewer streams, whose row needs the longer tH.
    if (static_cast<int64_t>(tZ.size()) < m * dp)
    {
        tZ.resize(m * dp);
    }
    if (static_cast<int64_t>(tH.size()) < dp)
    {
        tH.resize(dp);
    }
    float const* Z = tZ.data();  // [m][dp]
    if (P.inPlace)
    {
        Z = static_cast<float const*>(p.z) + item * m * d;
    }
    else
    {
        for (int64_t r = 0; r < m; ++r)
        {
            loadRow(tZ.data() + r * dp, p.z, (item * m + r) * d, d, dp, p.storage);
        }
    }
    std::fill_n(tH.data(), dp, 0.F);
    // every logit's sum at once: m independent FMA chains (one chain per logit left a prefill row
    // waiting on FMA latency), and each z vector loaded once for all of them
    vf acc[kMaxStreams] = {};
    for (int64_t r = 0; r < m; ++r)
    {
        float const* z = Z + r * dp;
        for (int64_t c = 0; c < dp; c += kVW)
        {
            vf const zv = vload(z + c);
            for (int64_t o = 0; o < m; ++o)
            {
                acc[o] += vload(P.weight + (o * m + r) * dp + c) * zv;
            }
        }
    }
    for (int64_t o = 0; o < m; ++o)
    {
        float const g = 1.F / (1.F + std::exp(-(P.scale * hsum(acc[o]) + P.bias[o])));
        vf const gv = vsplat(g);
        float const* z = Z + o * dp;
        for (int64_t c = 0; c < dp; c += kVW)
        {
            vstore(tH.data() + c, vload(tH.data() + c) + gv * vload(z + c));
        }
    }
    storeRow(p.h, item * d, tH.data(), d, p.storage);
}

} // namespace

void streamGate(StreamGateProblem const& p, Parallel const& parallel)
{
    Prepared P{&p, padded(p.d), {}, nullptr, p.storage == Storage::kFloat32 && padded(p.d) == p.d,
               std::vector<float>(p.m), 0.F};
    if (P.inPlace)
    {
        // [m, m*d] in nn.Linear layout is already [m][m][d]: read where it lies (a decode step would
        // otherwise convert every mixer's weight on every call)
        P.weight = static_cast<float const*>(p.gate_weight);
    }
    else
    {
        P.copied.assign(p.m * p.m * P.dp, 0.F);
        for (int64_t o = 0; o < p.m; ++o)
        {
            for (int64_t r = 0; r < p.m; ++r)
            {
                loadRow(P.copied.data() + (o * p.m + r) * P.dp, p.gate_weight, (o * p.m + r) * p.d, p.d, P.dp, p.storage);
            }
        }
        P.weight = P.copied.data();
    }
    loadRow(P.bias.data(), p.gate_bias, 0, p.m, p.m, p.storage);
    loadRow(&P.scale, p.gate_scale, 0, 1, 1, p.storage);
    // A batch-1 decode step's gate (a token row) is over in microseconds: the pool would cost more.
    std::size_t const batch = p.B * p.T <= 4 ? 1 : 0;
    parallel.run(static_cast<std::size_t>(p.B * p.T), batch,
                 [](void* data, std::size_t item) { row(*static_cast<Prepared const*>(data), static_cast<int64_t>(item)); },
                 &P);
}

} // namespace msar::cpu

/*
 * One stream's causal conv views for a tile of tokens, one vector of channels at a time, with the
 * loops unrolled for each kernel size up to kUnrolled (taps and window rows then sit in registers
 * and each is loaded once per kRegs tokens); larger kernels take a loop with a run-time bound.
 * A Sink consumes the views: scores in pass 1, the weighted sum z in pass 3 (cpuFusedMixer.cpp).
 */
#ifndef MSAR_ORT_CPU_CONV_VIEWS_H
#define MSAR_ORT_CPU_CONV_VIEWS_H

#include "cpuVector.h"

namespace msar::cpu::views
{

constexpr int64_t kChunk = 64;     // channels per chunk: a tile's z, window and taps for them fit L1
constexpr int64_t kUnrolled = 16;  // kernel sizes up to this run fully unrolled loops
static_assert(kChunk % kVW == 0, "a chunk is whole vectors");

//! acc[t] = sum_j w[j] x[t + j], t < R: one stream's views of R tokens for one vector of channels.
//! Each row of x and each tap is loaded once (x: rows R + k - 1, stride rs; w: k taps, stride kChunk).
template <int64_t K, int64_t R>
__attribute__((always_inline)) inline void conv(float const* x, int64_t rs, float const* w, vf* acc)
{
    vf taps[K];
#pragma GCC unroll 16
    for (int64_t j = 0; j < K; ++j)
    {
        taps[j] = vload(w + j * kChunk);
    }
#pragma GCC unroll 4
    for (int64_t t = 0; t < R; ++t)
    {
        acc[t] = vf{};
    }
#pragma GCC unroll 32
    for (int64_t u = 0; u < R + K - 1; ++u)
    {
        vf const xv = vload(x + u * rs);
#pragma GCC unroll 4
        for (int64_t t = 0; t < R; ++t)
        {
            if (u - t >= 0 && u - t < K)
            {
                acc[t] += taps[u - t] * xv;
            }
        }
    }
}

//! The same for a kernel size known only at run time (sizes above kUnrolled).
template <int64_t R>
__attribute__((always_inline)) inline void convAnyK(int64_t k, float const* x, int64_t rs, float const* w, vf* acc)
{
    for (int64_t t = 0; t < R; ++t)
    {
        acc[t] = vf{};
    }
    for (int64_t j = 0; j < k; ++j)
    {
        vf const tap = vload(w + j * kChunk);
        for (int64_t t = 0; t < R; ++t)
        {
            acc[t] += tap * vload(x + (j + t) * rs);
        }
    }
}

//! What one stream does with its views, chunk by chunk: pass 1 (ScoreSink) or pass 3 (ZSink).
//! rows: the chunk's window at the stream's first tap row for token 0; taps: the stream's first tap.
template <int64_t K, int64_t TILE, int64_t R, typename Sink>
__attribute__((flatten)) void streamOverTile(int64_t k, float const* rows, int64_t rs, float const* taps, Sink& sink)
{
    for (int64_t s = 0; s < TILE; s += R)
    {
        sink.begin(s);
        for (int64_t cc = 0; cc < kChunk; cc += kVW)
        {
            vf acc[R];
            if constexpr (K == 1)
            {
                for (int64_t t = 0; t < R; ++t)
                {
                    acc[t] = vload(rows + (s + t) * rs + cc);
                }
            }
            else if constexpr (K > 0)
            {
                conv<K, R>(rows + s * rs + cc, rs, taps + cc, acc);
            }
            else
            {
                convAnyK<R>(k, rows + s * rs + cc, rs, taps + cc, acc);
            }
            sink.take(s, cc, acc);
        }
        sink.end(s);
    }
}

template <int64_t TILE, int64_t R, typename Sink>
void dispatchStream(int64_t k, float const* rows, int64_t rs, float const* taps, Sink& sink)
{
    auto const unrolled = [&](auto K) { streamOverTile<decltype(K)::value, TILE, R>(k, rows, rs, taps, sink); };
    if (!withConstant<kUnrolled>(k, unrolled))
    {
        streamOverTile<0, TILE, R>(k, rows, rs, taps, sink);
    }
}

} // namespace msar::cpu::views

#endif // MSAR_ORT_CPU_CONV_VIEWS_H

/*
 * SIMD vectors through GCC/Clang vector extensions: the width follows the target
 * the library is compiled for (AVX-512: 16 floats, else 8), and every load or store
 * is a memcpy, so nothing needs to be aligned. The one exception is float16
 * conversion (halfToFloat, floatToHalf), written with F16C intrinsics: GCC 12 for a
 * CPU with AVX512-FP16 (-march=native on a Sapphire Rapids Xeon) makes the plain
 * loop, and __builtin_convertvector, one scalar vcvtsh2ss per element.
 */
#ifndef MSAR_ORT_CPU_VECTOR_H
#define MSAR_ORT_CPU_VECTOR_H

#include "cpuKernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#if defined(__F16C__)
#include <immintrin.h>
#endif
#include <type_traits>
#include <utility>
#include <vector>

namespace msar::cpu
{

#if defined(__AVX512F__)
constexpr int64_t kVW = 16;
#else
constexpr int64_t kVW = 8;
#endif
typedef float vf __attribute__((vector_size(kVW * sizeof(float))));

inline vf vload(float const* p)
{
    vf v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

inline void vstore(float* p, vf v)
{
    std::memcpy(p, &v, sizeof v);
}

inline vf vsplat(float x)
{
    return x - vf{};  // not vf{} + x: +0 is no identity for -0, so that form costs an add per splat
}

//! Calls f(std::integral_constant<int64_t, v>{}) when 1 <= v <= N, so that f can use v as a
//! compile-time loop bound, and says whether it did (the unrolled cases of a size known at run time).
template <int64_t N, typename F>
inline bool withConstant(int64_t v, F&& f)
{
    return [&]<int64_t... I>(std::integer_sequence<int64_t, I...>) {
        return ((v == I + 1 && (f(std::integral_constant<int64_t, I + 1>{}), true)) || ...);
    }(std::make_integer_sequence<int64_t, N>{});
}

//! The lanes' sum as a tree of halvings (a lane-by-lane loop compiles to a chain of kVW dependent adds).
inline float hsum(vf v)
{
    typedef float v8 __attribute__((vector_size(8 * sizeof(float))));
    typedef float v4 __attribute__((vector_size(4 * sizeof(float))));
#if defined(__AVX512F__)
    v8 const h8 = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                  __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
#else
    v8 const h8 = v;
#endif
    v4 const h4 = __builtin_shufflevector(h8, h8, 0, 1, 2, 3) + __builtin_shufflevector(h8, h8, 4, 5, 6, 7);
    return (h4[0] + h4[2]) + (h4[1] + h4[3]);
}

//! d rounded up to whole vectors: the scratch rows' stride.
inline int64_t padded(int64_t d)
{
    return (d + kVW - 1) / kVW * kVW;
}

inline void halfToFloat(float* dst, _Float16 const* h, int64_t count)
{
    int64_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= count; i += 8)
    {
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<__m128i const*>(h + i))));
    }
#endif
    for (; i < count; ++i)
    {
        dst[i] = static_cast<float>(h[i]);
    }
}

//! Rounds to nearest even, as static_cast<_Float16> does.
inline void floatToHalf(_Float16* h, float const* src, int64_t count)
{
    int64_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= count; i += 8)
    {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(h + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
#endif
    for (; i < count; ++i)
    {
        h[i] = static_cast<_Float16>(src[i]);
    }
}

//! Elements [offset, offset + count) of a float32 or float16 tensor into float32; the pad up to
//! `padTo` is zeroed.
inline void loadRow(float* dst, void const* src, int64_t offset, int64_t count, int64_t padTo, Storage s)
{
    if (s == Storage::kFloat32)
    {
        std::memcpy(dst, static_cast<float const*>(src) + offset, count * sizeof(float));
    }
    else if (s == Storage::kFloat16)
    {
        halfToFloat(dst, static_cast<_Float16 const*>(src) + offset, count);
    }
    else
    {
        uint16_t const* h = static_cast<uint16_t const*>(src) + offset;
        for (int64_t i = 0; i < count; ++i)
        {
            uint32_t const bits = static_cast<uint32_t>(h[i]) << 16;  // bfloat16 is float32's upper half
            std::memcpy(dst + i, &bits, sizeof bits);
        }
    }
    for (int64_t i = count; i < padTo; ++i)
    {
        dst[i] = 0.F;
    }
}

inline void storeRow(void* dst, int64_t offset, float const* src, int64_t count, Storage s)
{
    if (s == Storage::kFloat32)
    {
        std::memcpy(static_cast<float*>(dst) + offset, src, count * sizeof(float));
    }
    else if (s == Storage::kFloat16)
    {
        floatToHalf(static_cast<_Float16*>(dst) + offset, src, count);
    }
    else
    {
        uint16_t* h = static_cast<uint16_t*>(dst) + offset;
        for (int64_t i = 0; i < count; ++i)
        {
            uint32_t bits;
            std::memcpy(&bits, src + i, sizeof bits);
            if ((bits & 0x7fffffffU) > 0x7f800000U)
            {
                h[i] = static_cast<uint16_t>((bits >> 16) | 0x40U);  // NaN stays NaN
            }
            else
            {
                h[i] = static_cast<uint16_t>((bits + 0x7fffU + ((bits >> 16) & 1U)) >> 16);  // round to nearest even
            }
        }
    }
}

//! Rows t0 .. t0 + count - 1 of batch row b of a [B, T, d] float32 or float16 tensor into dst as float32
//! rows `stride` apart (the pad zeroed), rows before t = 0 or past T all zeros: a conv window that
//! reaches past the sequence's edges.
inline void loadWindow(float* dst, int64_t stride, void const* src, Storage s, int64_t b, int64_t T, int64_t d,
                       int64_t t0, int64_t count)
{
    for (int64_t u = 0; u < count; ++u)
    {
        int64_t const t = t0 + u;
        if (t < 0 || t >= T)
        {
            std::fill_n(dst + u * stride, stride, 0.F);
        }
        else
        {
            loadRow(dst + u * stride, src, (b * T + t) * d, d, stride, s);
        }
    }
}

//! The scalar gate's parameters (FusedMixer, ScoredMixer) in float32: W as [m out][m in][dp] (stream
//! `in`'s d-block of logit `out`, padded), bias[m] and the scale.
// noinline: inlined into a caller whose bias and scale are members, GCC 12 warns of a false overflow
__attribute__((noinline)) inline void loadGate(void const* weight, void const* bias, void const* scale, int64_t m, int64_t d, int64_t dp,
                     Storage s, std::vector<float>& w, float* b, float* a)
{
    w.assign(m * m * dp, 0.F);
    for (int64_t o = 0; o < m; ++o)
    {
        for (int64_t r = 0; r < m; ++r)
        {
            loadRow(w.data() + (o * m + r) * dp, weight, o * m * d + r * d, d, dp, s);
        }
    }
    loadRow(b, bias, 0, m, m, s);
    loadRow(a, scale, 0, 1, 1, s);
}

//! Asks for a row of `count` floats ahead of its use: the rows a decode step reads lie in separate
//! tensors, evicted by the matmuls between them, and too short for the hardware prefetcher to ramp up.
inline void prefetchRow(float const* row, int64_t count)
{
    for (int64_t c = 0; c < count; c += 16)  // one per 64-byte line
    {
        __builtin_prefetch(row + c);
    }
}

//! q . v and v . v over `dp` padded channels, in four partial sums each: one sum would be a chain of
//! dp / kVW dependent FMAs (a decode step's retrieval waited on it, not on its reads).
inline void dotAndSquares(float const* q, float const* v, int64_t dp, float& dot, float& squares)
{
    vf a[4] = {}, b[4] = {};
    int64_t c = 0;
    for (; c + 4 * kVW <= dp; c += 4 * kVW)
    {
        for (int64_t j = 0; j < 4; ++j)
        {
            vf const x = vload(v + c + j * kVW);
            a[j] += vload(q + c + j * kVW) * x;
            b[j] += x * x;
        }
    }
    for (; c < dp; c += kVW)
    {
        vf const x = vload(v + c);
        a[0] += vload(q + c) * x;
        b[0] += x * x;
    }
    dot = hsum((a[0] + a[1]) + (a[2] + a[3]));
    squares = hsum((b[0] + b[1]) + (b[2] + b[3]));
}

//! The retrieval score q . RMSNorm(v) = (q . v) / sqrt(mean(v^2) + eps), over the d real channels.
inline float score(float dot, float squares, int64_t d, float eps)
{
    return dot / std::sqrt(squares / static_cast<float>(d) + eps);
}

//! Folds one more source (view v, score s) into a running max-subtracted softmax sum:
//! z = sum_i exp(s_i - max) v_i and den = sum_i exp(s_i - max), rescaled when the max grows.
//! z starts at zero and max at -inf (the first source rescales by exp(-inf) = 0).
inline void onlineAdd(float* z, float const* v, int64_t dp, float s, float& max, float& den)
{
    if (s > max)
    {
        float const scale = std::exp(max - s);
        vf const sc = vsplat(scale);
        for (int64_t c = 0; c < dp; c += kVW)
        {
            vstore(z + c, vload(z + c) * sc + vload(v + c));
        }
        den = den * scale + 1.F;
        max = s;
    }
    else
    {
        float const w = std::exp(s - max); // NaN scores land here and poison z, as in the reference
        vf const wv = vsplat(w);
        for (int64_t c = 0; c < dp; c += kVW)
        {
            vstore(z + c, vload(z + c) + wv * vload(v + c));
        }
        den += w;
    }
}

} // namespace msar::cpu

#endif // MSAR_ORT_CPU_VECTOR_H

/*
 * FusedMixer's own host rules (no TensorRT or CUDA types): attribute
 * validation, the creator-side parse and the shape rule. Names, the field
 * table, defaults and serialisation are generated (common/msarOpContracts.h).
 */
#ifndef MSAR_FUSED_MIXER_RULES_H
#define MSAR_FUSED_MIXER_RULES_H

#include "../common/msarPluginLogic.h"

namespace msar
{

//! The generated fields (msarOpContracts.h) plus the rules on them.
struct FusedMixerAttrs : FusedMixerAttrFields
{
    int32_t nStreams() const
    {
        return static_cast<int32_t>(stream_kernels.size());
    }

    //! K = sum(stream_kernels[1:]): taps per channel and source in conv_weight.
    int32_t taps() const
    {
        int32_t k = 0;
        for (size_t r = 1; r < stream_kernels.size(); ++r)
        {
            k += stream_kernels[r];
        }
        return k;
    }

    int32_t kmax() const
    {
        int32_t k = 1;
        for (auto v : stream_kernels)
        {
            k = v > k ? v : k;
        }
        return k;
    }

    void validate() const
    {
        char const* op = kFusedMixerName;
        if (stream_kernels.empty())
        {
            fail(op, ": stream_kernels is required (INTS, first is 1), e.g. [1, 4, 8, 12]");
        }
        if (stream_kernels.size() > static_cast<size_t>(kMaxStreams))
        {
            fail(op, ": ", stream_kernels.size(), " streams given, this plugin supports at most ", kMaxStreams);
        }
        if (stream_kernels[0] != 1)
        {
            fail(op, ": stream_kernels[0] must be 1 (stream 0 is the identity), got ", stream_kernels[0]);
        }
        for (size_t r = 1; r < stream_kernels.size(); ++r)
        {
            if (stream_kernels[r] < 1 || stream_kernels[r] > kMaxKernel)
            {
                fail(op, ": stream_kernels[", r, "] = ", stream_kernels[r], " is outside 1..", kMaxKernel);
            }
        }
        checkEps(op, eps);
    }
};

inline FusedMixerAttrs parseFusedMixerFields(FieldView const* fields, int32_t nbFields)
{
    return parseAttrs<FusedMixerAttrs>(kFusedMixerName, kFusedMixerFields, fields, nbFields,
        [](FusedMixerAttrs& a, FieldView const& f) { return readFusedMixerField(kFusedMixerName, a, f); });
}

//! The dimensions FusedMixer runs with; -1 where unknown at build time.
struct FusedMixerDims
{
    int32_t n{0};     //!< sources
    int32_t m{0};     //!< streams
    int32_t taps{0};  //!< K
    int64_t rows{-1}; //!< N (conv_weight rows, >= n)
    int64_t batch{-1};
    int64_t seq{-1};
    int64_t d{-1};
};

/*!
 * FusedMixer inputs: query [m, d], gate_weight [m, m*d], gate_bias [m],
 * gate_scale [] (a one-element [1] is accepted), conv_weight [N, K, d] with
 * N >= n and K = sum(stream_kernels[1:]), sources x n: [B, T, d], all equal.
 * Output: h [B, T, d].
 */
inline FusedMixerDims checkFusedMixerShapes(
    FusedMixerAttrs const& a, Shape const* in, int32_t nbInputs, int32_t nbOutputs, bool exact)
{
    char const* op = kFusedMixerName;
    if (nbOutputs != 1)
    {
        fail(op, ": has 1 output, TensorRT asked for ", nbOutputs);
    }
    if (nbInputs < kFusedMixerFixedInputs + 1)
    {
        fail(op, ": needs query, gate_weight, gate_bias, gate_scale, conv_weight and at least one source; got ",
            nbInputs, " inputs");
    }
    FusedMixerDims r;
    r.n = nbInputs - kFusedMixerFixedInputs;
    r.m = a.nStreams();
    r.taps = a.taps();
    if (r.n > kMaxSources)
    {
        fail(op, ": ", r.n, " sources given, this plugin supports at most ", kMaxSources);
    }
    Shape const& q = in[0];
    Shape const& gw = in[1];
    Shape const& gb = in[2];
    Shape const& gs = in[3];
    Shape const& cw = in[4];

    expectRank(op, "query", q, 2);
    expectDim(op, "query", q, 0, r.m, "len(stream_kernels)");
    r.d = q.d[1];
    expectRank(op, "sources_0", in[5], 3);
    if (!known(r.d))
    {
        r.d = in[5].d[2];
    }
    if (known(r.d) && r.d < 1)
    {
        fail(op, ": model width d must be >= 1, got ", r.d);
    }

    expectRank(op, "gate_weight", gw, 2);
    expectDim(op, "gate_weight", gw, 0, r.m, "m");
    expectDim(op, "gate_weight", gw, 1, known(r.d) ? r.m * r.d : -1, "m*d");
    expectRank(op, "gate_bias", gb, 1);
    expectDim(op, "gate_bias", gb, 0, r.m, "m");
    if (!(gs.nbDims == 0 || (gs.nbDims == 1 && (gs.d[0] == 1 || !known(gs.d[0])))))
    {
        fail(op, ": input 'gate_scale' must be a scalar [], got ", str(gs));
    }
    expectRank(op, "conv_weight", cw, 3);
    expectDim(op, "conv_weight", cw, 1, r.taps, "sum(stream_kernels[1:])");
    expectDim(op, "conv_weight", cw, 2, r.d, "d");
    r.rows = cw.d[0];
    if (known(r.rows) && r.rows < r.n)
    {
        fail(op, ": conv_weight has ", r.rows, " rows but ", r.n, " sources are given (needs N >= n)");
    }

    for (int32_t i = 0; i < kFusedMixerFixedInputs; ++i)
    {
        expectExact(op, kFusedMixerFixedInputNames[i], in[i], exact);
    }
    for (int32_t i = 0; i < r.n; ++i)
    {
        Shape const& x = in[kFusedMixerFixedInputs + i];
        InputName const name{"sources", i};
        expectRank(op, name, x, 3);
        expectDim(op, name, x, 2, r.d, "d");
        expectExact(op, name, x, exact);
        expectBatchAndSeq(op, name, x, r.batch, r.seq);
    }
    return r;
}

} // namespace msar

#endif // MSAR_FUSED_MIXER_RULES_H

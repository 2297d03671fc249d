/*
 * DepthRetrieval's own host rules (no TensorRT or CUDA types): attribute
 * validation, the creator-side parse and the shape rule. Names, the field
 * table, defaults and serialisation are generated (common/msarOpContracts.h).
 */
#ifndef MSAR_DEPTH_RETRIEVAL_RULES_H
#define MSAR_DEPTH_RETRIEVAL_RULES_H

#include "../common/msarPluginLogic.h"

namespace msar
{

struct DepthRetrievalAttrs : DepthRetrievalAttrFields
{
    void validate() const
    {
        checkEps(kDepthRetrievalName, eps);
    }
};

inline DepthRetrievalAttrs parseDepthRetrievalFields(FieldView const* fields, int32_t nbFields)
{
    return parseAttrs<DepthRetrievalAttrs>(kDepthRetrievalName, kDepthRetrievalFields, fields, nbFields,
        [](DepthRetrievalAttrs& a, FieldView const& f) { return readDepthRetrievalField(kDepthRetrievalName, a, f); });
}

struct DepthRetrievalDims
{
    int32_t n{0};
    int64_t m{-1};
    int64_t batch{-1};
    int64_t seq{-1};
    int64_t d{-1};
};

/*!
 * DepthRetrieval inputs: query [m, d], views x n: [B, T, m, d], all equal.
 * Output: z [B, T, m, d].
 */
inline DepthRetrievalDims checkDepthRetrievalShapes(Shape const* in, int32_t nbInputs, int32_t nbOutputs, bool exact)
{
    char const* op = kDepthRetrievalName;
    if (nbOutputs != 1)
    {
        fail(op, ": has 1 output, TensorRT asked for ", nbOutputs);
    }
    if (nbInputs < kDepthRetrievalFixedInputs + 1)
    {
        fail(op, ": needs query and at least one view tensor; got ", nbInputs, " inputs");
    }
    DepthRetrievalDims r;
    r.n = nbInputs - kDepthRetrievalFixedInputs;
    if (r.n > kMaxSources)
    {
        fail(op, ": ", r.n, " sources given, this plugin supports at most ", kMaxSources);
    }
    Shape const& q = in[0];
    expectRank(op, "query", q, 2);
    expectExact(op, "query", q, exact);
    r.m = q.d[0];
    r.d = q.d[1];
    for (int32_t i = 0; i < r.n; ++i)
    {
        Shape const& v = in[kDepthRetrievalFixedInputs + i];
        InputName const name{"views", i};
        expectRank(op, name, v, 4);
        expectDim(op, name, v, 2, r.m, "m (query rows)");
        expectDim(op, name, v, 3, r.d, "d (query columns)");
        expectExact(op, name, v, exact);
        expectBatchAndSeq(op, name, v, r.batch, r.seq);
        r.m = known(r.m) ? r.m : v.d[2];
        r.d = known(r.d) ? r.d : v.d[3];
    }
    if ((known(r.m) && r.m < 1) || (known(r.d) && r.d < 1))
    {
        fail(op, ": m and d must be >= 1, got query ", str(q));
    }
    return r;
}

} // namespace msar

#endif // MSAR_DEPTH_RETRIEVAL_RULES_H

/*
 * msar::DepthRetrieval as a TensorRT IPluginV3 (name "DepthRetrieval", version "1",
 * namespace ""). Contract: msar_export/contracts.py, README.md here.
 * The IPluginV3 glue is common/msarPluginBase.h; this op adds its rules
 * (DepthRetrievalOp) and the launch of its kernel.
 */
#ifndef MSAR_DEPTH_RETRIEVAL_PLUGIN_H
#define MSAR_DEPTH_RETRIEVAL_PLUGIN_H

#include "NvInferRuntime.h"

#include "../common/msarPluginBase.h"
#include "depthRetrievalRules.h"

#include <vector>

namespace msar
{

struct DepthRetrievalOp
{
    using Attrs = DepthRetrievalAttrs;
    using Dims = DepthRetrievalDims;
    static constexpr char const* kName = kDepthRetrievalName;
    static constexpr int32_t kFixedInputs = kDepthRetrievalFixedInputs;
    static constexpr auto const& kFields = kDepthRetrievalFields;
    static constexpr auto parse = parseDepthRetrievalFields;
    static constexpr auto serialize = depthRetrievalFieldsToSerialize;

    //! The shape rules take no attributes.
    static Dims checkShapes(Attrs const& /*attrs*/, Shape const* in, int32_t nbInputs, int32_t nbOutputs, bool exact)
    {
        return checkDepthRetrievalShapes(in, nbInputs, nbOutputs, exact);
    }
};

class DepthRetrievalPlugin : public PluginBase<DepthRetrievalPlugin, DepthRetrievalOp>
{
public:
    using PluginBase::PluginBase;

    //! Hooks of PluginBase.
    size_t workspaceSize(nvinfer1::DynamicPluginTensorDesc const* /*inputs*/, int32_t /*nbInputs*/) const
    {
        return 0;
    }
    int32_t launch(DType type, void const* const* inputs, void* const* outputs, void* workspace,
        cudaStream_t stream) const;
};

using DepthRetrievalPluginCreator = PluginCreator<DepthRetrievalPlugin>;

} // namespace msar

using msar::DepthRetrievalPluginCreator;

#endif // MSAR_DEPTH_RETRIEVAL_PLUGIN_H

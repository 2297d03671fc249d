/*
 * msar::DepthRetrieval TensorRT plugin (IPluginV3). Shape, attribute and
 * dtype rules live in common/msarPluginLogic.h, the IPluginV3 glue in
 * common/msarPluginBase.h; the math lives in depthRetrievalKernel.cu.
 */
#include "depthRetrievalPlugin.h"

#include "depthRetrievalKernel.h"

namespace msar
{

int32_t DepthRetrievalPlugin::launch(
    DType type, void const* const* inputs, void* const* outputs, void* /*workspace*/, cudaStream_t stream) const
{
    MsarDepthRetrievalArgs a{};
    a.query = inputs[0];
    a.views = inputs + kDepthRetrievalFixedInputs;
    a.n_sources = mDims.n;
    a.batch = mDims.batch;
    a.seq = mDims.seq;
    a.n_streams = mDims.m;
    a.d = mDims.d;
    setDepthRetrievalKernelAttrs(a, mAttrs);
    a.out = outputs[0];
    return dispatchDType(type, [&](auto tag) { return depthRetrievalForward<ElementOf<decltype(tag)>>(a, stream); });
}

} // namespace msar

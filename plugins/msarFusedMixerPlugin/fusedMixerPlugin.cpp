/*
 * msar::FusedMixer TensorRT plugin (IPluginV3). Shape, attribute and dtype
 * rules live in common/msarPluginLogic.h, the IPluginV3 glue in
 * common/msarPluginBase.h; the math lives in fusedMixerKernel.cu.
 */
#include "fusedMixerPlugin.h"

#include "fusedMixerKernel.h"

using namespace nvinfer1;

namespace msar
{
namespace
{

size_t workspaceFor(FusedMixerAttrs const& a, int32_t nSources, int64_t d)
{
    if (d < 1)
    {
        return 0;
    }
    return msarFusedMixerWorkspaceSize(nSources, d, a.stream_kernels.data(), a.nStreams());
}

} // namespace

size_t FusedMixerPlugin::workspaceSize(DynamicPluginTensorDesc const* inputs, int32_t nbInputs) const
{
    if (inputs == nullptr || nbInputs < kFusedMixerFixedInputs + 1)
    {
        fail("FusedMixer: workspace asked for ", nbInputs, " inputs");
    }
    int64_t const d = inputs[0].max.nbDims == 2 ? inputs[0].max.d[1] : -1; // query [m, d], d is static
    return workspaceFor(mAttrs, nbInputs - kFusedMixerFixedInputs, d);
}

int32_t FusedMixerPlugin::launch(
    DType type, void const* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream) const
{
    MsarFusedMixerArgs a{};
    a.query = inputs[0];
    a.gate_weight = inputs[1];
    a.gate_bias = inputs[2];
    a.gate_scale = inputs[3];
    a.conv_weight = inputs[4];
    a.sources = inputs + kFusedMixerFixedInputs;
    a.n_sources = mDims.n;
    a.batch = mDims.batch;
    a.seq = mDims.seq;
    a.d = mDims.d;
    a.conv_rows = mDims.rows;
    setFusedMixerKernelAttrs(a, mAttrs);
    a.out = outputs[0];
    a.workspace = workspace;
    a.workspace_size = workspace != nullptr ? workspaceFor(mAttrs, mDims.n, mDims.d) : 0;
    return dispatchDType(type, [&](auto tag) { return fusedMixerForward<ElementOf<decltype(tag)>>(a, stream); });
}

} // namespace msar

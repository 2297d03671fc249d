/*
 * msar::FusedMixer TensorRT plugin (IPluginV3). Shape, attribute and dtype
 * rules live in common/msarPluginLogic.h, the IPluginV3 glue in
 * common/msarPluginBase.h; the math lives in fusedMixerKernel.cu.
 */
#include "fusedMixerPlugin.h"

#include "fusedMixerKernel.h"

#include <memory>

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

FusedMixerPlugin::~FusedMixerPlugin()
{
    if (mTaps != nullptr && mAllocator != nullptr)
    {
        mAllocator->deallocateAsync(mTaps, nullptr);
    }
}

IPluginV3* FusedMixerPlugin::attachToContext(IPluginResourceContext* context) noexcept
{
    return guarded<IPluginV3*>(kFusedMixerName, "attachToContext", nullptr, [&]() -> IPluginV3* {
        auto plugin = std::make_unique<FusedMixerPlugin>(*this);
        plugin->mAllocator = context != nullptr ? context->getGpuAllocator() : nullptr;
        return plugin.release();
    });
}

void const* FusedMixerPlugin::prepareTaps(DType type, void const* convWeight, cudaStream_t stream) const
{
    if (mAllocator == nullptr || mAttrs.taps() == 0)
    {
        return nullptr;
    }
    // Only the taps: the workspace keeps the split-source scratch, shared by all layers.
    size_t const need = msarFusedMixerTapsSize(mDims.n, mDims.d, mAttrs.stream_kernels.data(), mAttrs.nStreams());
    if (mTaps != nullptr && mTapsFrom == convWeight && mTapsSources == mDims.n && mTapsBytes >= need)
    {
        return mTaps; // prepared by an earlier enqueue
    }
    if (mTaps != nullptr && mTapsBytes < need)
    {
        mAllocator->deallocateAsync(mTaps, stream);
        mTaps = nullptr;
        mTapsBytes = 0;
    }
    if (mTaps == nullptr)
    {
        mTaps = mAllocator->allocateAsync(need, 256, 0, stream);
        if (mTaps == nullptr)
        {
            return nullptr; // fall back to the workspace
        }
        mTapsBytes = need;
    }
    int32_t const status = msarFusedMixerPrepareTaps(static_cast<int32_t>(type), convWeight, mDims.n, mDims.d,
        mAttrs.stream_kernels.data(), mAttrs.nStreams(), mTaps, mTapsBytes, stream);
    if (status != MSAR_STATUS_OK)
    {
        mTapsFrom = nullptr;
        fail("FusedMixer: preparing the taps failed with status ", status, " (", msarStatusString(status), ")");
    }
    mTapsFrom = convWeight;
    mTapsSources = mDims.n;
    return mTaps;
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
    a.workspace_size = workspaceFor(mAttrs, mDims.n, mDims.d);
    a.prepared_taps = prepareTaps(type, inputs[4], stream);
    return dispatchDType(type, [&](auto tag) { return fusedMixerForward<ElementOf<decltype(tag)>>(a, stream); });
}

} // namespace msar

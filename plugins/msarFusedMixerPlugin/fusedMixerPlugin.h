/*
 * msar::FusedMixer as a TensorRT IPluginV3 (name "FusedMixer", version "1",
 * namespace ""). Contract: msar_export/export/contracts.py, README.md here.
 * The IPluginV3 glue is common/msarPluginBase.h; this op adds its rules
 * (FusedMixerOp), its workspace and the launch of its kernel.
 */
#ifndef MSAR_FUSED_MIXER_PLUGIN_H
#define MSAR_FUSED_MIXER_PLUGIN_H

#include "NvInferRuntime.h"

#include "../common/msarPluginBase.h"
#include "fusedMixerRules.h"

#include <vector>

namespace msar
{

struct FusedMixerOp
{
    using Attrs = FusedMixerAttrs;
    using Dims = FusedMixerDims;
    static constexpr char const* kName = kFusedMixerName;
    static constexpr int32_t kFixedInputs = kFusedMixerFixedInputs;
    static constexpr auto const& kFields = kFusedMixerFields;
    static constexpr auto parse = parseFusedMixerFields;
    static constexpr auto serialize = fusedMixerFieldsToSerialize;
    static constexpr auto checkShapes = checkFusedMixerShapes;
};

//! The taps (conv_weight [N, d, K]) are transposed into the kernel's
//! [n][K][d] float32 layout once per execution context, on the first enqueue,
//! into memory from the context's GPU allocator (attachToContext), and reused
//! while conv_weight (a constant) stays at the same address. Without a
//! resource context (or if the allocation fails) every enqueue transposes
//! them into the workspace, as before.
class FusedMixerPlugin : public PluginBase<FusedMixerPlugin, FusedMixerOp>
{
public:
    using PluginBase::PluginBase;

    //! A copy owns no taps buffer and no allocator.
    FusedMixerPlugin(FusedMixerPlugin const& other)
        : PluginBase(other)
    {
    }

    FusedMixerPlugin& operator=(FusedMixerPlugin const&) = delete;
    ~FusedMixerPlugin() override;

    nvinfer1::IPluginV3* attachToContext(nvinfer1::IPluginResourceContext* context) noexcept override;

    //! Hooks of PluginBase.
    size_t workspaceSize(nvinfer1::DynamicPluginTensorDesc const* inputs, int32_t nbInputs) const;
    int32_t launch(DType type, void const* const* inputs, void* const* outputs, void* workspace,
        cudaStream_t stream) const;

    //! The prepared taps buffer (nullptr before the first enqueue, or without an allocator).
    void const* preparedTaps() const
    {
        return mTaps;
    }

private:
    void const* prepareTaps(DType type, void const* convWeight, cudaStream_t stream) const;

    nvinfer1::IGpuAllocator* mAllocator{nullptr};
    mutable void* mTaps{nullptr};
    mutable size_t mTapsBytes{0};
    mutable void const* mTapsFrom{nullptr}; //!< the conv_weight address they were made from
    mutable int32_t mTapsSources{0};
};

using FusedMixerPluginCreator = PluginCreator<FusedMixerPlugin>;

} // namespace msar

using msar::FusedMixerPluginCreator;

#endif // MSAR_FUSED_MIXER_PLUGIN_H

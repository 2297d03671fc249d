/*
 * msar::FusedMixer as a TensorRT IPluginV3 (name "FusedMixer", version "1",
 * namespace ""). Contract: msar_export/contracts.py, README.md here.
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

//! The kernel reads conv_weight [N, K, d] as exported (an initializer in the
//! kernels' layout), so enqueue allocates, prepares and caches nothing: it is
//! safe under CUDA-graph capture and refit, every execution context shares the
//! engine's one copy of the bank, and the only scratch is the workspace
//! TensorRT sizes from getWorkspaceSize (split-source partials).
class FusedMixerPlugin : public PluginBase<FusedMixerPlugin, FusedMixerOp>
{
public:
    using PluginBase::PluginBase;

    //! Hooks of PluginBase.
    size_t workspaceSize(nvinfer1::DynamicPluginTensorDesc const* inputs, int32_t nbInputs) const;
    int32_t launch(DType type, void const* const* inputs, void* const* outputs, void* workspace,
        cudaStream_t stream) const;
};

using FusedMixerPluginCreator = PluginCreator<FusedMixerPlugin>;

} // namespace msar

using msar::FusedMixerPluginCreator;

#endif // MSAR_FUSED_MIXER_PLUGIN_H

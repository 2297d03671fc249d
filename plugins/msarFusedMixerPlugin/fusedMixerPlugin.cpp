/*
 * msar::FusedMixer TensorRT plugin (IPluginV3). Shape, attribute and dtype
 * rules live in common/msarPluginLogic.h; the math lives in fusedMixerKernel.cu.
 */
#include "fusedMixerPlugin.h"

#include "fusedMixerKernel.h"

#include "../common/msarPluginUtils.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <memory>

using namespace nvinfer1;

namespace msar
{
namespace
{

std::vector<Shape> shapesOf(DynamicPluginTensorDesc const* desc, int32_t nb)
{
    std::vector<Shape> s;
    for (int32_t i = 0; i < nb; ++i)
    {
        s.push_back(toShape(desc[i].desc.dims));
    }
    return s;
}

std::vector<Shape> shapesOf(PluginTensorDesc const* desc, int32_t nb)
{
    std::vector<Shape> s;
    for (int32_t i = 0; i < nb; ++i)
    {
        s.push_back(toShape(desc[i].dims));
    }
    return s;
}

size_t workspaceFor(FusedMixerAttrs const& a, int32_t nSources, int64_t d)
{
    if (d < 1)
    {
        return 0;
    }
    return msarFusedMixerWorkspaceSize(nSources, d, a.streamKernels.data(), a.nStreams());
}

} // namespace

FusedMixerPlugin::FusedMixerPlugin(FusedMixerAttrs attrs)
    : mAttrs(std::move(attrs))
{
    mAttrs.validate();
}

FusedMixerPlugin::FusedMixerPlugin(FusedMixerPlugin const& other)
    : IPluginV3(other)
    , IPluginV3OneCore(other)
    , IPluginV3OneBuild(other)
    , IPluginV3OneRuntime(other)
    , mAttrs(other.mAttrs)
    , mNamespace(other.mNamespace)
    , mDims(other.mDims)
{
}

IPluginCapability* FusedMixerPlugin::getCapabilityInterface(PluginCapabilityType type) noexcept
{
    return guarded<IPluginCapability*>("FusedMixer::getCapabilityInterface", nullptr, [&]() -> IPluginCapability* {
        switch (type)
        {
        case PluginCapabilityType::kBUILD: return static_cast<IPluginV3OneBuild*>(this);
        case PluginCapabilityType::kRUNTIME: return static_cast<IPluginV3OneRuntime*>(this);
        case PluginCapabilityType::kCORE: return static_cast<IPluginV3OneCore*>(this);
        }
        fail("unknown capability type ", static_cast<int32_t>(type));
    });
}

IPluginV3* FusedMixerPlugin::clone() noexcept
{
    return guarded<IPluginV3*>("FusedMixer::clone", nullptr, [&]() -> IPluginV3* {
        return std::make_unique<FusedMixerPlugin>(*this).release();
    });
}

char const* FusedMixerPlugin::getPluginName() const noexcept
{
    return kFusedMixerName;
}

char const* FusedMixerPlugin::getPluginVersion() const noexcept
{
    return kPluginVersion;
}

char const* FusedMixerPlugin::getPluginNamespace() const noexcept
{
    return mNamespace.c_str();
}

void FusedMixerPlugin::setPluginNamespace(char const* ns)
{
    mNamespace = ns != nullptr ? ns : "";
}

int32_t FusedMixerPlugin::getNbOutputs() const noexcept
{
    return 1;
}

int32_t FusedMixerPlugin::getOutputDataTypes(
    DataType* outputTypes, int32_t nbOutputs, DataType const* inputTypes, int32_t nbInputs) const noexcept
{
    return guarded<int32_t>("FusedMixer::getOutputDataTypes", -1, [&]() {
        if (outputTypes == nullptr || inputTypes == nullptr || nbOutputs != 1
            || nbInputs < kFusedMixerFixedInputs + 1)
        {
            fail("FusedMixer: expects >= ", kFusedMixerFixedInputs + 1, " inputs and 1 output, got ", nbInputs,
                " and ", nbOutputs);
        }
        checkTypes(kFusedMixerName, inputTypes, nbInputs);
        outputTypes[0] = inputTypes[kFusedMixerFixedInputs];
        return 0;
    });
}

int32_t FusedMixerPlugin::getOutputShapes(DimsExprs const* inputs, int32_t nbInputs, DimsExprs const* /*shapeInputs*/,
    int32_t nbShapeInputs, DimsExprs* outputs, int32_t nbOutputs, IExprBuilder& /*exprBuilder*/) noexcept
{
    return guarded<int32_t>("FusedMixer::getOutputShapes", -1, [&]() {
        if (inputs == nullptr || outputs == nullptr || nbShapeInputs != 0)
        {
            fail("FusedMixer: takes no shape inputs");
        }
        std::vector<Shape> shapes;
        for (int32_t i = 0; i < nbInputs; ++i)
        {
            shapes.push_back(toShape(inputs[i]));
        }
        checkFusedMixerShapes(mAttrs, shapes.data(), nbInputs, nbOutputs, /*exact=*/false);
        outputs[0] = inputs[kFusedMixerFixedInputs]; // h has the shape of the sources: [B, T, d]
        return 0;
    });
}

bool FusedMixerPlugin::supportsFormatCombination(
    int32_t pos, DynamicPluginTensorDesc const* inOut, int32_t nbInputs, int32_t nbOutputs) noexcept
{
    return guarded<bool>("FusedMixer::supportsFormatCombination", false, [&]() {
        if (inOut == nullptr || pos < 0 || pos >= nbInputs + nbOutputs || nbOutputs != 1
            || nbInputs < kFusedMixerFixedInputs + 1)
        {
            fail("FusedMixer: position ", pos, " of ", nbInputs, " inputs and ", nbOutputs, " outputs");
        }
        if (inOut[pos].desc.format != TensorFormat::kLINEAR)
        {
            return false;
        }
        std::vector<DType> types;
        for (int32_t i = 0; i <= pos; ++i)
        {
            types.push_back(toDType(inOut[i].desc.type));
        }
        return typeCombinationOk(pos, types.data());
    });
}

int32_t FusedMixerPlugin::configurePlugin(
    DynamicPluginTensorDesc const* in, int32_t nbInputs, DynamicPluginTensorDesc const* out, int32_t nbOutputs) noexcept
{
    return guarded<int32_t>("FusedMixer::configurePlugin", -1, [&]() {
        if (in == nullptr || out == nullptr)
        {
            fail("FusedMixer: no tensor descriptions");
        }
        auto const shapes = shapesOf(in, nbInputs);
        checkFusedMixerShapes(mAttrs, shapes.data(), nbInputs, nbOutputs, /*exact=*/false);
        std::vector<DataType> types;
        for (int32_t i = 0; i < nbInputs; ++i)
        {
            types.push_back(in[i].desc.type);
        }
        types.push_back(out[0].desc.type);
        checkTypes(kFusedMixerName, types.data(), nbInputs + 1);
        return 0;
    });
}

size_t FusedMixerPlugin::getWorkspaceSize(DynamicPluginTensorDesc const* inputs, int32_t nbInputs,
    DynamicPluginTensorDesc const* /*outputs*/, int32_t /*nbOutputs*/) const noexcept
{
    return guarded<size_t>("FusedMixer::getWorkspaceSize", 0, [&]() -> size_t {
        if (inputs == nullptr || nbInputs < kFusedMixerFixedInputs + 1)
        {
            fail("FusedMixer: workspace asked for ", nbInputs, " inputs");
        }
        int64_t const d = inputs[0].max.nbDims == 2 ? inputs[0].max.d[1] : -1; // query [m, d], d is static
        return workspaceFor(mAttrs, nbInputs - kFusedMixerFixedInputs, d);
    });
}

int32_t FusedMixerPlugin::onShapeChange(
    PluginTensorDesc const* in, int32_t nbInputs, PluginTensorDesc const* out, int32_t nbOutputs) noexcept
{
    return guarded<int32_t>("FusedMixer::onShapeChange", -1, [&]() {
        if (in == nullptr || out == nullptr)
        {
            fail("FusedMixer: no tensor descriptions");
        }
        auto const shapes = shapesOf(in, nbInputs);
        mDims = checkFusedMixerShapes(mAttrs, shapes.data(), nbInputs, nbOutputs, /*exact=*/true);
        return 0;
    });
}

int32_t FusedMixerPlugin::enqueue(PluginTensorDesc const* inputDesc, PluginTensorDesc const* /*outputDesc*/,
    void const* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream) noexcept
{
    return guarded<int32_t>("FusedMixer::enqueue", -1, [&]() {
        if (inputDesc == nullptr || inputs == nullptr || outputs == nullptr)
        {
            fail("FusedMixer: enqueue without tensors");
        }
        if (mDims.n < 1)
        {
            fail("FusedMixer: enqueue before onShapeChange");
        }
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
        a.stream_kernels = mAttrs.streamKernels.data();
        a.n_streams = mAttrs.nStreams();
        a.eps = mAttrs.eps;
        a.out = outputs[0];
        a.workspace = workspace;
        a.workspace_size = workspaceFor(mAttrs, mDims.n, mDims.d);

        int32_t status = MSAR_STATUS_UNSUPPORTED;
        switch (toDType(inputDesc[0].type))
        {
        case DType::kFLOAT32: status = fusedMixerForward<float>(a, stream); break;
        case DType::kFLOAT16: status = fusedMixerForward<__half>(a, stream); break;
        case DType::kBFLOAT16: status = fusedMixerForward<__nv_bfloat16>(a, stream); break;
        case DType::kUNSUPPORTED: break;
        }
        if (status != MSAR_STATUS_OK)
        {
            fail("FusedMixer: kernel launch failed with status ", status, " (", msarStatusString(status), ")");
        }
        return 0;
    });
}

IPluginV3* FusedMixerPlugin::attachToContext(IPluginResourceContext* /*context*/) noexcept
{
    return clone();
}

PluginFieldCollection const* FusedMixerPlugin::getFieldsToSerialize() noexcept
{
    return guarded<PluginFieldCollection const*>("FusedMixer::getFieldsToSerialize", nullptr, [&]() {
        toPluginFields(fusedMixerFieldsToSerialize(mAttrs), mFields, mFieldCollection);
        return &mFieldCollection;
    });
}

// ---------------------------------------------------------------------------

FusedMixerPluginCreator::FusedMixerPluginCreator()
{
    fieldNames(kFusedMixerFields, mFields, mFieldCollection);
}

char const* FusedMixerPluginCreator::getPluginName() const noexcept
{
    return kFusedMixerName;
}

char const* FusedMixerPluginCreator::getPluginVersion() const noexcept
{
    return kPluginVersion;
}

char const* FusedMixerPluginCreator::getPluginNamespace() const noexcept
{
    return mNamespace.c_str();
}

PluginFieldCollection const* FusedMixerPluginCreator::getFieldNames() noexcept
{
    return &mFieldCollection;
}

IPluginV3* FusedMixerPluginCreator::createPlugin(
    char const* name, PluginFieldCollection const* fc, TensorRTPhase /*phase*/) noexcept
{
    std::string const where = std::string("FusedMixer::createPlugin(") + (name != nullptr ? name : "") + ")";
    return guarded<IPluginV3*>(where.c_str(), nullptr, [&]() -> IPluginV3* {
        auto const views = toFieldViews(fc);
        auto plugin = std::make_unique<FusedMixerPlugin>(
            parseFusedMixerFields(views.data(), static_cast<int32_t>(views.size())));
        plugin->setPluginNamespace(mNamespace.c_str());
        return plugin.release();
    });
}

} // namespace msar

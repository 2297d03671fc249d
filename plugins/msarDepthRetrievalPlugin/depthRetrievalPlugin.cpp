/*
 * msar::DepthRetrieval TensorRT plugin (IPluginV3). Shape, attribute and
 * dtype rules live in common/msarPluginLogic.h; the math lives in
 * depthRetrievalKernel.cu.
 */
#include "depthRetrievalPlugin.h"

#include "depthRetrievalKernel.h"

#include "../common/msarPluginUtils.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <memory>

using namespace nvinfer1;

namespace msar
{

DepthRetrievalPlugin::DepthRetrievalPlugin(DepthRetrievalAttrs attrs)
    : mAttrs(attrs)
{
    mAttrs.validate();
}

DepthRetrievalPlugin::DepthRetrievalPlugin(DepthRetrievalPlugin const& other)
    : IPluginV3(other)
    , IPluginV3OneCore(other)
    , IPluginV3OneBuild(other)
    , IPluginV3OneRuntime(other)
    , mAttrs(other.mAttrs)
    , mNamespace(other.mNamespace)
    , mDims(other.mDims)
{
}

IPluginCapability* DepthRetrievalPlugin::getCapabilityInterface(PluginCapabilityType type) noexcept
{
    return guarded<IPluginCapability*>("DepthRetrieval::getCapabilityInterface", nullptr, [&]() -> IPluginCapability* {
        switch (type)
        {
        case PluginCapabilityType::kBUILD: return static_cast<IPluginV3OneBuild*>(this);
        case PluginCapabilityType::kRUNTIME: return static_cast<IPluginV3OneRuntime*>(this);
        case PluginCapabilityType::kCORE: return static_cast<IPluginV3OneCore*>(this);
        }
        fail("unknown capability type ", static_cast<int32_t>(type));
    });
}

IPluginV3* DepthRetrievalPlugin::clone() noexcept
{
    return guarded<IPluginV3*>("DepthRetrieval::clone", nullptr, [&]() -> IPluginV3* {
        return std::make_unique<DepthRetrievalPlugin>(*this).release();
    });
}

char const* DepthRetrievalPlugin::getPluginName() const noexcept
{
    return kDepthRetrievalName;
}

char const* DepthRetrievalPlugin::getPluginVersion() const noexcept
{
    return kPluginVersion;
}

char const* DepthRetrievalPlugin::getPluginNamespace() const noexcept
{
    return mNamespace.c_str();
}

void DepthRetrievalPlugin::setPluginNamespace(char const* ns)
{
    mNamespace = ns != nullptr ? ns : "";
}

int32_t DepthRetrievalPlugin::getNbOutputs() const noexcept
{
    return 1;
}

int32_t DepthRetrievalPlugin::getOutputDataTypes(
    DataType* outputTypes, int32_t nbOutputs, DataType const* inputTypes, int32_t nbInputs) const noexcept
{
    return guarded<int32_t>("DepthRetrieval::getOutputDataTypes", -1, [&]() {
        if (outputTypes == nullptr || inputTypes == nullptr || nbOutputs != 1
            || nbInputs < kDepthRetrievalFixedInputs + 1)
        {
            fail("DepthRetrieval: expects >= ", kDepthRetrievalFixedInputs + 1, " inputs and 1 output, got ",
                nbInputs, " and ", nbOutputs);
        }
        checkTypes(kDepthRetrievalName, inputTypes, nbInputs);
        outputTypes[0] = inputTypes[kDepthRetrievalFixedInputs];
        return 0;
    });
}

int32_t DepthRetrievalPlugin::getOutputShapes(DimsExprs const* inputs, int32_t nbInputs,
    DimsExprs const* /*shapeInputs*/, int32_t nbShapeInputs, DimsExprs* outputs, int32_t nbOutputs,
    IExprBuilder& /*exprBuilder*/) noexcept
{
    return guarded<int32_t>("DepthRetrieval::getOutputShapes", -1, [&]() {
        if (inputs == nullptr || outputs == nullptr || nbShapeInputs != 0)
        {
            fail("DepthRetrieval: takes no shape inputs");
        }
        std::vector<Shape> shapes;
        for (int32_t i = 0; i < nbInputs; ++i)
        {
            shapes.push_back(toShape(inputs[i]));
        }
        checkDepthRetrievalShapes(shapes.data(), nbInputs, nbOutputs, /*exact=*/false);
        outputs[0] = inputs[kDepthRetrievalFixedInputs]; // z has the shape of the views: [B, T, m, d]
        return 0;
    });
}

bool DepthRetrievalPlugin::supportsFormatCombination(
    int32_t pos, DynamicPluginTensorDesc const* inOut, int32_t nbInputs, int32_t nbOutputs) noexcept
{
    return guarded<bool>("DepthRetrieval::supportsFormatCombination", false, [&]() {
        if (inOut == nullptr || pos < 0 || pos >= nbInputs + nbOutputs || nbOutputs != 1
            || nbInputs < kDepthRetrievalFixedInputs + 1)
        {
            fail("DepthRetrieval: position ", pos, " of ", nbInputs, " inputs and ", nbOutputs, " outputs");
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

int32_t DepthRetrievalPlugin::configurePlugin(
    DynamicPluginTensorDesc const* in, int32_t nbInputs, DynamicPluginTensorDesc const* out, int32_t nbOutputs) noexcept
{
    return guarded<int32_t>("DepthRetrieval::configurePlugin", -1, [&]() {
        if (in == nullptr || out == nullptr)
        {
            fail("DepthRetrieval: no tensor descriptions");
        }
        std::vector<Shape> shapes;
        std::vector<DataType> types;
        for (int32_t i = 0; i < nbInputs; ++i)
        {
            shapes.push_back(toShape(in[i].desc.dims));
            types.push_back(in[i].desc.type);
        }
        checkDepthRetrievalShapes(shapes.data(), nbInputs, nbOutputs, /*exact=*/false);
        types.push_back(out[0].desc.type);
        checkTypes(kDepthRetrievalName, types.data(), nbInputs + 1);
        return 0;
    });
}

size_t DepthRetrievalPlugin::getWorkspaceSize(DynamicPluginTensorDesc const* /*inputs*/, int32_t /*nbInputs*/,
    DynamicPluginTensorDesc const* /*outputs*/, int32_t /*nbOutputs*/) const noexcept
{
    return 0;
}

int32_t DepthRetrievalPlugin::onShapeChange(
    PluginTensorDesc const* in, int32_t nbInputs, PluginTensorDesc const* out, int32_t nbOutputs) noexcept
{
    return guarded<int32_t>("DepthRetrieval::onShapeChange", -1, [&]() {
        if (in == nullptr || out == nullptr)
        {
            fail("DepthRetrieval: no tensor descriptions");
        }
        std::vector<Shape> shapes;
        for (int32_t i = 0; i < nbInputs; ++i)
        {
            shapes.push_back(toShape(in[i].dims));
        }
        mDims = checkDepthRetrievalShapes(shapes.data(), nbInputs, nbOutputs, /*exact=*/true);
        return 0;
    });
}

int32_t DepthRetrievalPlugin::enqueue(PluginTensorDesc const* inputDesc, PluginTensorDesc const* /*outputDesc*/,
    void const* const* inputs, void* const* outputs, void* /*workspace*/, cudaStream_t stream) noexcept
{
    return guarded<int32_t>("DepthRetrieval::enqueue", -1, [&]() {
        if (inputDesc == nullptr || inputs == nullptr || outputs == nullptr)
        {
            fail("DepthRetrieval: enqueue without tensors");
        }
        if (mDims.n < 1)
        {
            fail("DepthRetrieval: enqueue before onShapeChange");
        }
        MsarDepthRetrievalArgs a{};
        a.query = inputs[0];
        a.views = inputs + kDepthRetrievalFixedInputs;
        a.n_sources = mDims.n;
        a.batch = mDims.batch;
        a.seq = mDims.seq;
        a.n_streams = mDims.m;
        a.d = mDims.d;
        a.eps = mAttrs.eps;
        a.out = outputs[0];

        int32_t status = MSAR_STATUS_UNSUPPORTED;
        switch (toDType(inputDesc[0].type))
        {
        case DType::kFLOAT32: status = depthRetrievalForward<float>(a, stream); break;
        case DType::kFLOAT16: status = depthRetrievalForward<__half>(a, stream); break;
        case DType::kBFLOAT16: status = depthRetrievalForward<__nv_bfloat16>(a, stream); break;
        case DType::kUNSUPPORTED: break;
        }
        if (status != MSAR_STATUS_OK)
        {
            fail("DepthRetrieval: kernel launch failed with status ", status, " (", msarStatusString(status), ")");
        }
        return 0;
    });
}

IPluginV3* DepthRetrievalPlugin::attachToContext(IPluginResourceContext* /*context*/) noexcept
{
    return clone();
}

PluginFieldCollection const* DepthRetrievalPlugin::getFieldsToSerialize() noexcept
{
    return guarded<PluginFieldCollection const*>("DepthRetrieval::getFieldsToSerialize", nullptr, [&]() {
        toPluginFields(depthRetrievalFieldsToSerialize(mAttrs), mFields, mFieldCollection);
        return &mFieldCollection;
    });
}

// ---------------------------------------------------------------------------

DepthRetrievalPluginCreator::DepthRetrievalPluginCreator()
{
    fieldNames(kDepthRetrievalFields, mFields, mFieldCollection);
}

char const* DepthRetrievalPluginCreator::getPluginName() const noexcept
{
    return kDepthRetrievalName;
}

char const* DepthRetrievalPluginCreator::getPluginVersion() const noexcept
{
    return kPluginVersion;
}

char const* DepthRetrievalPluginCreator::getPluginNamespace() const noexcept
{
    return mNamespace.c_str();
}

PluginFieldCollection const* DepthRetrievalPluginCreator::getFieldNames() noexcept
{
    return &mFieldCollection;
}

IPluginV3* DepthRetrievalPluginCreator::createPlugin(
    char const* name, PluginFieldCollection const* fc, TensorRTPhase /*phase*/) noexcept
{
    std::string const where = std::string("DepthRetrieval::createPlugin(") + (name != nullptr ? name : "") + ")";
    return guarded<IPluginV3*>(where.c_str(), nullptr, [&]() -> IPluginV3* {
        auto const views = toFieldViews(fc);
        auto plugin = std::make_unique<DepthRetrievalPlugin>(
            parseDepthRetrievalFields(views.data(), static_cast<int32_t>(views.size())));
        plugin->setPluginNamespace(mNamespace.c_str());
        return plugin.release();
    });
}

} // namespace msar

/*
 * The IPluginV3 glue both msar plugins share, written once:
 *
 *   PluginBase<Derived, Op>  the plugin (IPluginV3 + OneCore + OneBuild + OneRuntime)
 *   PluginCreator<Plugin>    its IPluginCreatorV3One
 *   PluginIdentity           name / version / namespace, shared by both
 *
 * `Op` is a plain traits struct (no TensorRT types) naming what differs
 * between the ops - see FusedMixerOp / DepthRetrievalOp:
 *
 *   using Attrs, Dims;                        attributes (validate(), ==), run-time dims (.n)
 *   static constexpr char const* kName;       plugin name, also the prefix of every message
 *   static constexpr int32_t kFixedInputs;    inputs before the variadic ones
 *   static constexpr auto const& kFields;     FieldSpec[] of the creator
 *   static Attrs parse(FieldView const*, int32_t);
 *   static std::vector<FieldView> serialize(Attrs const&);
 *   static Dims checkShapes(Attrs const&, Shape const*, int32_t nbInputs, int32_t nbOutputs, bool exact);
 *
 * and `Derived` adds the two TensorRT-side hooks that differ:
 *
 *   size_t workspaceSize(DynamicPluginTensorDesc const* inputs, int32_t nbInputs) const;  // may throw
 *   int32_t launch(DType, void const* const* inputs, void* const* outputs, void* workspace,
 *                  cudaStream_t) const;                                                  // MSAR_STATUS_*
 *
 * Both ops have one output with the shape and data type of the first
 * variadic input. Every noexcept override that can fail runs its body in
 * guarded() and logs errors as "<kName>::<method>".
 */
#ifndef MSAR_PLUGIN_BASE_H
#define MSAR_PLUGIN_BASE_H

#include "NvInferRuntime.h"

#include "msarPluginLogic.h"
#include "msarPluginUtils.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace msar
{

//! Call `f(static_cast<T*>(nullptr))` with the CUDA element type T of `t`;
//! MSAR_STATUS_UNSUPPORTED for a type the kernels do not take.
template <typename F>
int32_t dispatchDType(DType t, F&& f)
{
    switch (t)
    {
    case DType::kFLOAT32: return f(static_cast<float*>(nullptr));
    case DType::kFLOAT16: return f(static_cast<__half*>(nullptr));
    case DType::kBFLOAT16: return f(static_cast<__nv_bfloat16*>(nullptr));
    case DType::kUNSUPPORTED: break;
    }
    return MSAR_STATUS_UNSUPPORTED;
}

//! The element type behind the tag pointer dispatchDType passes.
template <typename Tag>
using ElementOf = std::remove_pointer_t<std::decay_t<Tag>>;

//! Shapes of TensorRT tensor descriptions, in the plain form of msarPluginLogic.h.
inline Shape shapeOf(nvinfer1::DynamicPluginTensorDesc const& t)
{
    return toShape(t.desc.dims);
}

inline Shape shapeOf(nvinfer1::PluginTensorDesc const& t)
{
    return toShape(t.dims);
}

inline Shape shapeOf(nvinfer1::DimsExprs const& t)
{
    return toShape(t);
}

template <typename Desc>
std::vector<Shape> shapesOf(Desc const* desc, int32_t nb)
{
    std::vector<Shape> s;
    for (int32_t i = 0; i < nb; ++i)
    {
        s.push_back(shapeOf(desc[i]));
    }
    return s;
}

//! Name, version and namespace of op `Op`, for the plugin (Interface =
//! IPluginV3OneCore) and for its creator (Interface = IPluginCreatorV3One).
template <typename Interface, typename Op>
class PluginIdentity : public Interface
{
public:
    char const* getPluginName() const noexcept override
    {
        return Op::kName;
    }

    char const* getPluginVersion() const noexcept override
    {
        return kPluginVersion;
    }

    char const* getPluginNamespace() const noexcept override
    {
        return mNamespace.c_str();
    }

    void setPluginNamespace(char const* ns)
    {
        mNamespace = ns != nullptr ? ns : "";
    }

protected:
    std::string mNamespace;
};

template <typename Derived, typename OpT>
class PluginBase : public nvinfer1::IPluginV3,
                   public PluginIdentity<nvinfer1::IPluginV3OneCore, OpT>,
                   public nvinfer1::IPluginV3OneBuild,
                   public nvinfer1::IPluginV3OneRuntime
{
public:
    using Op = OpT;
    using Attrs = typename Op::Attrs;
    using Dims = typename Op::Dims;

    explicit PluginBase(Attrs attrs)
        : mAttrs(std::move(attrs))
    {
        mAttrs.validate();
    }

    PluginBase(PluginBase const& other)
        : IPluginV3(other)
        , PluginIdentity<nvinfer1::IPluginV3OneCore, OpT>(other) // name, version, namespace
        , IPluginV3OneBuild(other)
        , IPluginV3OneRuntime(other)
        , mAttrs(other.mAttrs)
        , mDims(other.mDims)
    {
    }

    PluginBase& operator=(PluginBase const&) = delete;
    ~PluginBase() override = default;

    // IPluginV3
    nvinfer1::IPluginCapability* getCapabilityInterface(nvinfer1::PluginCapabilityType type) noexcept override
    {
        using nvinfer1::IPluginCapability;
        using nvinfer1::PluginCapabilityType;
        return guarded<IPluginCapability*>(Op::kName, "getCapabilityInterface", nullptr, [&]() -> IPluginCapability* {
            switch (type)
            {
            case PluginCapabilityType::kBUILD: return static_cast<nvinfer1::IPluginV3OneBuild*>(this);
            case PluginCapabilityType::kRUNTIME: return static_cast<nvinfer1::IPluginV3OneRuntime*>(this);
            case PluginCapabilityType::kCORE: return static_cast<nvinfer1::IPluginV3OneCore*>(this);
            }
            fail("unknown capability type ", static_cast<int32_t>(type));
        });
    }

    nvinfer1::IPluginV3* clone() noexcept override
    {
        return guarded<nvinfer1::IPluginV3*>(Op::kName, "clone", nullptr, [&]() -> nvinfer1::IPluginV3* {
            return std::make_unique<Derived>(static_cast<Derived const&>(*this)).release();
        });
    }

    // IPluginV3OneBuild
    int32_t getNbOutputs() const noexcept override
    {
        return 1;
    }

    int32_t getOutputDataTypes(nvinfer1::DataType* outputTypes, int32_t nbOutputs,
        nvinfer1::DataType const* inputTypes, int32_t nbInputs) const noexcept override
    {
        return guarded<int32_t>(Op::kName, "getOutputDataTypes", -1, [&]() {
            if (outputTypes == nullptr || inputTypes == nullptr || nbOutputs != 1 || nbInputs < Op::kFixedInputs + 1)
            {
                fail(Op::kName, ": expects >= ", Op::kFixedInputs + 1, " inputs and 1 output, got ", nbInputs,
                    " and ", nbOutputs);
            }
            checkTypes(Op::kName, inputTypes, nbInputs); // the output has the inputs' one type
            outputTypes[0] = inputTypes[Op::kFixedInputs];
            return 0;
        });
    }

    int32_t getOutputShapes(nvinfer1::DimsExprs const* inputs, int32_t nbInputs,
        nvinfer1::DimsExprs const* /*shapeInputs*/, int32_t nbShapeInputs, nvinfer1::DimsExprs* outputs,
        int32_t nbOutputs, nvinfer1::IExprBuilder& /*exprBuilder*/) noexcept override
    {
        return guarded<int32_t>(Op::kName, "getOutputShapes", -1, [&]() {
            if (inputs == nullptr || outputs == nullptr || nbShapeInputs != 0)
            {
                fail(Op::kName, ": takes no shape inputs");
            }
            auto const shapes = shapesOf(inputs, nbInputs);
            Op::checkShapes(mAttrs, shapes.data(), nbInputs, nbOutputs, /*exact=*/false);
            outputs[0] = inputs[Op::kFixedInputs]; // the output has the shape of the variadic inputs
            return 0;
        });
    }

    bool supportsFormatCombination(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut, int32_t nbInputs,
        int32_t nbOutputs) noexcept override
    {
        return guarded<bool>(Op::kName, "supportsFormatCombination", false, [&]() {
            if (inOut == nullptr || pos < 0 || pos >= nbInputs + nbOutputs || nbOutputs != 1
                || nbInputs < Op::kFixedInputs + 1)
            {
                fail(Op::kName, ": position ", pos, " of ", nbInputs, " inputs and ", nbOutputs, " outputs");
            }
            if (inOut[pos].desc.format != nvinfer1::TensorFormat::kLINEAR)
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

    int32_t configurePlugin(nvinfer1::DynamicPluginTensorDesc const* in, int32_t nbInputs,
        nvinfer1::DynamicPluginTensorDesc const* out, int32_t nbOutputs) noexcept override
    {
        return guarded<int32_t>(Op::kName, "configurePlugin", -1, [&]() {
            if (in == nullptr || out == nullptr)
            {
                fail(Op::kName, ": no tensor descriptions");
            }
            auto const shapes = shapesOf(in, nbInputs);
            Op::checkShapes(mAttrs, shapes.data(), nbInputs, nbOutputs, /*exact=*/false);
            std::vector<nvinfer1::DataType> types;
            for (int32_t i = 0; i < nbInputs; ++i)
            {
                types.push_back(in[i].desc.type);
            }
            types.push_back(out[0].desc.type);
            checkTypes(Op::kName, types.data(), nbInputs + 1);
            return 0;
        });
    }

    size_t getWorkspaceSize(nvinfer1::DynamicPluginTensorDesc const* inputs, int32_t nbInputs,
        nvinfer1::DynamicPluginTensorDesc const* /*outputs*/, int32_t /*nbOutputs*/) const noexcept override
    {
        return guarded<size_t>(Op::kName, "getWorkspaceSize", 0, [&]() -> size_t {
            return derived().workspaceSize(inputs, nbInputs);
        });
    }

    // IPluginV3OneRuntime
    int32_t onShapeChange(nvinfer1::PluginTensorDesc const* in, int32_t nbInputs,
        nvinfer1::PluginTensorDesc const* out, int32_t nbOutputs) noexcept override
    {
        return guarded<int32_t>(Op::kName, "onShapeChange", -1, [&]() {
            if (in == nullptr || out == nullptr)
            {
                fail(Op::kName, ": no tensor descriptions");
            }
            auto const shapes = shapesOf(in, nbInputs);
            mDims = Op::checkShapes(mAttrs, shapes.data(), nbInputs, nbOutputs, /*exact=*/true);
            return 0;
        });
    }

    int32_t enqueue(nvinfer1::PluginTensorDesc const* inputDesc, nvinfer1::PluginTensorDesc const* /*outputDesc*/,
        void const* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream) noexcept override
    {
        return guarded<int32_t>(Op::kName, "enqueue", -1, [&]() {
            if (inputDesc == nullptr || inputs == nullptr || outputs == nullptr)
            {
                fail(Op::kName, ": enqueue without tensors");
            }
            if (mDims.n < 1)
            {
                fail(Op::kName, ": enqueue before onShapeChange");
            }
            int32_t const status = derived().launch(toDType(inputDesc[0].type), inputs, outputs, workspace, stream);
            if (status != MSAR_STATUS_OK)
            {
                fail(Op::kName, ": kernel launch failed with status ", status, " (", msarStatusString(status), ")");
            }
            return 0;
        });
    }

    nvinfer1::IPluginV3* attachToContext(nvinfer1::IPluginResourceContext* /*context*/) noexcept override
    {
        return clone();
    }

    nvinfer1::PluginFieldCollection const* getFieldsToSerialize() noexcept override
    {
        return guarded<nvinfer1::PluginFieldCollection const*>(Op::kName, "getFieldsToSerialize", nullptr, [&]() {
            toPluginFields(Op::serialize(mAttrs), mFields, mFieldCollection);
            return &mFieldCollection;
        });
    }

protected:
    Attrs mAttrs;
    Dims mDims{}; //!< from onShapeChange

private:
    Derived const& derived() const
    {
        return static_cast<Derived const&>(*this);
    }

    std::vector<nvinfer1::PluginField> mFields;
    nvinfer1::PluginFieldCollection mFieldCollection{};
};

template <typename Plugin>
class PluginCreator : public PluginIdentity<nvinfer1::IPluginCreatorV3One, typename Plugin::Op>
{
public:
    using Op = typename Plugin::Op;

    PluginCreator()
    {
        fieldNames(Op::kFields, mFields, mFieldCollection);
    }

    ~PluginCreator() override = default;

    nvinfer1::PluginFieldCollection const* getFieldNames() noexcept override
    {
        return &mFieldCollection;
    }

    nvinfer1::IPluginV3* createPlugin(char const* name, nvinfer1::PluginFieldCollection const* fc,
        nvinfer1::TensorRTPhase /*phase*/) noexcept override
    {
        auto const where = [name] {
            return std::string(Op::kName) + "::createPlugin(" + (name != nullptr ? name : "") + ")";
        };
        return guardedAt<nvinfer1::IPluginV3*>(where, nullptr, [&]() -> nvinfer1::IPluginV3* {
            auto const views = toFieldViews(fc);
            auto plugin = std::make_unique<Plugin>(Op::parse(views.data(), static_cast<int32_t>(views.size())));
            plugin->setPluginNamespace(this->mNamespace.c_str());
            return plugin.release();
        });
    }

private:
    std::vector<nvinfer1::PluginField> mFields;
    nvinfer1::PluginFieldCollection mFieldCollection{};
};

} // namespace msar

#endif // MSAR_PLUGIN_BASE_H

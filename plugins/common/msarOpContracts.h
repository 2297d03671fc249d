// Generated from msar_export/contracts.py by msar_export/export/contract_headers.py; do not edit.
#ifndef MSAR_OP_CONTRACTS_H
#define MSAR_OP_CONTRACTS_H

#include "msarPluginFields.h"

#include <cstdint>
#include <cstring>
#include <vector>

namespace msar
{

constexpr char const* kPluginVersion = "1";
constexpr char const* kPluginNamespace = "";

// ---- FusedMixer ------------------------------------------------------------

constexpr char const* kFusedMixerName = "FusedMixer";
constexpr int32_t kFusedMixerFixedInputs = 5;
constexpr int32_t kFusedMixerSinceVersion = 1;
constexpr uint32_t kFusedMixerInt64Inputs = 0u;  // bit i: input i is int64
constexpr char const* const kFusedMixerFixedInputNames[] = {"query", "gate_weight", "gate_bias", "gate_scale", "conv_weight"};

//! The creator's PluginField table: ONNX attribute names and types, in contract order.
constexpr FieldSpec kFusedMixerFields[] = {
    {"stream_kernels", FieldKind::kINT32},
    {"eps", FieldKind::kFLOAT32},
    {"plugin_version", FieldKind::kCHAR},
    {"plugin_namespace", FieldKind::kCHAR},
};

//! FusedMixer's kernel attributes with the contract's defaults (an empty list: required).
struct FusedMixerAttrFields
{
    std::vector<int32_t> stream_kernels;
    float eps{1e-06F};
    bool operator==(FusedMixerAttrFields const&) const = default;
};

//! Reads field `f` into `a` if it names a kernel attribute; false for any other name.
inline bool readFusedMixerField(char const* op, FusedMixerAttrFields& a, FieldView const& f)
{
    if (std::strcmp(f.name, "stream_kernels") == 0)
    {
        a.stream_kernels = intsField(op, f);
        return true;
    }
    if (std::strcmp(f.name, "eps") == 0)
    {
        a.eps = scalarFloat(op, f);
        return true;
    }
    return false;
}

//! Every creator field for serialisation; the views point into `a`, which must outlive them.
inline std::vector<FieldView> fusedMixerFieldsToSerialize(FusedMixerAttrFields const& a)
{
    return {
        {"stream_kernels", FieldKind::kINT32, a.stream_kernels.data(), static_cast<int32_t>(a.stream_kernels.size())},
        {"eps", FieldKind::kFLOAT32, &a.eps, 1},
        stringView("plugin_version", kPluginVersion),
        stringView("plugin_namespace", kPluginNamespace),
    };
}

//! The attributes into the kernel's MSAR_FUSEDMIXER_ATTR_ARGS members.
template <typename Args>
void setFusedMixerKernelAttrs(Args& args, FusedMixerAttrFields const& a)
{
    args.stream_kernels = a.stream_kernels.data();
    args.n_streams = static_cast<int32_t>(a.stream_kernels.size());
    args.eps = a.eps;
}

// ---- DepthRetrieval --------------------------------------------------------

constexpr char const* kDepthRetrievalName = "DepthRetrieval";
constexpr int32_t kDepthRetrievalFixedInputs = 1;
constexpr int32_t kDepthRetrievalSinceVersion = 1;
constexpr uint32_t kDepthRetrievalInt64Inputs = 0u;  // bit i: input i is int64
constexpr char const* const kDepthRetrievalFixedInputNames[] = {"query"};

//! The creator's PluginField table: ONNX attribute names and types, in contract order.
constexpr FieldSpec kDepthRetrievalFields[] = {
    {"eps", FieldKind::kFLOAT32},
    {"plugin_version", FieldKind::kCHAR},
    {"plugin_namespace", FieldKind::kCHAR},
};

//! DepthRetrieval's kernel attributes with the contract's defaults (an empty list: required).
struct DepthRetrievalAttrFields
{
    float eps{1e-06F};
    bool operator==(DepthRetrievalAttrFields const&) const = default;
};

//! Reads field `f` into `a` if it names a kernel attribute; false for any other name.
inline bool readDepthRetrievalField(char const* op, DepthRetrievalAttrFields& a, FieldView const& f)
{
    if (std::strcmp(f.name, "eps") == 0)
    {
        a.eps = scalarFloat(op, f);
        return true;
    }
    return false;
}

//! Every creator field for serialisation; the views point into `a`, which must outlive them.
inline std::vector<FieldView> depthRetrievalFieldsToSerialize(DepthRetrievalAttrFields const& a)
{
    return {
        {"eps", FieldKind::kFLOAT32, &a.eps, 1},
        stringView("plugin_version", kPluginVersion),
        stringView("plugin_namespace", kPluginNamespace),
    };
}

//! The attributes into the kernel's MSAR_DEPTHRETRIEVAL_ATTR_ARGS members.
template <typename Args>
void setDepthRetrievalKernelAttrs(Args& args, DepthRetrievalAttrFields const& a)
{
    args.eps = a.eps;
}

// ---- SourceViews -----------------------------------------------------------

constexpr char const* kSourceViewsName = "SourceViews";
constexpr int32_t kSourceViewsFixedInputs = 5;
constexpr int32_t kSourceViewsSinceVersion = 2;
constexpr uint32_t kSourceViewsInt64Inputs = 20u;  // bit i: input i is int64
constexpr char const* const kSourceViewsFixedInputNames[] = {"conv_weight", "state", "index", "source", "mask"};

// ---- StreamGate ------------------------------------------------------------

constexpr char const* kStreamGateName = "StreamGate";
constexpr int32_t kStreamGateFixedInputs = 4;
constexpr int32_t kStreamGateSinceVersion = 1;
constexpr uint32_t kStreamGateInt64Inputs = 0u;  // bit i: input i is int64
constexpr char const* const kStreamGateFixedInputNames[] = {"gate_weight", "gate_bias", "gate_scale", "z"};

// ---- SourceScores ----------------------------------------------------------

constexpr char const* kSourceScoresName = "SourceScores";
constexpr int32_t kSourceScoresFixedInputs = 3;
constexpr int32_t kSourceScoresSinceVersion = 1;
constexpr uint32_t kSourceScoresInt64Inputs = 0u;  // bit i: input i is int64
constexpr char const* const kSourceScoresFixedInputNames[] = {"conv_weight", "queries", "source"};

// ---- ScoredMixer -----------------------------------------------------------

constexpr char const* kScoredMixerName = "ScoredMixer";
constexpr int32_t kScoredMixerFixedInputs = 5;
constexpr int32_t kScoredMixerSinceVersion = 1;
constexpr uint32_t kScoredMixerInt64Inputs = 0u;  // bit i: input i is int64
constexpr char const* const kScoredMixerFixedInputNames[] = {"gate_weight", "gate_bias", "gate_scale", "conv_weight", "scores"};

// ---- ConvState -------------------------------------------------------------

constexpr char const* kConvStateName = "ConvState";
constexpr int32_t kConvStateFixedInputs = 2;
constexpr int32_t kConvStateSinceVersion = 2;
constexpr uint32_t kConvStateInt64Inputs = 2u;  // bit i: input i is int64
constexpr char const* const kConvStateFixedInputNames[] = {"past", "mask"};

} // namespace msar

#endif // MSAR_OP_CONTRACTS_H

/*
 * Host-side rules of the msar TensorRT plugins, with no TensorRT or CUDA types,
 * so that a plain g++ test program can check them (plugins/tests/logicTest.cpp).
 *
 * What lives here: attribute validation, the creator/serialisation field
 * codec, the shape rules of both ops and the dtype dispatch table.  The
 * TensorRT glue (xPlugin.cpp) converts TensorRT structs to and from these
 * plain types and never re-implements a rule.
 *
 * The contract is msar_export/export/contracts.py (domain `msar`, version 1).
 */
#ifndef MSAR_PLUGIN_LOGIC_H
#define MSAR_PLUGIN_LOGIC_H

#include <cmath>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "msarKernelTypes.h"

namespace msar
{

constexpr char const* kPluginVersion = "1";
constexpr char const* kPluginNamespace = "";
constexpr char const* kFusedMixerName = "FusedMixer";
constexpr char const* kDepthRetrievalName = "DepthRetrieval";

constexpr int32_t kMaxSources = MSAR_MAX_SOURCES;
constexpr int32_t kMaxStreams = MSAR_MAX_STREAMS;
constexpr int32_t kMaxKernel = MSAR_MAX_KERNEL;

//! Number of inputs before the variadic ones (== contracts.OpContract.n_fixed_inputs).
constexpr int32_t kFusedMixerFixedInputs = 5; // query, gate_weight, gate_bias, gate_scale, conv_weight
constexpr int32_t kDepthRetrievalFixedInputs = 1; // query

//! A user-facing error (bad attribute, shape or dtype). The glue catches it in
//! every noexcept override, logs the message and returns a failure code.
class PluginError : public std::runtime_error
{
public:
    explicit PluginError(std::string const& what)
        : std::runtime_error(what)
    {
    }
};

template <typename... Args>
[[noreturn]] inline void fail(Args const&... args)
{
    std::ostringstream os;
    (os << ... << args);
    throw PluginError(os.str());
}

// ---------------------------------------------------------------------------
// Data types: the dispatch table shared by supportsFormatCombination and enqueue.

enum class DType : int32_t
{
    kFLOAT32 = MSAR_DTYPE_FLOAT32,
    kFLOAT16 = MSAR_DTYPE_FLOAT16,
    kBFLOAT16 = MSAR_DTYPE_BFLOAT16,
    kUNSUPPORTED = -1,
};

struct DTypeEntry
{
    DType type;
    char const* name;
    int32_t bytes;
};

//! Every I/O type the plugins accept; accumulation is always float32.
constexpr DTypeEntry kDTypeTable[] = {
    {DType::kFLOAT32, "float32", 4},
    {DType::kFLOAT16, "float16", 2},
    {DType::kBFLOAT16, "bfloat16", 2},
};

inline bool isSupported(DType t)
{
    for (auto const& e : kDTypeTable)
    {
        if (e.type == t)
        {
            return true;
        }
    }
    return false;
}

inline char const* dtypeName(DType t)
{
    for (auto const& e : kDTypeTable)
    {
        if (e.type == t)
        {
            return e.name;
        }
    }
    return "unsupported";
}

//! supportsFormatCombination's type rule: position 0 picks one of the
//! supported types, every other input and the output must have that type
//! (the ONNX contract has one type variable T for all tensors).
inline bool typeCombinationOk(int32_t pos, DType const* types)
{
    if (!isSupported(types[pos]))
    {
        return false;
    }
    return pos == 0 || types[pos] == types[0];
}

//! getOutputDataTypes / configurePlugin's type rule: every tensor (inputs, and
//! the output when given) has a supported type, all the same one; the output
//! has that type. Returns it; fails naming the first offending input.
inline DType checkOpTypes(char const* op, DType const* types, int32_t nb)
{
    for (int32_t i = 0; i < nb; ++i)
    {
        if (!isSupported(types[i]))
        {
            fail(op, ": input ", i, " has an unsupported data type; use float32, float16 or bfloat16");
        }
        if (types[i] != types[0])
        {
            fail(op, ": all inputs must share one data type (input ", i, " is ", dtypeName(types[i]), ", input 0 is ",
                dtypeName(types[0]), ")");
        }
    }
    return nb > 0 ? types[0] : DType::kUNSUPPORTED;
}

// ---------------------------------------------------------------------------
// Plugin fields: a TensorRT-free mirror of PluginField.

enum class FieldKind : int32_t
{
    kINT32,
    kFLOAT32,
    kCHAR,
    kOTHER,
};

struct FieldView
{
    char const* name;
    FieldKind kind;
    void const* data;
    int32_t length;
};

struct FieldSpec
{
    char const* name;
    FieldKind kind;
};

//! Creator field names == ONNX attribute names (contracts.py), in that order.
constexpr FieldSpec kFusedMixerFields[] = {
    {"stream_kernels", FieldKind::kINT32},
    {"eps", FieldKind::kFLOAT32},
    {"plugin_version", FieldKind::kCHAR},
    {"plugin_namespace", FieldKind::kCHAR},
};

constexpr FieldSpec kDepthRetrievalFields[] = {
    {"eps", FieldKind::kFLOAT32},
    {"plugin_version", FieldKind::kCHAR},
    {"plugin_namespace", FieldKind::kCHAR},
};

constexpr float kDefaultEps = 1e-6F;

inline char const* kindName(FieldKind k)
{
    switch (k)
    {
    case FieldKind::kINT32: return "INT32";
    case FieldKind::kFLOAT32: return "FLOAT32";
    case FieldKind::kCHAR: return "CHAR";
    case FieldKind::kOTHER: break;
    }
    return "other";
}

inline void expectKind(char const* op, FieldView const& f, FieldKind kind)
{
    if (f.kind != kind)
    {
        fail(op, ": attribute '", f.name, "' must be ", kindName(kind), ", got ", kindName(f.kind));
    }
    if (f.length > 0 && f.data == nullptr)
    {
        fail(op, ": attribute '", f.name, "' has length ", f.length, " but no data");
    }
}

inline float scalarFloat(char const* op, FieldView const& f)
{
    expectKind(op, f, FieldKind::kFLOAT32);
    if (f.length != 1)
    {
        fail(op, ": attribute '", f.name, "' must hold one float, got ", f.length);
    }
    float v{};
    std::memcpy(&v, f.data, sizeof(float));
    return v;
}

inline std::string stringField(char const* op, FieldView const& f)
{
    expectKind(op, f, FieldKind::kCHAR);
    if (f.length <= 0)
    {
        return {};
    }
    std::string s(static_cast<char const*>(f.data), static_cast<size_t>(f.length));
    // Serialised C strings may carry their terminator; ONNX strings do not.
    auto const end = s.find('\0');
    return end == std::string::npos ? s : s.substr(0, end);
}

//! plugin_version / plugin_namespace are consumed by the ONNX parser to find
//! the creator; if they reach the creator they must name this plugin.
inline void checkIdentityField(char const* op, FieldView const& f)
{
    std::string const v = stringField(op, f);
    if (std::strcmp(f.name, "plugin_version") == 0 && !v.empty() && v != kPluginVersion)
    {
        fail(op, ": plugin_version '", v, "' requested, this library implements version ", kPluginVersion);
    }
    if (std::strcmp(f.name, "plugin_namespace") == 0 && v != kPluginNamespace)
    {
        fail(op, ": plugin_namespace '", v, "' requested, this library registers the empty namespace");
    }
}

// ---------------------------------------------------------------------------
// Attributes.

inline void checkEps(char const* op, float eps)
{
    if (!std::isfinite(eps) || eps <= 0.F)
    {
        fail(op, ": eps must be a finite positive float, got ", eps);
    }
}

struct FusedMixerAttrs
{
    std::vector<int32_t> streamKernels;
    float eps{kDefaultEps};

    int32_t nStreams() const
    {
        return static_cast<int32_t>(streamKernels.size());
    }

    //! K = sum(stream_kernels[1:]): taps per channel and source in conv_weight.
    int32_t taps() const
    {
        int32_t k = 0;
        for (size_t r = 1; r < streamKernels.size(); ++r)
        {
            k += streamKernels[r];
        }
        return k;
    }

    int32_t kmax() const
    {
        int32_t k = 1;
        for (auto v : streamKernels)
        {
            k = v > k ? v : k;
        }
        return k;
    }

    void validate() const
    {
        char const* op = kFusedMixerName;
        if (streamKernels.empty())
        {
            fail(op, ": stream_kernels is required (INTS, first is 1), e.g. [1, 4, 8, 12]");
        }
        if (streamKernels.size() > static_cast<size_t>(kMaxStreams))
        {
            fail(op, ": ", streamKernels.size(), " streams given, this plugin supports at most ", kMaxStreams);
        }
        if (streamKernels[0] != 1)
        {
            fail(op, ": stream_kernels[0] must be 1 (stream 0 is the identity), got ", streamKernels[0]);
        }
        for (size_t r = 1; r < streamKernels.size(); ++r)
        {
            if (streamKernels[r] < 1 || streamKernels[r] > kMaxKernel)
            {
                fail(op, ": stream_kernels[", r, "] = ", streamKernels[r], " is outside 1..", kMaxKernel);
            }
        }
        checkEps(op, eps);
    }

    bool operator==(FusedMixerAttrs const& o) const
    {
        return streamKernels == o.streamKernels && eps == o.eps;
    }
};

struct DepthRetrievalAttrs
{
    float eps{kDefaultEps};

    void validate() const
    {
        checkEps(kDepthRetrievalName, eps);
    }

    bool operator==(DepthRetrievalAttrs const& o) const
    {
        return eps == o.eps;
    }
};

//! Creator side: fields from the ONNX parser (or from deserialisation) ->
//! attributes. Unknown names are an error, never silently ignored.
//!
//! The parse both ops share: every field needs a name; `eps` (FLOAT, both
//! ops) is read here; `own(attrs, f)` takes the op's other fields and returns
//! false for a name it does not know; plugin_version / plugin_namespace are
//! checked; anything else is refused, listing `specs`. Then validate().
template <typename Attrs, size_t N, typename Own>
Attrs parseAttrs(char const* op, FieldSpec const (&specs)[N], FieldView const* fields, int32_t nbFields, Own&& own)
{
    Attrs a;
    for (int32_t i = 0; i < nbFields; ++i)
    {
        FieldView const& f = fields[i];
        if (f.name == nullptr)
        {
            fail(op, ": field ", i, " has no name");
        }
        if (std::strcmp(f.name, "eps") == 0)
        {
            a.eps = scalarFloat(op, f);
        }
        else if (own(a, f))
        {
            continue;
        }
        else if (std::strcmp(f.name, "plugin_version") == 0 || std::strcmp(f.name, "plugin_namespace") == 0)
        {
            checkIdentityField(op, f);
        }
        else
        {
            std::string known;
            for (auto const& spec : specs)
            {
                known += (known.empty() ? "" : ", ") + std::string(spec.name);
            }
            fail(op, ": unknown attribute '", f.name, "' (known: ", known, ")");
        }
    }
    a.validate();
    return a;
}

inline FusedMixerAttrs parseFusedMixerFields(FieldView const* fields, int32_t nbFields)
{
    char const* op = kFusedMixerName;
    auto const own = [op](FusedMixerAttrs& a, FieldView const& f) {
        if (std::strcmp(f.name, "stream_kernels") != 0)
        {
            return false;
        }
        expectKind(op, f, FieldKind::kINT32);
        a.streamKernels.resize(static_cast<size_t>(f.length > 0 ? f.length : 0));
        if (f.length > 0)
        {
            std::memcpy(a.streamKernels.data(), f.data, sizeof(int32_t) * static_cast<size_t>(f.length));
        }
        return true;
    };
    return parseAttrs<FusedMixerAttrs>(op, kFusedMixerFields, fields, nbFields, own);
}

inline DepthRetrievalAttrs parseDepthRetrievalFields(FieldView const* fields, int32_t nbFields)
{
    // eps is DepthRetrieval's only attribute.
    return parseAttrs<DepthRetrievalAttrs>(kDepthRetrievalName, kDepthRetrievalFields, fields, nbFields,
        [](DepthRetrievalAttrs& /*a*/, FieldView const& /*f*/) { return false; });
}

//! Serialisation side: every creator field, with the same names. The views
//! point into `a` and into static strings, so `a` must outlive them.
inline std::vector<FieldView> fusedMixerFieldsToSerialize(FusedMixerAttrs const& a)
{
    return {
        {"stream_kernels", FieldKind::kINT32, a.streamKernels.data(), a.nStreams()},
        {"eps", FieldKind::kFLOAT32, &a.eps, 1},
        {"plugin_version", FieldKind::kCHAR, kPluginVersion, static_cast<int32_t>(std::strlen(kPluginVersion))},
        {"plugin_namespace", FieldKind::kCHAR, kPluginNamespace, static_cast<int32_t>(std::strlen(kPluginNamespace))},
    };
}

inline std::vector<FieldView> depthRetrievalFieldsToSerialize(DepthRetrievalAttrs const& a)
{
    return {
        {"eps", FieldKind::kFLOAT32, &a.eps, 1},
        {"plugin_version", FieldKind::kCHAR, kPluginVersion, static_cast<int32_t>(std::strlen(kPluginVersion))},
        {"plugin_namespace", FieldKind::kCHAR, kPluginNamespace, static_cast<int32_t>(std::strlen(kPluginNamespace))},
    };
}

// ---------------------------------------------------------------------------
// Shapes. A dimension of -1 is unknown (dynamic); `exact` demands none.

constexpr int32_t kMaxRank = 8;

struct Shape
{
    int32_t nbDims{0};
    int64_t d[kMaxRank]{};
};

inline std::string str(Shape const& s)
{
    std::ostringstream os;
    os << "[";
    for (int32_t i = 0; i < s.nbDims; ++i)
    {
        os << (i ? ", " : "") << (s.d[i] < 0 ? std::string("?") : std::to_string(s.d[i]));
    }
    os << "]";
    return os.str();
}

inline bool known(int64_t v)
{
    return v >= 0;
}

//! The name of variadic input `index` ("sources_3"), written only into an
//! error message: onShapeChange runs per shape change and builds no string.
struct InputName
{
    char const* base;
    int32_t index;
};

inline std::ostream& operator<<(std::ostream& os, InputName const& n)
{
    return os << n.base << '_' << n.index;
}

//! `name` (char const* or InputName) must have rank `rank`; fails otherwise.
template <typename Name>
void expectRank(char const* op, Name const& name, Shape const& s, int32_t rank)
{
    if (s.nbDims != rank)
    {
        fail(op, ": input '", name, "' must have rank ", rank, ", got shape ", str(s));
    }
}

//! Check dimension `v` against `want` when both are known; -1 matches anything.
template <typename Name>
void expectDim(char const* op, Name const& name, Shape const& s, int32_t axis, int64_t want, char const* what)
{
    int64_t const v = s.d[axis];
    if (known(v) && known(want) && v != want)
    {
        fail(op, ": input '", name, "' has shape ", str(s), "; axis ", axis, " must be ", what, " = ", want);
    }
}

template <typename Name>
void expectExact(char const* op, Name const& name, Shape const& s, bool exact)
{
    if (!exact)
    {
        return;
    }
    for (int32_t i = 0; i < s.nbDims; ++i)
    {
        if (!known(s.d[i]))
        {
            fail(op, ": input '", name, "' has an unresolved dimension at run time: ", str(s));
        }
    }
}

//! The dimensions FusedMixer runs with; -1 where unknown at build time.
struct FusedMixerDims
{
    int32_t n{0};     //!< sources
    int32_t m{0};     //!< streams
    int32_t taps{0};  //!< K
    int64_t rows{-1}; //!< N (conv_weight rows, >= n)
    int64_t batch{-1};
    int64_t seq{-1};
    int64_t d{-1};
};

/*!
 * FusedMixer inputs: query [m, d], gate_weight [m, m*d], gate_bias [m],
 * gate_scale [] (a one-element [1] is accepted), conv_weight [N, d, K] with
 * N >= n and K = sum(stream_kernels[1:]), sources x n: [B, T, d], all equal.
 * Output: h [B, T, d].
 */
inline FusedMixerDims checkFusedMixerShapes(
    FusedMixerAttrs const& a, Shape const* in, int32_t nbInputs, int32_t nbOutputs, bool exact)
{
    char const* op = kFusedMixerName;
    if (nbOutputs != 1)
    {
        fail(op, ": has 1 output, TensorRT asked for ", nbOutputs);
    }
    if (nbInputs < kFusedMixerFixedInputs + 1)
    {
        fail(op, ": needs query, gate_weight, gate_bias, gate_scale, conv_weight and at least one source; got ",
            nbInputs, " inputs");
    }
    FusedMixerDims r;
    r.n = nbInputs - kFusedMixerFixedInputs;
    r.m = a.nStreams();
    r.taps = a.taps();
    if (r.n > kMaxSources)
    {
        fail(op, ": ", r.n, " sources given, this plugin supports at most ", kMaxSources);
    }
    Shape const& q = in[0];
    Shape const& gw = in[1];
    Shape const& gb = in[2];
    Shape const& gs = in[3];
    Shape const& cw = in[4];

    expectRank(op, "query", q, 2);
    expectDim(op, "query", q, 0, r.m, "len(stream_kernels)");
    r.d = q.d[1];
    expectRank(op, "sources_0", in[5], 3);
    if (!known(r.d))
    {
        r.d = in[5].d[2];
    }
    if (known(r.d) && r.d < 1)
    {
        fail(op, ": model width d must be >= 1, got ", r.d);
    }

    expectRank(op, "gate_weight", gw, 2);
    expectDim(op, "gate_weight", gw, 0, r.m, "m");
    expectDim(op, "gate_weight", gw, 1, known(r.d) ? r.m * r.d : -1, "m*d");
    expectRank(op, "gate_bias", gb, 1);
    expectDim(op, "gate_bias", gb, 0, r.m, "m");
    if (!(gs.nbDims == 0 || (gs.nbDims == 1 && (gs.d[0] == 1 || !known(gs.d[0])))))
    {
        fail(op, ": input 'gate_scale' must be a scalar [], got ", str(gs));
    }
    expectRank(op, "conv_weight", cw, 3);
    expectDim(op, "conv_weight", cw, 1, r.d, "d");
    expectDim(op, "conv_weight", cw, 2, r.taps, "sum(stream_kernels[1:])");
    r.rows = cw.d[0];
    if (known(r.rows) && r.rows < r.n)
    {
        fail(op, ": conv_weight has ", r.rows, " rows but ", r.n, " sources are given (needs N >= n)");
    }

    static char const* const names[] = {"query", "gate_weight", "gate_bias", "gate_scale", "conv_weight"};
    for (int32_t i = 0; i < kFusedMixerFixedInputs; ++i)
    {
        expectExact(op, names[i], in[i], exact);
    }
    for (int32_t i = 0; i < r.n; ++i)
    {
        Shape const& x = in[kFusedMixerFixedInputs + i];
        InputName const name{"sources", i};
        expectRank(op, name, x, 3);
        expectDim(op, name, x, 2, r.d, "d");
        expectDim(op, name, x, 0, r.batch, "the batch of sources_0");
        expectDim(op, name, x, 1, r.seq, "the sequence length of sources_0");
        expectExact(op, name, x, exact);
        if (!known(r.batch))
        {
            r.batch = x.d[0];
        }
        if (!known(r.seq))
        {
            r.seq = x.d[1];
        }
    }
    return r;
}

struct DepthRetrievalDims
{
    int32_t n{0};
    int64_t m{-1};
    int64_t batch{-1};
    int64_t seq{-1};
    int64_t d{-1};
};

/*!
 * DepthRetrieval inputs: query [m, d], views x n: [B, T, m, d], all equal.
 * Output: z [B, T, m, d].
 */
inline DepthRetrievalDims checkDepthRetrievalShapes(Shape const* in, int32_t nbInputs, int32_t nbOutputs, bool exact)
{
    char const* op = kDepthRetrievalName;
    if (nbOutputs != 1)
    {
        fail(op, ": has 1 output, TensorRT asked for ", nbOutputs);
    }
    if (nbInputs < kDepthRetrievalFixedInputs + 1)
    {
        fail(op, ": needs query and at least one view tensor; got ", nbInputs, " inputs");
    }
    DepthRetrievalDims r;
    r.n = nbInputs - kDepthRetrievalFixedInputs;
    if (r.n > kMaxSources)
    {
        fail(op, ": ", r.n, " sources given, this plugin supports at most ", kMaxSources);
    }
    Shape const& q = in[0];
    expectRank(op, "query", q, 2);
    expectExact(op, "query", q, exact);
    r.m = q.d[0];
    r.d = q.d[1];
    for (int32_t i = 0; i < r.n; ++i)
    {
        Shape const& v = in[kDepthRetrievalFixedInputs + i];
        InputName const name{"views", i};
        expectRank(op, name, v, 4);
        expectDim(op, name, v, 2, r.m, "m (query rows)");
        expectDim(op, name, v, 3, r.d, "d (query columns)");
        expectDim(op, name, v, 0, r.batch, "the batch of views_0");
        expectDim(op, name, v, 1, r.seq, "the sequence length of views_0");
        expectExact(op, name, v, exact);
        r.m = known(r.m) ? r.m : v.d[2];
        r.d = known(r.d) ? r.d : v.d[3];
        r.batch = known(r.batch) ? r.batch : v.d[0];
        r.seq = known(r.seq) ? r.seq : v.d[1];
    }
    if ((known(r.m) && r.m < 1) || (known(r.d) && r.d < 1))
    {
        fail(op, ": m and d must be >= 1, got query ", str(q));
    }
    return r;
}

} // namespace msar

#endif // MSAR_PLUGIN_LOGIC_H

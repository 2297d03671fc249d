/*
 * Host-side rules both msar TensorRT plugins share, with no TensorRT or CUDA
 * types, so that a plain C++ test program can check them
 * (plugins/tests/logicTest.cpp): the dtype dispatch table, the identity
 * fields, the creator-side parse and the shape helpers. Each op's own rules
 * live in its folder (msarFusedMixerPlugin/fusedMixerRules.h,
 * msarDepthRetrievalPlugin/depthRetrievalRules.h); names, fields and defaults
 * come from the generated msarOpContracts.h (msar_export/contracts.py).
 * The TensorRT glue (xPlugin.cpp) converts TensorRT structs to and from these
 * plain types and never re-implements a rule.
 */
#ifndef MSAR_PLUGIN_LOGIC_H
#define MSAR_PLUGIN_LOGIC_H

#include <cmath>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "msarKernelTypes.h"
#include "msarOpContracts.h"
#include "msarPluginFields.h"

namespace msar
{

constexpr int32_t kMaxSources = MSAR_MAX_SOURCES;
constexpr int32_t kMaxStreams = MSAR_MAX_STREAMS;
constexpr int32_t kMaxKernel = MSAR_MAX_KERNEL;

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
// Fields and attributes.

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

inline void checkEps(char const* op, float eps)
{
    if (!std::isfinite(eps) || eps <= 0.F)
    {
        fail(op, ": eps must be a finite positive float, got ", eps);
    }
}

//! Creator side: fields from the ONNX parser (or from deserialisation) ->
//! attributes. Every field needs a name; `read(attrs, f)` takes the op's
//! attributes (the generated readXField) and returns false for a name it does
//! not know; plugin_version / plugin_namespace are checked; anything else is
//! refused, listing `specs`. Unknown names are an error, never silently
//! ignored. Then validate().
template <typename Attrs, size_t N, typename Read>
Attrs parseAttrs(char const* op, FieldSpec const (&specs)[N], FieldView const* fields, int32_t nbFields, Read&& read)
{
    Attrs a;
    for (int32_t i = 0; i < nbFields; ++i)
    {
        FieldView const& f = fields[i];
        if (f.name == nullptr)
        {
            fail(op, ": field ", i, " has no name");
        }
        if (read(a, f))
        {
            continue;
        }
        if (std::strcmp(f.name, "plugin_version") == 0 || std::strcmp(f.name, "plugin_namespace") == 0)
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

//! Variadic input `name`'s batch and sequence axes (0, 1) equal those of the
//! inputs before it; the first known values set `batch` and `seq`.
inline void expectBatchAndSeq(char const* op, InputName const& name, Shape const& s, int64_t& batch, int64_t& seq)
{
    int64_t const dims[2] = {batch, seq};
    char const* const what[2] = {"the batch of ", "the sequence length of "};
    for (int32_t axis = 0; axis < 2; ++axis)
    {
        int64_t const v = s.d[axis];
        if (known(v) && known(dims[axis]) && v != dims[axis])
        {
            fail(op, ": input '", name, "' has shape ", str(s), "; axis ", axis, " must be ", what[axis],
                InputName{name.base, 0}, " = ", dims[axis]);
        }
    }
    batch = known(batch) ? batch : s.d[0];
    seq = known(seq) ? seq : s.d[1];
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

} // namespace msar

#endif // MSAR_PLUGIN_LOGIC_H

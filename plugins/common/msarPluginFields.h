/*
 * The plugin field codec: a TensorRT-free mirror of PluginField, typed
 * readers and the error type every rule throws. The generated
 * msarOpContracts.h builds each op's field table and reader from these.
 */
#ifndef MSAR_PLUGIN_FIELDS_H
#define MSAR_PLUGIN_FIELDS_H

#include <cstdint>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace msar
{

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

//! The one value of a scalar field of `kind` (T float for kFLOAT32, int32_t for kINT32).
template <typename T>
T scalarField(char const* op, FieldView const& f, FieldKind kind, char const* what)
{
    expectKind(op, f, kind);
    if (f.length != 1)
    {
        fail(op, ": attribute '", f.name, "' must hold one ", what, ", got ", f.length);
    }
    T v{};
    std::memcpy(&v, f.data, sizeof(T));
    return v;
}

inline float scalarFloat(char const* op, FieldView const& f)
{
    return scalarField<float>(op, f, FieldKind::kFLOAT32, "float");
}

inline int32_t scalarInt(char const* op, FieldView const& f)
{
    return scalarField<int32_t>(op, f, FieldKind::kINT32, "int");
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

inline std::vector<int32_t> intsField(char const* op, FieldView const& f)
{
    expectKind(op, f, FieldKind::kINT32);
    std::vector<int32_t> v(static_cast<size_t>(f.length > 0 ? f.length : 0));
    if (!v.empty())
    {
        std::memcpy(v.data(), f.data, sizeof(int32_t) * v.size());
    }
    return v;
}

//! A CHAR field over a static C string (serialised without its terminator, as ONNX strings are).
inline FieldView stringView(char const* name, char const* value)
{
    return {name, FieldKind::kCHAR, value, static_cast<int32_t>(std::strlen(value))};
}

} // namespace msar

#endif // MSAR_PLUGIN_FIELDS_H

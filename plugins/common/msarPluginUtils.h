/*
 * TensorRT-facing helpers shared by the msar plugins: conversions between
 * TensorRT structs and the plain types of msarPluginLogic.h, logging, and the
 * noexcept guard every override runs its body in.
 */
#ifndef MSAR_PLUGIN_UTILS_H
#define MSAR_PLUGIN_UTILS_H

#include "NvInferRuntime.h"

#include "msarPluginLogic.h"

#include <exception>
#include <string>
#include <utility>
#include <vector>

namespace msar
{

//! Log an error through the logger TensorRT handed to setLoggerFinder, or stderr.
void logError(char const* where, char const* what) noexcept;
void setLoggerFinder(nvinfer1::ILoggerFinder* finder) noexcept;

//! Log `what` at the location `where()` builds (a std::string); the location
//! is only built when there is an error to log.
template <typename Where>
void logErrorAt(Where const& where, char const* what) noexcept
{
    std::string w;
    try
    {
        w = where();
    }
    catch (...)
    {
    }
    logError(w.c_str(), what);
}

//! Run `body` (returning T); on any exception log it at `where()` and return
//! `onError`. Every noexcept override of the plugins that can fail goes
//! through this (or through guarded below).
template <typename T, typename Where, typename F>
T guardedAt(Where const& where, T onError, F&& body) noexcept
{
    try
    {
        return body();
    }
    catch (std::exception const& e)
    {
        logErrorAt(where, e.what());
    }
    catch (...)
    {
        logErrorAt(where, "unknown exception");
    }
    return onError;
}

//! guardedAt() for a plugin method: errors are logged at "<op>::<method>".
template <typename T, typename F>
T guarded(char const* op, char const* method, T onError, F&& body) noexcept
{
    auto const where = [op, method] { return std::string(op) + "::" + method; };
    return guardedAt<T>(where, onError, std::forward<F>(body));
}

inline DType toDType(nvinfer1::DataType t) noexcept
{
    switch (t)
    {
    case nvinfer1::DataType::kFLOAT: return DType::kFLOAT32;
    case nvinfer1::DataType::kHALF: return DType::kFLOAT16;
    case nvinfer1::DataType::kBF16: return DType::kBFLOAT16;
    default: return DType::kUNSUPPORTED;
    }
}

//! Shape of `d` (Dims or DimsExprs) with each dimension mapped by `dim`.
template <typename D, typename Dim>
Shape toShapeWith(D const& d, Dim&& dim)
{
    if (d.nbDims < 0 || d.nbDims > kMaxRank)
    {
        fail("tensor rank ", d.nbDims, " is outside 0..", kMaxRank);
    }
    Shape s;
    s.nbDims = d.nbDims;
    for (int32_t i = 0; i < d.nbDims; ++i)
    {
        s.d[i] = dim(d.d[i]);
    }
    return s;
}

inline Shape toShape(nvinfer1::Dims const& d)
{
    return toShapeWith(d, [](int64_t v) { return v; });
}

//! Build-time shapes: a dimension expression is known only if constant.
inline Shape toShape(nvinfer1::DimsExprs const& d)
{
    return toShapeWith(d, [](nvinfer1::IDimensionExpr const* e) -> int64_t {
        return e != nullptr && e->isConstant() ? e->getConstantValue() : -1;
    });
}

inline FieldKind toFieldKind(nvinfer1::PluginFieldType t) noexcept
{
    switch (t)
    {
    case nvinfer1::PluginFieldType::kINT32: return FieldKind::kINT32;
    case nvinfer1::PluginFieldType::kFLOAT32: return FieldKind::kFLOAT32;
    case nvinfer1::PluginFieldType::kCHAR: return FieldKind::kCHAR;
    default: return FieldKind::kOTHER;
    }
}

inline nvinfer1::PluginFieldType toPluginFieldType(FieldKind k) noexcept
{
    switch (k)
    {
    case FieldKind::kINT32: return nvinfer1::PluginFieldType::kINT32;
    case FieldKind::kFLOAT32: return nvinfer1::PluginFieldType::kFLOAT32;
    case FieldKind::kCHAR: return nvinfer1::PluginFieldType::kCHAR;
    case FieldKind::kOTHER: break;
    }
    return nvinfer1::PluginFieldType::kUNKNOWN;
}

inline std::vector<FieldView> toFieldViews(nvinfer1::PluginFieldCollection const* fc)
{
    std::vector<FieldView> out;
    if (fc == nullptr)
    {
        return out;
    }
    if (fc->nbFields > 0 && fc->fields == nullptr)
    {
        fail("plugin field collection has ", fc->nbFields, " fields but no field array");
    }
    for (int32_t i = 0; i < fc->nbFields; ++i)
    {
        nvinfer1::PluginField const& f = fc->fields[i];
        out.push_back(FieldView{f.name, toFieldKind(f.type), f.data, f.length});
    }
    return out;
}

//! Fill `storage` with PluginFields for `views` and point `fc` at them.
inline void toPluginFields(std::vector<FieldView> const& views, std::vector<nvinfer1::PluginField>& storage,
    nvinfer1::PluginFieldCollection& fc)
{
    storage.clear();
    for (auto const& v : views)
    {
        storage.emplace_back(v.name, v.data, toPluginFieldType(v.kind), v.length);
    }
    fc.nbFields = static_cast<int32_t>(storage.size());
    fc.fields = storage.data();
}

//! getFieldNames(): name and type of every field, no data.
template <size_t N>
void fieldNames(FieldSpec const (&specs)[N], std::vector<nvinfer1::PluginField>& storage,
    nvinfer1::PluginFieldCollection& fc)
{
    storage.clear();
    for (auto const& s : specs)
    {
        storage.emplace_back(s.name, nullptr, toPluginFieldType(s.kind), 0);
    }
    fc.nbFields = static_cast<int32_t>(storage.size());
    fc.fields = storage.data();
}

//! The type rule of msarPluginLogic.h (checkOpTypes) on TensorRT data types.
inline DType checkTypes(char const* op, nvinfer1::DataType const* types, int32_t nb)
{
    std::vector<DType> t;
    for (int32_t i = 0; i < nb; ++i)
    {
        t.push_back(toDType(types[i]));
    }
    return checkOpTypes(op, t.data(), nb);
}

} // namespace msar

#endif // MSAR_PLUGIN_UTILS_H

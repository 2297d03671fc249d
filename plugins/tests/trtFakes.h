/*
 * Stand-ins for what TensorRT hands a plugin (dimension expressions, a resource
 * context with a counting allocator) and the creator lookup, shared by glueTest.cpp
 * and pluginHarness.cpp. Header-only, test code; needs the TensorRT headers only.
 */
#ifndef MSAR_TRT_FAKES_H
#define MSAR_TRT_FAKES_H

#include "NvInferRuntime.h"

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>
#include <vector>

extern "C" nvinfer1::IPluginCreatorInterface* const* getCreators(int32_t& nbCreators);

namespace msar_test
{
using namespace nvinfer1;

inline int gChecks = 0;

inline void check(bool ok, char const* what, int line)
{
    ++gChecks;
    if (!ok)
    {
        std::printf("FAILED line %d: %s\n", line, what);
        std::exit(1);
    }
}
#define CHECK(x) ::msar_test::check((x), #x, __LINE__)

struct FakeDimImpl : apiv::VDimensionExpr
{
    explicit FakeDimImpl(int64_t v)
        : value(v)
    {
    }
    bool isConstant() const override
    {
        return value >= 0;
    }
    int64_t getConstantValue() const override
    {
        return value >= 0 ? value : std::numeric_limits<int64_t>::min();
    }
    bool isSizeTensor() const override
    {
        return false;
    }
    int64_t value;
};

struct FakeDim : IDimensionExpr
{
    explicit FakeDim(int64_t v)
        : impl(v)
    {
        mImpl = &impl;
    }
    FakeDimImpl impl;
};

struct FakeExprBuilder : IExprBuilder
{
    FakeExprBuilder()
    {
        mImpl = nullptr; // the plugins build no new expressions
    }
};

//! Owns the fake expressions of a set of build-time shapes (-1 = dynamic).
struct ExprShapes
{
    std::vector<std::unique_ptr<FakeDim>> dims;
    std::vector<DimsExprs> shapes;

    explicit ExprShapes(std::vector<std::vector<int64_t>> const& in)
    {
        for (auto const& s : in)
        {
            DimsExprs e{};
            e.nbDims = static_cast<int32_t>(s.size());
            for (size_t i = 0; i < s.size(); ++i)
            {
                dims.push_back(std::make_unique<FakeDim>(s[i]));
                e.d[i] = dims.back().get();
            }
            shapes.push_back(e);
        }
    }
};

inline Dims dimsOf(std::vector<int64_t> const& s)
{
    Dims d{};
    d.nbDims = static_cast<int32_t>(s.size());
    for (size_t i = 0; i < s.size(); ++i)
    {
        d.d[i] = s[i];
    }
    return d;
}

inline int64_t volume(std::vector<int64_t> const& s)
{
    int64_t v = 1;
    for (auto x : s)
    {
        v *= x;
    }
    return v;
}

inline std::vector<float> randomFloats(int64_t n, uint32_t seed, float scale)
{
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v)
    {
        seed = seed * 1664525u + 1013904223u;
        x = scale * (static_cast<float>(seed >> 8) / 16777216.0F * 2.0F - 1.0F);
    }
    return v;
}

inline IPluginCreatorV3One* creatorNamed(char const* name)
{
    int32_t n = 0;
    auto const* list = getCreators(n);
    for (int32_t i = 0; i < n; ++i)
    {
        auto* c = static_cast<IPluginCreatorV3One*>(list[i]);
        if (std::string(c->getPluginName()) == name)
        {
            return c;
        }
    }
    return nullptr;
}

inline std::vector<std::string> fieldNamesOf(PluginFieldCollection const* fc)
{
    std::vector<std::string> out;
    for (int32_t i = 0; i < fc->nbFields; ++i)
    {
        out.emplace_back(fc->fields[i].name);
    }
    return out;
}

template <typename T>
T* capability(IPluginV3* p, PluginCapabilityType t)
{
    return static_cast<T*>(p->getCapabilityInterface(t));
}

//! Memory from `alloc` (host or device, the caller's choice), every call counted: enqueue must make none.
class CountingAllocator : public IGpuAllocator
{
public:
    std::atomic<int> allocations{0};
    std::atomic<int> frees{0};

    void* allocate(uint64_t const size, uint64_t const /*alignment*/, AllocatorFlags const /*flags*/) noexcept override
    {
        ++allocations;
        return std::malloc(static_cast<size_t>(size));
    }

    bool deallocate(void* const memory) noexcept override
    {
        ++frees;
        std::free(memory);
        return true;
    }

    // The stream-ordered calls (what the plugin used before issue 23) counted here too, not through the
    // header's default forwarding to allocate(), which a TensorRT release may change.
    void* allocateAsync(uint64_t const size, uint64_t const alignment, AllocatorFlags const flags,
        cudaStream_t /*stream*/) noexcept override
    {
        return allocate(size, alignment, flags);
    }

    bool deallocateAsync(void* const memory, cudaStream_t /*stream*/) noexcept override
    {
        return deallocate(memory);
    }
};

class FakeResourceContext : public IPluginResourceContext
{
public:
    explicit FakeResourceContext(IGpuAllocator* allocator)
        : mAllocator(allocator)
    {
    }

    IGpuAllocator* getGpuAllocator() const noexcept override
    {
        return mAllocator;
    }

    IErrorRecorder* getErrorRecorder() const noexcept override
    {
        return nullptr;
    }

private:
    IGpuAllocator* mAllocator;
};

} // namespace msar_test

#endif // MSAR_TRT_FAKES_H

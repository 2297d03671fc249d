/*
 * Plugin harness (issue 23): both plugins driven the way TensorRT drives them, without TensorRT -
 * creator -> plugin from the fields the ONNX parser passes -> build-phase calls -> serialise and
 * re-create -> attach to a resource context whose allocator counts calls -> onShapeChange ->
 * enqueue on a non-blocking stream with a workspace off 16-byte alignment - for every dtype, decode
 * and prefill shapes in a sequence that grows and shrinks, two contexts on two threads, and (on a
 * GPU) CUDA-graph capture and replay. Every output is checked against an independent float64
 * reference and, bit for bit, against the kernel's C ABI called directly. Enqueue allocates nothing:
 * the allocator must see no call, nor (on the emulation) cudaMalloc/cudaMallocAsync; a too-small
 * workspace must be refused without a crash. tests/test_gpu_check.py puts the old allocation back.
 *
 * Built as `pluginHarness` by plugins/tests/CMakeLists.txt: on the CUDA build of the kernels when
 * nvcc is there (scripts/gpu_check.sh runs it on a GPU), else on the CPU emulation (the test suite).
 */
#include "../msarDepthRetrievalPlugin/depthRetrievalKernel.h"
#include "../msarDepthRetrievalPlugin/depthRetrievalPlugin.h"
#include "../msarFusedMixerPlugin/fusedMixerKernel.h"
#include "../msarFusedMixerPlugin/fusedMixerPlugin.h"
#include "trtFakes.h"

#include <cmath>
#include <cstring>
#include <thread>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

using namespace nvinfer1;
using namespace msar_test;

namespace
{
#if MSAR_HARNESS_DEVICE
constexpr bool kDevice = true;
void* devAlloc(size_t b)
{
    void* p = nullptr;
    CHECK(cudaMalloc(&p, b) == cudaSuccess);
    return p;
}
void devFree(void* p)
{
    cudaFree(p);
}
void copy(void* dst, void const* src, size_t b, cudaMemcpyKind kind)
{
    CHECK(cudaMemcpy(dst, src, b, kind) == cudaSuccess);
}
cudaStream_t newStream()
{
    cudaStream_t s{};
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    return s;
}
void sync(cudaStream_t s)
{
    CHECK(cudaStreamSynchronize(s) == cudaSuccess);
}
//! On the device cudaMalloc is cudart's own and not counted: direct CUDA allocations are counted on the
//! emulation only (the allocator's calls are counted on both).
int cudaAllocationCalls()
{
    return 0;
}
#else
constexpr bool kDevice = false; // the emulation: "device" memory is host memory, launches run at once
extern "C" int msarEmuCudaAllocations(); // emulatedCudaMemory.cpp: cudaMalloc/cudaMallocAsync calls so far
int cudaAllocationCalls()
{
    return msarEmuCudaAllocations();
}
void* devAlloc(size_t b)
{
    return std::malloc(b);
}
void devFree(void* p)
{
    std::free(p);
}
void copy(void* dst, void const* src, size_t b, int)
{
    std::memcpy(dst, src, b);
}
cudaStream_t newStream()
{
    return nullptr;
}
void sync(cudaStream_t) {}
constexpr int cudaMemcpyHostToDevice = 0, cudaMemcpyDeviceToHost = 0;
#endif

struct DType
{
    DataType trt;
    int32_t code;
    size_t size;
    double bound; // rel. error vs float64: the output rounded once to the type, with margin
    char const* name;
};
DType const kTypes[] = {{DataType::kFLOAT, MSAR_DTYPE_FLOAT32, 4, 1e-5, "float32"},
    {DataType::kHALF, MSAR_DTYPE_FLOAT16, 2, 2e-3, "float16"}, {DataType::kBF16, MSAR_DTYPE_BFLOAT16, 2, 1.6e-2, "bfloat16"}};

//! Values rounded to the type (what the kernel sees) and their bytes on the device.
struct Tensor
{
    std::vector<int64_t> shape;
    std::vector<double> values;
    void* dev{nullptr};
    Tensor(DType const& t, std::vector<int64_t> s, uint32_t seed, float scale)
        : shape(std::move(s))
    {
        auto const v = randomFloats(volume(shape), seed, scale);
        std::vector<unsigned char> bytes(v.size() * t.size);
        for (size_t k = 0; k < v.size(); ++k)
        {
            float f = v[k];
            if (t.code == MSAR_DTYPE_FLOAT16)
            {
                __half const h = __float2half_rn(f);
                f = __half2float(h);
                std::memcpy(bytes.data() + 2 * k, &h, 2);
            }
            else if (t.code == MSAR_DTYPE_BFLOAT16)
            {
                __nv_bfloat16 const h = __float2bfloat16_rn(f);
                f = __bfloat162float(h);
                std::memcpy(bytes.data() + 2 * k, &h, 2);
            }
            else
            {
                std::memcpy(bytes.data() + 4 * k, &f, 4);
            }
            values.push_back(f);
        }
        dev = devAlloc(bytes.size() + 1);
        copy(dev, bytes.data(), bytes.size(), cudaMemcpyHostToDevice);
    }
    ~Tensor()
    {
        devFree(dev);
    }
    Tensor(Tensor const&) = delete;
};

std::vector<double> fetch(DType const& t, void const* dev, int64_t count)
{
    std::vector<unsigned char> bytes(static_cast<size_t>(count) * t.size);
    copy(bytes.data(), dev, bytes.size(), cudaMemcpyDeviceToHost);
    std::vector<double> out(static_cast<size_t>(count));
    for (int64_t k = 0; k < count; ++k)
    {
        unsigned char const* p = bytes.data() + k * t.size;
        if (t.code == MSAR_DTYPE_FLOAT32)
        {
            float f;
            std::memcpy(&f, p, 4);
            out[k] = f;
        }
        else if (t.code == MSAR_DTYPE_FLOAT16)
        {
            __half h;
            std::memcpy(&h, p, 2);
            out[k] = __half2float(h);
        }
        else
        {
            __nv_bfloat16 h;
            std::memcpy(&h, p, 2);
            out[k] = __bfloat162float(h);
        }
    }
    return out;
}

double relErr(std::vector<double> const& got, std::vector<double> const& ref)
{
    double num = 0, den = 0;
    for (size_t k = 0; k < ref.size(); ++k)
    {
        num += (got[k] - ref[k]) * (got[k] - ref[k]);
        den += ref[k] * ref[k];
    }
    return std::sqrt(num / (den > 0 ? den : 1));
}

//! softmax_i(q . v_i / rms(v_i)) weighted sum of the vectors v[i][0..d), float64.
std::vector<double> retrieve(std::vector<std::vector<double>> const& v, double const* q, int64_t d, double eps)
{
    std::vector<double> s(v.size());
    double mx = -INFINITY;
    for (size_t i = 0; i < v.size(); ++i)
    {
        double qv = 0, ss = 0;
        for (int64_t c = 0; c < d; ++c)
        {
            qv += q[c] * v[i][c];
            ss += v[i][c] * v[i][c];
        }
        s[i] = qv / std::sqrt(ss / static_cast<double>(d) + eps);
        mx = std::fmax(mx, s[i]);
    }
    double den = 0;
    for (auto& x : s)
    {
        den += (x = std::exp(x - mx));
    }
    std::vector<double> z(static_cast<size_t>(d), 0.0);
    for (size_t i = 0; i < v.size(); ++i)
    {
        for (int64_t c = 0; c < d; ++c)
        {
            z[c] += s[i] / den * v[i][c];
        }
    }
    return z;
}

//! One plugin instance attached to a context, run over a shape sequence; `Op` supplies shapes and references.
struct MixerOp
{
    static constexpr char const* kName = "FusedMixer";
    std::vector<int32_t> ks{1, 3, 5};
    int64_t n = 3, d = 64, N = 4, K = 8;
    int64_t m() const
    {
        return static_cast<int64_t>(ks.size());
    }
    std::vector<std::vector<int64_t>> shapes(int64_t B, int64_t T) const
    {
        std::vector<std::vector<int64_t>> s = {{m(), d}, {m(), m() * d}, {m()}, {}, {N, K, d}};
        for (int64_t i = 0; i < n; ++i)
        {
            s.push_back({B, T, d});
        }
        s.push_back({B, T, d});
        return s;
    }
    std::vector<PluginField> fields(float const& eps) const
    {
        return {PluginField("stream_kernels", ks.data(), PluginFieldType::kINT32, static_cast<int32_t>(ks.size())),
            PluginField("eps", &eps, PluginFieldType::kFLOAT32, 1), PluginField("plugin_version", "1", PluginFieldType::kCHAR, 1),
            PluginField("plugin_namespace", "", PluginFieldType::kCHAR, 0)};
    }
    std::vector<double> reference(std::vector<std::unique_ptr<Tensor>> const& in, int64_t B, int64_t T, double eps) const
    {
        auto const& q = in[0]->values;
        auto const& W = in[1]->values;
        auto const& w = in[4]->values;
        std::vector<double> h;
        for (int64_t b = 0; b < B; ++b)
        {
            for (int64_t t = 0; t < T; ++t)
            {
                std::vector<std::vector<double>> z;
                for (int64_t r = 0, o = 0; r < m(); o += r == 0 ? 0 : ks[r], ++r)
                {
                    std::vector<std::vector<double>> views(static_cast<size_t>(n), std::vector<double>(d, 0.0));
                    for (int64_t i = 0; i < n; ++i)
                    {
                        auto const& x = in[5 + i]->values;
                        for (int64_t c = 0; c < d; ++c)
                        {
                            for (int64_t j = 0; j < ks[r]; ++j)
                            {
                                int64_t const tt = t - (ks[r] - 1 - j);
                                double const tap = r == 0 ? 1.0 : w[(i * K + o + j) * d + c];
                                views[i][c] += tt < 0 ? 0.0 : tap * x[(b * T + tt) * d + c];
                            }
                        }
                    }
                    z.push_back(retrieve(views, q.data() + r * d, d, eps));
                }
                std::vector<double> out(static_cast<size_t>(d), 0.0);
                for (int64_t r = 0; r < m(); ++r)
                {
                    double logit = 0;
                    for (int64_t k = 0; k < m() * d; ++k)
                    {
                        logit += W[r * m() * d + k] * z[k / d][k % d];
                    }
                    double const g = 1.0 / (1.0 + std::exp(-(in[3]->values[0] * logit + in[2]->values[r])));
                    for (int64_t c = 0; c < d; ++c)
                    {
                        out[c] += g * z[r][c];
                    }
                }
                h.insert(h.end(), out.begin(), out.end());
            }
        }
        return h;
    }
    int32_t direct(DType const& t, std::vector<std::unique_ptr<Tensor>> const& in, int64_t B, int64_t T, void* out,
        void* ws, size_t wsSize, float eps, cudaStream_t s) const
    {
        std::vector<void const*> src;
        for (int64_t i = 0; i < n; ++i)
        {
            src.push_back(in[5 + i]->dev);
        }
        MsarFusedMixerArgs a{};
        a.query = in[0]->dev, a.gate_weight = in[1]->dev, a.gate_bias = in[2]->dev, a.gate_scale = in[3]->dev;
        a.conv_weight = in[4]->dev, a.sources = src.data(), a.n_sources = static_cast<int32_t>(n);
        a.batch = B, a.seq = T, a.d = d, a.conv_rows = N, a.stream_kernels = ks.data();
        a.n_streams = static_cast<int32_t>(m()), a.eps = eps, a.out = out, a.workspace = ws, a.workspace_size = wsSize;
        return msarFusedMixerForward(t.code, &a, s);
    }
    size_t workspace() const
    {
        return msarFusedMixerWorkspaceSize(static_cast<int32_t>(n), d, ks.data(), static_cast<int32_t>(m()));
    }
};

struct RetrievalOp
{
    static constexpr char const* kName = "DepthRetrieval";
    int64_t n = 3, m = 4, d = 64;
    std::vector<std::vector<int64_t>> shapes(int64_t B, int64_t T) const
    {
        std::vector<std::vector<int64_t>> s = {{m, d}};
        for (int64_t i = 0; i <= n; ++i)
        {
            s.push_back({B, T, m, d}); // n views, then the output
        }
        return s;
    }
    std::vector<PluginField> fields(float const& eps) const
    {
        return {PluginField("eps", &eps, PluginFieldType::kFLOAT32, 1), PluginField("plugin_version", "1", PluginFieldType::kCHAR, 1),
            PluginField("plugin_namespace", "", PluginFieldType::kCHAR, 0)};
    }
    std::vector<double> reference(std::vector<std::unique_ptr<Tensor>> const& in, int64_t B, int64_t T, double eps) const
    {
        std::vector<double> out;
        for (int64_t row = 0; row < B * T * m; ++row)
        {
            std::vector<std::vector<double>> views;
            for (int64_t i = 0; i < n; ++i)
            {
                auto const& v = in[1 + i]->values;
                views.emplace_back(v.begin() + row * d, v.begin() + (row + 1) * d);
            }
            auto const z = retrieve(views, in[0]->values.data() + (row % m) * d, d, eps);
            out.insert(out.end(), z.begin(), z.end());
        }
        return out;
    }
    int32_t direct(DType const& t, std::vector<std::unique_ptr<Tensor>> const& in, int64_t B, int64_t T, void* out,
        void*, size_t, float eps, cudaStream_t s) const
    {
        std::vector<void const*> views;
        for (int64_t i = 0; i < n; ++i)
        {
            views.push_back(in[1 + i]->dev);
        }
        MsarDepthRetrievalArgs a{};
        a.query = in[0]->dev, a.views = views.data(), a.n_sources = static_cast<int32_t>(n), a.batch = B, a.seq = T;
        a.n_streams = m, a.d = d, a.eps = eps, a.out = out;
        return msarDepthRetrievalForward(t.code, &a, s);
    }
    size_t workspace() const
    {
        return 0;
    }
};

//! (B, T) in the order a server would see them: decode, prefill, a larger prefill, back down.
std::vector<std::pair<int64_t, int64_t>> const kSequence = {{2, 1}, {1, 19}, {3, 33}, {1, 2}, {2, 1}};

template <typename Op>
std::unique_ptr<IPluginV3> builtAndReloaded(Op const& op, DType const& t, float const& eps, size_t& wsOut)
{
    auto fields = op.fields(eps);
    PluginFieldCollection fc{static_cast<int32_t>(fields.size()), fields.data()};
    auto* creator = creatorNamed(Op::kName);
    std::unique_ptr<IPluginV3> plugin(creator->createPlugin("node", &fc, TensorRTPhase::kBUILD));
    CHECK(plugin != nullptr);
    auto* build = capability<IPluginV3OneBuild>(plugin.get(), PluginCapabilityType::kBUILD);
    auto lo = op.shapes(1, 1), hi = op.shapes(3, 33);
    int32_t const nbIn = static_cast<int32_t>(lo.size()) - 1;
    std::vector<DynamicPluginTensorDesc> io(lo.size());
    for (size_t i = 0; i < lo.size(); ++i)
    {
        io[i].desc.dims = dimsOf(hi[i]);
        io[i].desc.type = t.trt;
        io[i].desc.format = TensorFormat::kLINEAR;
        io[i].min = dimsOf(lo[i]);
        io[i].opt = dimsOf(hi[i]);
        io[i].max = dimsOf(hi[i]);
    }
    std::vector<DataType> types(static_cast<size_t>(nbIn), t.trt);
    DataType outType{};
    CHECK(build->getOutputDataTypes(&outType, 1, types.data(), nbIn) == 0 && outType == t.trt);
    for (int32_t pos = 0; pos <= nbIn; ++pos)
    {
        CHECK(build->supportsFormatCombination(pos, io.data(), nbIn, 1));
    }
    CHECK(build->configurePlugin(io.data(), nbIn, &io[nbIn], 1) == 0);
    wsOut = build->getWorkspaceSize(io.data(), nbIn, &io[nbIn], 1);
    CHECK(wsOut == op.workspace());
    auto* rt = capability<IPluginV3OneRuntime>(plugin.get(), PluginCapabilityType::kRUNTIME);
    return std::unique_ptr<IPluginV3>(creator->createPlugin("node", rt->getFieldsToSerialize(), TensorRTPhase::kRUNTIME));
}

//! Runs `op` on a context over kSequence; every enqueue against float64 and, bit for bit, the direct call.
template <typename Op>
void runSequence(Op const& op, DType const& t, IPluginV3* engine, IPluginResourceContext* resources, uint32_t seed)
{
    float const eps = 1e-6F;
    std::unique_ptr<IPluginV3> ctx(
        capability<IPluginV3OneRuntime>(engine, PluginCapabilityType::kRUNTIME)->attachToContext(resources));
    CHECK(ctx != nullptr);
    auto* run = capability<IPluginV3OneRuntime>(ctx.get(), PluginCapabilityType::kRUNTIME);
    cudaStream_t const stream = newStream();
    size_t const ws = op.workspace();
    unsigned char* wsBase = static_cast<unsigned char*>(devAlloc(ws + 64));
    unsigned char* wsDirect = static_cast<unsigned char*>(devAlloc(ws + 64));
    for (auto [B, T] : kSequence)
    {
        auto const shapes = op.shapes(B, T);
        std::vector<std::unique_ptr<Tensor>> in;
        std::vector<void const*> ptrs;
        std::vector<PluginTensorDesc> desc(shapes.size());
        for (size_t i = 0; i < shapes.size(); ++i)
        {
            desc[i].dims = dimsOf(shapes[i]);
            desc[i].type = t.trt;
            desc[i].format = TensorFormat::kLINEAR;
            float const scale = i == 0 ? 0.3F : (i == 1 ? 0.15F : 0.6F);
            in.push_back(std::make_unique<Tensor>(t, shapes[i], seed + static_cast<uint32_t>(7 * i + B * 31 + T), scale));
            ptrs.push_back(in.back()->dev);
        }
        int32_t const nbIn = static_cast<int32_t>(shapes.size()) - 1;
        CHECK(run->onShapeChange(desc.data(), nbIn, &desc[nbIn], 1) == 0);
        int64_t const count = volume(shapes.back());
        void* out = in.back()->dev;
        // TensorRT's workspace is aligned; 16 bytes off 256 checks nothing assumes more than the kernels need.
        CHECK(run->enqueue(desc.data(), &desc[nbIn], ptrs.data(), &out, ws > 0 ? wsBase + 16 : nullptr, stream) == 0);
        sync(stream);
        auto const got = fetch(t, out, count);
        double const err = relErr(got, op.reference(in, B, T, eps));
        if (!(err <= t.bound))
        {
            std::printf("%s %s B=%ld T=%ld: rel. error %.3g over %.3g\n", Op::kName, t.name, static_cast<long>(B),
                static_cast<long>(T), err, t.bound);
        }
        CHECK(err <= t.bound);
        Tensor expect(t, shapes.back(), 1, 0.F);
        CHECK(op.direct(t, in, B, T, expect.dev, wsDirect, ws, eps, stream) == MSAR_STATUS_OK);
        sync(stream);
        CHECK(fetch(t, expect.dev, count) == got);
#if MSAR_HARNESS_DEVICE
        // Captured into a CUDA graph and replayed: the same bits (nothing in enqueue may break a capture).
        cudaGraph_t graph{};
        cudaGraphExec_t exec{};
        CHECK(cudaMemsetAsync(out, 0, static_cast<size_t>(count) * t.size, stream) == cudaSuccess);
        CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) == cudaSuccess);
        int32_t const captured = run->enqueue(desc.data(), &desc[nbIn], ptrs.data(), &out, wsBase + 16, stream);
        CHECK(cudaStreamEndCapture(stream, &graph) == cudaSuccess && captured == 0);
        CHECK(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
        CHECK(cudaGraphLaunch(exec, stream) == cudaSuccess && cudaGraphLaunch(exec, stream) == cudaSuccess);
        sync(stream);
        CHECK(fetch(t, out, count) == got);
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
#endif
        if (ws > 0)
        {
            // A workspace smaller than the split needs is refused, not overrun.
            CHECK(op.direct(t, in, B, T, expect.dev, wsDirect, 8, eps, stream) == MSAR_STATUS_WORKSPACE_TOO_SMALL);
        }
    }
    devFree(wsBase);
    devFree(wsDirect);
#if MSAR_HARNESS_DEVICE
    cudaStreamDestroy(stream);
#endif
}

//! Issue 23 defect 3: enqueue may not allocate, neither through the resource context's allocator (as it did
//! before) nor from CUDA directly (counted on the emulation). Names the kind of allocation it saw.
void checkNoAllocation(char const* op, char const* type, CountingAllocator const& allocator, int cudaCalls)
{
    if (allocator.allocations != 0 || allocator.frees != 0)
    {
        std::printf("FAILED: %s %s: enqueue allocated through the resource context's IGpuAllocator: %d "
                    "allocate/allocateAsync and %d deallocate/deallocateAsync calls\n",
            op, type, allocator.allocations.load(), allocator.frees.load());
    }
    if (cudaCalls != 0)
    {
        std::printf("FAILED: %s %s: enqueue called cudaMalloc/cudaMallocAsync %d times\n", op, type, cudaCalls);
    }
    CHECK(allocator.allocations == 0 && allocator.frees == 0 && cudaCalls == 0);
}

template <typename Op>
void testOp(Op const& op)
{
    for (auto const& t : kTypes)
    {
        float const eps = 1e-6F;
        size_t ws = 0;
        auto engine = builtAndReloaded(op, t, eps, ws);
        CountingAllocator allocator;
        FakeResourceContext resources(&allocator);
        int const cudaBefore = cudaAllocationCalls();
        runSequence(op, t, engine.get(), &resources, 11);
        // Two execution contexts of one engine on two threads at once.
        std::thread other([&] { runSequence(op, t, engine.get(), &resources, 23); });
        runSequence(op, t, engine.get(), &resources, 37);
        other.join();
        checkNoAllocation(Op::kName, t.name, allocator, cudaAllocationCalls() - cudaBefore);
        std::printf("ok: %s %s (%zu B workspace, no allocation in enqueue)\n", Op::kName, t.name, ws);
    }
}
} // namespace

int main()
{
    testOp(MixerOp{});
    testOp(RetrievalOp{});
    std::printf("%s\n", kDevice ? "graph capture and replay: checked" : "graph capture: skipped (CPU emulation)");
    std::printf("pluginHarness: %d checks passed\n", gChecks);
    return 0;
}

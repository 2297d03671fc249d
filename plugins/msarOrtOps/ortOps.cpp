/*
 * ONNX Runtime custom-op library for the msar ops: FusedMixer, DepthRetrieval,
 * SourceViews, StreamGate, SourceScores, ScoredMixer and ConvState (msar_export/contracts.py, generated common/msarOpContracts.h),
 * float32, float16 and bfloat16 storage (float32 inside), on the CPU execution provider.
 *
 *   so.register_custom_ops_library("libmsar_ort_ops.so")
 *
 * Built against the API-21 headers with ORT_API_MANUAL_INIT and linked against
 * nothing from ONNX Runtime: the API table comes from the OrtApiBase the host
 * passes to RegisterCustomOps, so one build loads in any ONNX Runtime whose
 * API version is 21 or newer.  A registered kernel takes the node; the model's
 * local function body is then not inlined.  Work is split with
 * KernelContext_ParallelFor, so intra_op_num_threads governs it and the
 * library starts no thread of its own.
 */
#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>
#undef ORT_API_MANUAL_INIT

#include "cpuKernels.h"
#include "msarOpContracts.h"

#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace
{

using msar::cpu::Storage;
using Shape = std::vector<int64_t>;

constexpr char const* kDomain = "msar";

class OrtParallel final : public msar::cpu::Parallel
{
public:
    explicit OrtParallel(Ort::KernelContext const& ctx) : mCtx(ctx) {}
    void run(std::size_t total, std::size_t batch, void (*fn)(void*, std::size_t), void* data) const override
    {
        if (total == 1 || batch == 1)
        {
            // no pool round trip for one item, or for work the caller says is too small to share
            for (std::size_t i = 0; i < total; ++i)
            {
                fn(data, i);
            }
            return;
        }
        mCtx.ParallelFor(fn, total, batch, data);
    }

private:
    Ort::KernelContext const& mCtx;
};

std::string shapeText(Shape const& s)
{
    std::ostringstream out;
    out << "[";
    for (std::size_t i = 0; i < s.size(); ++i)
    {
        out << (i ? ", " : "") << s[i];
    }
    out << "]";
    return out.str();
}

//! `what` builds the message only on failure: a decode step checks every source, and building the
//! strings cost more than the kernel there.
template <typename Message>
void expect(bool ok, char const* op, Message const& what)
{
    if (!ok)
    {
        throw std::invalid_argument(std::string("msar::") + op + ": " + std::string(what()));
    }
}

struct Input
{
    void const* data;
    Shape shape;
    ONNXTensorElementDataType type;
};

Input input(Ort::KernelContext const& ctx, std::size_t i)
{
    Ort::ConstValue v = ctx.GetInput(i);
    auto info = v.GetTensorTypeAndShapeInfo();
    return {v.GetTensorRawData(), info.GetShape(), info.GetElementType()};
}

float floatAttr(OrtApi const& api, OrtKernelInfo const* info, char const* name, float fallback)
{
    float v = fallback;
    if (OrtStatus* s = api.KernelInfoGetAttribute_float(info, name, &v))
    {
        api.ReleaseStatus(s);
        return fallback;
    }
    return v;
}

//! The scalar gate's parameters (FusedMixer, StreamGate) for m streams of width d.
void expectGate(char const* op, Input const& gw, Input const& gb, Input const& gs, int64_t m, int64_t d)
{
    expect(gw.shape == Shape{m, m * d}, op,
           [&] { return "gate_weight must be " + shapeText({m, m * d}) + ", got " + shapeText(gw.shape); });
    expect(gb.shape == Shape{m}, op, [&] { return "gate_bias must be " + shapeText({m}) + ", got " + shapeText(gb.shape); });
    expect(gs.shape.empty() || gs.shape == Shape{1}, op,
           [&] { return "gate_scale must be a scalar, got " + shapeText(gs.shape); });
}

//! The padding mask (SourceViews, ConvState): [B, T], one entry per source token.
void expectMask(char const* op, Input const& mask, int64_t B, int64_t T)
{
    expect(mask.shape == Shape{B, T}, op,
           [&] { return "mask must be [B, T] = " + shapeText({B, T}) + ", got " + shapeText(mask.shape); });
}

//! The node's stream_kernels attribute (FusedMixer, ScoredMixer, SourceViews, SourceScores).
std::vector<int32_t> streamKernels(OrtKernelInfo const* info)
{
    std::vector<int32_t> kernels;
    for (int64_t k : Ort::ConstKernelInfo(info).GetAttributes<int64_t>("stream_kernels"))
    {
        kernels.push_back(static_cast<int32_t>(k));
    }
    return kernels;
}

//! What FusedMixer and ScoredMixer check and take alike: conv_weight [N >= n, K, d], the n sources
//! from input `fixed` on (each of source 0's shape) into p.sources, and h allocated into p.h.
void takeSourcesAndOutput(Ort::KernelContext& ctx, char const* op, std::size_t fixed, Input const& cw, int64_t K,
                          msar::cpu::FusedMixerProblem& p)
{
    Input const x0 = input(ctx, fixed);
    int64_t const n = p.n, d = p.d;
    expect(cw.shape.size() == 3 && cw.shape[0] >= n && cw.shape[1] == K && cw.shape[2] == d, op, [&] { return
           "conv_weight must be [N >= " + std::to_string(n) + ", K = " + std::to_string(K) + ", d = "
               + std::to_string(d) + "], got " + shapeText(cw.shape); });
    for (int64_t i = 0; i < n; ++i)
    {
        Input x = input(ctx, fixed + i);
        expect(x.shape == x0.shape, op, [&] {
            return "source " + std::to_string(i) + " is " + shapeText(x.shape) + ", source 0 is " + shapeText(x0.shape);
        });
        p.sources.push_back(x.data);
    }
    p.h = ctx.GetOutput(0, x0.shape).GetTensorMutableRawData();
}

//! Every port in the registered storage type T but the contract's int64 ones (each kernel's
//! kInt64Inputs, from the generated header); a kernel with float32 ports (the scores) says which.
struct AllStorageTyped
{
    static bool float32Input(std::size_t) { return false; }
    static constexpr bool kFloat32Output = false;
};

//! One kernel per node; T is the element type this instance was registered for.
struct FusedMixerKernel : AllStorageTyped
{
    static constexpr char const* kName = msar::kFusedMixerName;
    static constexpr std::size_t kFixed = msar::kFusedMixerFixedInputs;
    static constexpr int kSince = msar::kFusedMixerSinceVersion;
    static constexpr uint32_t kInt64Inputs = msar::kFusedMixerInt64Inputs;
    static constexpr bool kVariadic = true;

    FusedMixerKernel(OrtApi const& api, OrtKernelInfo const* info, Storage storage) : mStorage(storage)
    {
        msar::FusedMixerAttrFields defaults;
        mEps = floatAttr(api, info, "eps", defaults.eps);
        mKernels = streamKernels(info);
    }

    void compute(Ort::KernelContext& ctx) const
    {
        char const* op = kName;
        std::size_t const count = ctx.GetInputCount();
        expect(count > kFixed, op, [&] { return "needs at least one source"; });
        Input q = input(ctx, 0), gw = input(ctx, 1), gb = input(ctx, 2), gs = input(ctx, 3), cw = input(ctx, 4);
        Input x0 = input(ctx, kFixed);
        expect(x0.shape.size() == 3, op, [&] { return "sources must be [B, T, d], got " + shapeText(x0.shape); });
        int64_t const B = x0.shape[0], T = x0.shape[1], d = x0.shape[2];
        auto const m = static_cast<int64_t>(mKernels.size());
        int64_t const K = msar::cpu::streamTaps(mKernels).K;
        int64_t const n = static_cast<int64_t>(count - kFixed);
        expect(q.shape == Shape{m, d}, op,
               [&] { return "query must be [m, d] = " + shapeText({m, d}) + ", got " + shapeText(q.shape); });
        expectGate(op, gw, gb, gs, m, d);
        msar::cpu::FusedMixerProblem p{mStorage, B, T, d, n, mKernels, mEps, q.data, gw.data, gb.data, gs.data, cw.data,
                                       {}, nullptr};
        takeSourcesAndOutput(ctx, op, kFixed, cw, K, p);
        if (B * T * d > 0)
        {
            msar::cpu::fusedMixer(p, OrtParallel(ctx));
        }
    }

    Storage mStorage;
    std::vector<int32_t> mKernels;
    float mEps;
};

struct DepthRetrievalKernel : AllStorageTyped
{
    static constexpr char const* kName = msar::kDepthRetrievalName;
    static constexpr std::size_t kFixed = msar::kDepthRetrievalFixedInputs;
    static constexpr int kSince = msar::kDepthRetrievalSinceVersion;
    static constexpr uint32_t kInt64Inputs = msar::kDepthRetrievalInt64Inputs;
    static constexpr bool kVariadic = true;

    DepthRetrievalKernel(OrtApi const& api, OrtKernelInfo const* info, Storage storage) : mStorage(storage)
    {
        mEps = floatAttr(api, info, "eps", msar::DepthRetrievalAttrFields{}.eps);
    }

    void compute(Ort::KernelContext& ctx) const
    {
        char const* op = kName;
        std::size_t const count = ctx.GetInputCount();
        expect(count > kFixed, op, [&] { return "needs at least one view"; });
        Input q = input(ctx, 0), v0 = input(ctx, kFixed);
        expect(v0.shape.size() == 4, op, [&] { return "views must be [B, T, m, d], got " + shapeText(v0.shape); });
        int64_t const B = v0.shape[0], T = v0.shape[1], m = v0.shape[2], d = v0.shape[3];
        expect(q.shape == Shape{m, d}, op,
               [&] { return "query must be " + shapeText({m, d}) + ", got " + shapeText(q.shape); });
        msar::cpu::DepthRetrievalProblem p{mStorage, B, T, m, d, static_cast<int64_t>(count - kFixed), mEps, q.data, {}, nullptr};
        for (std::size_t i = kFixed; i < count; ++i)
        {
            Input v = input(ctx, i);
            expect(v.shape == v0.shape, op, [&] {
                return "view " + std::to_string(i - kFixed) + " is " + shapeText(v.shape) + ", view 0 is " + shapeText(v0.shape);
            });
            p.views.push_back(v.data);
        }
        p.z = ctx.GetOutput(0, v0.shape).GetTensorMutableRawData();
        if (B * T * m * d > 0)
        {
            msar::cpu::depthRetrieval(p, OrtParallel(ctx));
        }
    }

    Storage mStorage;
    float mEps;
};

struct SourceViewsKernel : AllStorageTyped
{
    static constexpr char const* kName = msar::kSourceViewsName;
    static constexpr std::size_t kFixed = msar::kSourceViewsFixedInputs;
    static constexpr int kSince = msar::kSourceViewsSinceVersion;
    static constexpr uint32_t kInt64Inputs = msar::kSourceViewsInt64Inputs;  // index, mask
    static constexpr bool kVariadic = false;

    SourceViewsKernel(OrtApi const&, OrtKernelInfo const* info, Storage storage) : mStorage(storage)
    {
        mKernels = streamKernels(info);
    }

    void compute(Ort::KernelContext& ctx) const
    {
        char const* op = kName;
        Input cw = input(ctx, 0), state = input(ctx, 1), index = input(ctx, 2), x = input(ctx, 3), mask = input(ctx, 4);
        msar::cpu::StreamTaps const st = msar::cpu::streamTaps(mKernels);
        int64_t const K = st.K, kmax = st.kmax;
        expect(x.shape.size() == 3, op, [&] { return "source must be [B, T, d], got " + shapeText(x.shape); });
        int64_t const B = x.shape[0], T = x.shape[1], d = x.shape[2];
        expect(state.shape.size() == 4 && state.shape[1] == B && state.shape[2] == kmax - 1 && state.shape[3] == d, op,
               [&] {
                   return "state must be [S, B, kmax-1 = " + std::to_string(kmax - 1) + ", d] with B, d = "
                          + std::to_string(B) + ", " + std::to_string(d) + ", got " + shapeText(state.shape);
               });
        expect(index.shape.empty() || index.shape == Shape{1}, op,
               [&] { return "index must be a scalar, got " + shapeText(index.shape); });
        int64_t const row = *static_cast<int64_t const*>(index.data);
        expect(row >= 0 && row < state.shape[0], op, [&] {
            return "index " + std::to_string(row) + " is outside the state's " + std::to_string(state.shape[0]) + " rows";
        });
        std::size_t const elem = mStorage == Storage::kFloat32 ? 4 : 2;
        void const* hist = static_cast<unsigned char const*>(state.data) + row * B * (kmax - 1) * d * elem;
        expect(cw.shape == Shape{K, d}, op,
               [&] { return "conv_weight must be [K, d] = " + shapeText({K, d}) + ", got " + shapeText(cw.shape); });
        expectMask(op, mask, B, T);
        auto const m = static_cast<int64_t>(mKernels.size());
        msar::cpu::SourceViewsProblem p{mStorage, B, T, d, mKernels, cw.data, hist, x.data,
                                        static_cast<int64_t const*>(mask.data), nullptr};
        p.views = ctx.GetOutput(0, Shape{B, T, m, d}).GetTensorMutableRawData();
        if (B * T * d > 0)
        {
            msar::cpu::sourceViews(p, OrtParallel(ctx));
        }
    }

    Storage mStorage;
    std::vector<int32_t> mKernels;
};

//! The decode graph's next convolution state, from the past state and every source, padding zeroed.
struct ConvStateKernel : AllStorageTyped
{
    static constexpr char const* kName = msar::kConvStateName;
    static constexpr std::size_t kFixed = msar::kConvStateFixedInputs;
    static constexpr int kSince = msar::kConvStateSinceVersion;
    static constexpr uint32_t kInt64Inputs = msar::kConvStateInt64Inputs;  // mask
    static constexpr bool kVariadic = true;

    ConvStateKernel(OrtApi const&, OrtKernelInfo const*, Storage storage) : mStorage(storage) {}

    void compute(Ort::KernelContext& ctx) const
    {
        char const* op = kName;
        std::size_t const count = ctx.GetInputCount();
        expect(count > kFixed, op, [&] { return "needs at least one source"; });
        Input past = input(ctx, 0), mask = input(ctx, 1), x0 = input(ctx, kFixed);
        auto const N = static_cast<int64_t>(count - kFixed);
        expect(x0.shape.size() == 3, op, [&] { return "sources must be [B, T, d], got " + shapeText(x0.shape); });
        int64_t const B = x0.shape[0], T = x0.shape[1], d = x0.shape[2];
        expect(past.shape.size() == 4 && past.shape[0] == N && past.shape[1] == B && past.shape[3] == d, op, [&] {
            return "past must be [N = " + std::to_string(N) + ", B = " + std::to_string(B) + ", kmax-1, d = "
                   + std::to_string(d) + "], got " + shapeText(past.shape);
        });
        expectMask(op, mask, B, T);
        msar::cpu::ConvStateProblem p{mStorage, N, B, past.shape[2], T, d, past.data,
                                      static_cast<int64_t const*>(mask.data), {}, nullptr};
        for (int64_t i = 0; i < N; ++i)
        {
            Input x = input(ctx, kFixed + i);
            expect(x.shape == x0.shape, op, [&] {
                return "source " + std::to_string(i) + " is " + shapeText(x.shape) + ", source 0 is " + shapeText(x0.shape);
            });
            p.sources.push_back(x.data);
        }
        p.present = ctx.GetOutput(0, past.shape).GetTensorMutableRawData();
        msar::cpu::convState(p, OrtParallel(ctx));
    }

    Storage mStorage;
};

struct StreamGateKernel : AllStorageTyped
{
    static constexpr char const* kName = msar::kStreamGateName;
    static constexpr std::size_t kFixed = msar::kStreamGateFixedInputs;
    static constexpr int kSince = msar::kStreamGateSinceVersion;
    static constexpr uint32_t kInt64Inputs = msar::kStreamGateInt64Inputs;
    static constexpr bool kVariadic = false;

    StreamGateKernel(OrtApi const&, OrtKernelInfo const*, Storage storage) : mStorage(storage) {}

    void compute(Ort::KernelContext& ctx) const
    {
        char const* op = kName;
        Input gw = input(ctx, 0), gb = input(ctx, 1), gs = input(ctx, 2), z = input(ctx, 3);
        expect(z.shape.size() == 4, op, [&] { return "z must be [B, T, m, d], got " + shapeText(z.shape); });
        int64_t const B = z.shape[0], T = z.shape[1], m = z.shape[2], d = z.shape[3];
        expectGate(op, gw, gb, gs, m, d);
        msar::cpu::StreamGateProblem p{mStorage, B, T, m, d, gw.data, gb.data, gs.data, z.data, nullptr};
        p.h = ctx.GetOutput(0, Shape{B, T, d}).GetTensorMutableRawData();
        if (B * T * d > 0)
        {
            msar::cpu::streamGate(p, OrtParallel(ctx));
        }
    }

    Storage mStorage;
};

//! Mixer l over its sources and their given scores: FusedMixer without the scoring pass.
struct ScoredMixerKernel : AllStorageTyped
{
    static constexpr char const* kName = msar::kScoredMixerName;
    static constexpr std::size_t kFixed = msar::kScoredMixerFixedInputs;
    static constexpr int kSince = msar::kScoredMixerSinceVersion;
    static constexpr uint32_t kInt64Inputs = msar::kScoredMixerInt64Inputs;
    static constexpr bool kVariadic = true;
    static constexpr std::size_t kScores = kFixed - 1;  // the one float32 input
    static bool float32Input(std::size_t i) { return i == kScores; }

    ScoredMixerKernel(OrtApi const&, OrtKernelInfo const* info, Storage storage) : mStorage(storage)
    {
        mKernels = streamKernels(info);
    }

    void compute(Ort::KernelContext& ctx) const
    {
        char const* op = kName;
        std::size_t const count = ctx.GetInputCount();
        expect(count > kFixed, op, [&] { return "needs at least one source"; });
        Input gw = input(ctx, 0), gb = input(ctx, 1), gs = input(ctx, 2), cw = input(ctx, 3), sc = input(ctx, kScores);
        Input x0 = input(ctx, kFixed);
        expect(x0.shape.size() == 3, op, [&] { return "sources must be [B, T, d], got " + shapeText(x0.shape); });
        int64_t const B = x0.shape[0], T = x0.shape[1], d = x0.shape[2];
        auto const m = static_cast<int64_t>(mKernels.size());
        int64_t const K = msar::cpu::streamTaps(mKernels).K;
        int64_t const n = static_cast<int64_t>(count - kFixed);
        expectGate(op, gw, gb, gs, m, d);
        expect(sc.shape == Shape{n, B, T, m}, op,
               [&] { return "scores must be [n, B, T, m] = " + shapeText({n, B, T, m}) + ", got " + shapeText(sc.shape); });
        msar::cpu::FusedMixerProblem p{mStorage, B, T, d, n, mKernels, 0.F, nullptr, gw.data, gb.data, gs.data, cw.data,
                                       {}, nullptr, static_cast<float const*>(sc.data)};
        takeSourcesAndOutput(ctx, op, kFixed, cw, K, p);
        if (B * T * d > 0)
        {
            msar::cpu::scoredMixer(p, OrtParallel(ctx));
        }
    }

    Storage mStorage;
    std::vector<int32_t> mKernels;
};

//! One source's scores against the queries of every later mixer, float32 out.
struct SourceScoresKernel : AllStorageTyped
{
    static constexpr char const* kName = msar::kSourceScoresName;
    static constexpr std::size_t kFixed = msar::kSourceScoresFixedInputs;
    static constexpr int kSince = msar::kSourceScoresSinceVersion;
    static constexpr uint32_t kInt64Inputs = msar::kSourceScoresInt64Inputs;
    static constexpr bool kVariadic = false;
    static constexpr bool kFloat32Output = true;

    SourceScoresKernel(OrtApi const& api, OrtKernelInfo const* info, Storage storage) : mStorage(storage)
    {
        mEps = floatAttr(api, info, "eps", msar::FusedMixerAttrFields{}.eps);
        mKernels = streamKernels(info);
    }

    void compute(Ort::KernelContext& ctx) const
    {
        char const* op = kName;
        Input cw = input(ctx, 0), q = input(ctx, 1), x = input(ctx, 2);
        auto const m = static_cast<int64_t>(mKernels.size());
        int64_t const K = msar::cpu::streamTaps(mKernels).K;
        expect(x.shape.size() == 3, op, [&] { return "source must be [B, T, d], got " + shapeText(x.shape); });
        int64_t const B = x.shape[0], T = x.shape[1], d = x.shape[2];
        expect(cw.shape == Shape{K, d}, op,
               [&] { return "conv_weight must be [K, d] = " + shapeText({K, d}) + ", got " + shapeText(cw.shape); });
        expect(q.shape.size() == 3 && q.shape[1] == m && q.shape[2] == d, op,
               [&] { return "queries must be [P, m, d] with m = " + std::to_string(m) + ", d = " + std::to_string(d)
                            + ", got " + shapeText(q.shape); });
        int64_t const P = q.shape[0];
        msar::cpu::SourceScoresProblem p{mStorage, B, T, d, P, mKernels, mEps, cw.data, q.data, x.data, nullptr};
        p.scores = ctx.GetOutput(0, Shape{P, B, T, m}).GetTensorMutableData<float>();
        if (P * B * T * d > 0)
        {
            msar::cpu::sourceScores(p, OrtParallel(ctx));
        }
    }

    Storage mStorage;
    std::vector<int32_t> mKernels;
    float mEps;
};

template <typename Kernel>
struct Wrapped
{
    Kernel kernel;
    OrtApi const& api;

    OrtStatusPtr ComputeV2(OrtKernelContext* context)
    {
        try
        {
            Ort::KernelContext ctx(context);
            kernel.compute(ctx);
            return nullptr;
        }
        catch (std::exception const& e)
        {
            return api.CreateStatus(ORT_INVALID_ARGUMENT, e.what());
        }
    }
};

//! One registration per (op, element type); ONNX Runtime merges same-name ops into one
//! schema whose type constraint is the union.
template <typename Kernel>
struct Op : Ort::CustomOpBase<Op<Kernel>, Wrapped<Kernel>, true>
{
    explicit Op(ONNXTensorElementDataType type) : mType(type)
    {
        // A file of an older domain version finds no kernel for a changed op and runs its function body.
        this->start_ver_ = Kernel::kSince;
    }

    OrtStatusPtr CreateKernelV2(OrtApi const& api, OrtKernelInfo const* info, void** out) const
    {
        try
        {
            Storage s = mType == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16    ? Storage::kFloat16
                        : mType == ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16 ? Storage::kBFloat16
                                                                         : Storage::kFloat32;
            *out = new Wrapped<Kernel>{Kernel(api, info, s), api};
            return nullptr;
        }
        catch (std::exception const& e)
        {
            return api.CreateStatus(ORT_INVALID_ARGUMENT, (std::string("msar::") + Kernel::kName + ": " + e.what()).c_str());
        }
    }

    char const* GetName() const { return Kernel::kName; }
    std::size_t GetInputTypeCount() const { return Kernel::kFixed + (Kernel::kVariadic ? 1 : 0); }
    ONNXTensorElementDataType GetInputType(std::size_t i) const
    {
        return Kernel::float32Input(i) ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT
               : i < 32 && (Kernel::kInt64Inputs >> i) & 1U ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64
                                       : mType;
    }
    OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(std::size_t i) const
    {
        return Kernel::kVariadic && i == Kernel::kFixed ? INPUT_OUTPUT_VARIADIC : INPUT_OUTPUT_REQUIRED;
    }
    std::size_t GetOutputTypeCount() const { return 1; }
    ONNXTensorElementDataType GetOutputType(std::size_t) const
    {
        return Kernel::kFloat32Output ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT : mType;
    }

    ONNXTensorElementDataType mType;
};

//! One registration per storage type (float32, float16, bfloat16).
template <typename Kernel>
struct Typed
{
    Op<Kernel> ops[3]{Op<Kernel>{ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT}, Op<Kernel>{ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16},
                      Op<Kernel>{ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16}};

    void addTo(Ort::CustomOpDomain& domain) const
    {
        for (auto const& op : ops)
        {
            domain.Add(&op);
        }
    }
};

// The ops and their domain must outlive every session that registered them.  bfloat16 too: the
// registered schema replaces the function's, so a type left out would make bfloat16 files invalid.
Typed<FusedMixerKernel> const gFusedMixer;
Typed<DepthRetrievalKernel> const gRetrieval;
Typed<SourceViewsKernel> const gViews;
Typed<StreamGateKernel> const gGates;
Typed<ScoredMixerKernel> const gScoredMixer;
Typed<SourceScoresKernel> const gScores;
Typed<ConvStateKernel> const gConvState;
std::mutex gDomainsLock;
std::vector<Ort::CustomOpDomain> gDomains;

} // namespace

extern "C" __attribute__((visibility("default"))) OrtStatus* ORT_API_CALL RegisterCustomOps(
    OrtSessionOptions* options, OrtApiBase const* base)
{
    OrtApi const* api = base->GetApi(ORT_API_VERSION);
    if (api == nullptr)
    {
        return nullptr;  // an ONNX Runtime older than these headers: nothing can be reported through it
    }
    Ort::InitApi(api);
    try
    {
        Ort::CustomOpDomain domain{kDomain};
        gFusedMixer.addTo(domain);
        gRetrieval.addTo(domain);
        gViews.addTo(domain);
        gGates.addTo(domain);
        gScoredMixer.addTo(domain);
        gScores.addTo(domain);
        gConvState.addTo(domain);
        Ort::UnownedSessionOptions(options).Add(domain);
        std::lock_guard<std::mutex> lock(gDomainsLock);
        gDomains.push_back(std::move(domain));
        return nullptr;
    }
    catch (std::exception const& e)
    {
        return api->CreateStatus(ORT_FAIL, e.what());
    }
}

/*
 * Host-only test of the TensorRT glue (needs the TensorRT headers, not the
 * TensorRT libraries and not a GPU): drives both plugins through their
 * IPluginV3 interfaces the way TensorRT does - creator fields as the ONNX
 * parser passes them, capability interfaces, build-phase queries with fake
 * dimension expressions, serialisation round trip, onShapeChange, and
 * enqueue - with the kernels built by cudaHostEmulation.h, so enqueue runs on
 * the CPU. Each enqueue is compared with a direct call of the kernel C ABI
 * whose arguments are filled by name, which checks the glue's plumbing.
 *
 * The glueTest target of plugins/CMakeLists.txt (CTest), configured when the
 * TensorRT headers are found; run by tests/test_plugins.py when
 * TENSORRT_INCLUDE_DIR is set.
 */
#include "NvInferRuntime.h"

#include "../msarDepthRetrievalPlugin/depthRetrievalRules.h"
#include "../msarDepthRetrievalPlugin/depthRetrievalKernel.h"
#include "../msarFusedMixerPlugin/fusedMixerKernel.h"
#include "../msarFusedMixerPlugin/fusedMixerPlugin.h"
#include "trtFakes.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <cuda_fp16.h>

using namespace nvinfer1;
using namespace msar_test;

namespace
{
void testCreators()
{
    int32_t n = 0;
    auto const* list = getCreators(n);
    CHECK(n == 2 && list != nullptr);
    for (int32_t i = 0; i < n; ++i)
    {
        CHECK(std::string(list[i]->getInterfaceInfo().kind) == "PLUGIN CREATOR_V3ONE");
        auto* c = static_cast<IPluginCreatorV3One*>(list[i]);
        CHECK(std::string(c->getPluginVersion()) == "1");
        CHECK(std::string(c->getPluginNamespace()).empty());
    }
    auto* fm = creatorNamed("FusedMixer");
    auto* dr = creatorNamed("DepthRetrieval");
    CHECK(fm != nullptr && dr != nullptr);
    CHECK(fieldNamesOf(fm->getFieldNames())
        == std::vector<std::string>({"stream_kernels", "eps", "plugin_version", "plugin_namespace"}));
    CHECK(fm->getFieldNames()->fields[0].type == PluginFieldType::kINT32);
    CHECK(fm->getFieldNames()->fields[1].type == PluginFieldType::kFLOAT32);
    CHECK(fieldNamesOf(dr->getFieldNames()) == std::vector<std::string>({"eps", "plugin_version", "plugin_namespace"}));
}

//! Fields as onnx-tensorrt's loadFields passes them for a FusedMixer node.
std::unique_ptr<IPluginV3> createFusedMixer(std::vector<int32_t> const& ks, float eps, char const* extraName = nullptr)
{
    std::vector<PluginField> f;
    f.emplace_back("stream_kernels", ks.data(), PluginFieldType::kINT32, static_cast<int32_t>(ks.size()));
    f.emplace_back("eps", &eps, PluginFieldType::kFLOAT32, 1);
    f.emplace_back("plugin_version", "1", PluginFieldType::kCHAR, 1);
    f.emplace_back("plugin_namespace", "", PluginFieldType::kCHAR, 0);
    if (extraName != nullptr)
    {
        f.emplace_back(extraName, &eps, PluginFieldType::kFLOAT32, 1);
    }
    PluginFieldCollection fc{static_cast<int32_t>(f.size()), f.data()};
    return std::unique_ptr<IPluginV3>(creatorNamed("FusedMixer")->createPlugin("node", &fc, TensorRTPhase::kBUILD));
}

void testFusedMixer(DataType type, int32_t dtypeCode)
{
    std::vector<int32_t> const ks = {1, 3, 5};
    float const eps = 1e-6F;
    int64_t const n = 3, B = 2, T = 7, d = 40, m = 3, K = 8, N = 5;

    CHECK(createFusedMixer(ks, eps, "alpha") == nullptr);      // unknown attribute: refused
    CHECK(createFusedMixer({2, 3}, eps) == nullptr);           // stream_kernels[0] != 1
    auto plugin = createFusedMixer(ks, eps);
    CHECK(plugin != nullptr);
    auto* core = capability<IPluginV3OneCore>(plugin.get(), PluginCapabilityType::kCORE);
    auto* build = capability<IPluginV3OneBuild>(plugin.get(), PluginCapabilityType::kBUILD);
    auto* rt = capability<IPluginV3OneRuntime>(plugin.get(), PluginCapabilityType::kRUNTIME);
    CHECK(core != nullptr && build != nullptr && rt != nullptr);
    CHECK(std::string(core->getPluginName()) == "FusedMixer" && std::string(core->getPluginVersion()) == "1");
    CHECK(build->getNbOutputs() == 1);

    // Build phase.
    std::vector<std::vector<int64_t>> const staticShapes
        = {{m, d}, {m, m * d}, {m}, {}, {N, K, d}, {B, T, d}, {B, T, d}, {B, T, d}};
    std::vector<std::vector<int64_t>> dynShapes = staticShapes;
    for (int32_t i = 5; i < 8; ++i)
    {
        dynShapes[i] = {-1, -1, d};
    }
    int32_t const nbIn = 8;
    std::vector<DataType> types(nbIn, type);
    DataType outType{};
    CHECK(build->getOutputDataTypes(&outType, 1, types.data(), nbIn) == 0 && outType == type);
    types[6] = type == DataType::kFLOAT ? DataType::kHALF : DataType::kFLOAT;
    CHECK(build->getOutputDataTypes(&outType, 1, types.data(), nbIn) != 0); // mixed types refused
    types[6] = type;

    ExprShapes exprs(dynShapes);
    DimsExprs outExpr{};
    FakeExprBuilder builder;
    CHECK(build->getOutputShapes(exprs.shapes.data(), nbIn, nullptr, 0, &outExpr, 1, builder) == 0);
    CHECK(outExpr.nbDims == 3 && outExpr.d[2]->isConstant() && outExpr.d[2]->getConstantValue() == d);
    CHECK(!outExpr.d[0]->isConstant());
    auto badShapes = dynShapes;
    badShapes[4] = {N, K + 1, d};
    ExprShapes badExprs(badShapes);
    CHECK(build->getOutputShapes(badExprs.shapes.data(), nbIn, nullptr, 0, &outExpr, 1, builder) != 0);

    std::vector<DynamicPluginTensorDesc> io(nbIn + 1);
    for (int32_t i = 0; i <= nbIn; ++i)
    {
        auto const& s = i < nbIn ? dynShapes[i] : dynShapes[5];
        auto const& mx = i < nbIn ? staticShapes[i] : staticShapes[5];
        io[i].desc.dims = dimsOf(s);
        io[i].desc.type = type;
        io[i].desc.format = TensorFormat::kLINEAR;
        io[i].min = dimsOf(mx);
        io[i].opt = dimsOf(mx);
        io[i].max = dimsOf(mx);
    }
    for (int32_t pos = 0; pos <= nbIn; ++pos)
    {
        CHECK(build->supportsFormatCombination(pos, io.data(), nbIn, 1));
    }
    io[3].desc.type = DataType::kINT32;
    CHECK(build->supportsFormatCombination(0, io.data(), nbIn, 1)); // position 0 alone is fine
    CHECK(!build->supportsFormatCombination(3, io.data(), nbIn, 1));
    io[3].desc.type = type;
    io[0].desc.type = DataType::kINT8;
    CHECK(!build->supportsFormatCombination(0, io.data(), nbIn, 1));
    io[0].desc.type = type;
    io[2].desc.format = TensorFormat::kCHW32;
    CHECK(!build->supportsFormatCombination(2, io.data(), nbIn, 1));
    io[2].desc.format = TensorFormat::kLINEAR;
    CHECK(build->configurePlugin(io.data(), nbIn, &io[nbIn], 1) == 0);
    size_t const ws = build->getWorkspaceSize(io.data(), nbIn, &io[nbIn], 1);
    CHECK(ws == msarFusedMixerWorkspaceSize(static_cast<int32_t>(n), d, ks.data(), static_cast<int32_t>(m)));

    // Serialisation round trip, as a deserialised engine would re-create the plugin.
    PluginFieldCollection const* ser = rt->getFieldsToSerialize();
    CHECK(ser != nullptr);
    CHECK(fieldNamesOf(ser) == fieldNamesOf(creatorNamed("FusedMixer")->getFieldNames()));
    std::unique_ptr<IPluginV3> again(creatorNamed("FusedMixer")->createPlugin("node", ser, TensorRTPhase::kRUNTIME));
    CHECK(again != nullptr);
    auto* rt2 = capability<IPluginV3OneRuntime>(again.get(), PluginCapabilityType::kRUNTIME);
    PluginFieldCollection const* ser2 = rt2->getFieldsToSerialize();
    CHECK(ser2->nbFields == ser->nbFields);
    for (int32_t i = 0; i < ser->nbFields; ++i)
    {
        CHECK(ser->fields[i].type == ser2->fields[i].type && ser->fields[i].length == ser2->fields[i].length);
        size_t const bytes = ser->fields[i].type == PluginFieldType::kCHAR ? 1 : 4;
        CHECK(std::memcmp(ser->fields[i].data, ser2->fields[i].data, bytes * ser->fields[i].length) == 0);
    }

    // Runtime: attach a clone, set shapes, enqueue on the emulated kernel.
    std::unique_ptr<IPluginV3> ctx(rt2->attachToContext(nullptr));
    auto* run = capability<IPluginV3OneRuntime>(ctx.get(), PluginCapabilityType::kRUNTIME);
    std::vector<PluginTensorDesc> desc(nbIn + 1);
    for (int32_t i = 0; i <= nbIn; ++i)
    {
        desc[i] = io[i].desc;
        desc[i].dims = dimsOf(i < nbIn ? staticShapes[i] : staticShapes[5]);
    }
    CHECK(run->onShapeChange(desc.data(), nbIn, &desc[nbIn], 1) == 0);

    // Inputs in float, converted to the element type.
    size_t const elt = type == DataType::kFLOAT ? 4 : 2;
    std::vector<std::vector<unsigned char>> buffers(nbIn + 1);
    std::vector<void const*> inPtrs(nbIn);
    float const scales[] = {0.3F, 0.15F, 0.5F, 1.5F, 0.5F, 1.0F, 1.0F, 1.0F};
    for (int32_t i = 0; i <= nbIn; ++i)
    {
        int64_t const count = volume(i < nbIn ? staticShapes[i] : staticShapes[5]);
        buffers[i].assign(static_cast<size_t>(count) * elt, 0);
        if (i < nbIn)
        {
            auto const vals = randomFloats(count, 17u + static_cast<uint32_t>(i), scales[i]);
            for (int64_t k = 0; k < count; ++k)
            {
                if (elt == 4)
                {
                    std::memcpy(buffers[i].data() + 4 * k, &vals[k], 4);
                }
                else
                {
                    __half const h = __float2half_rn(vals[k]);
                    std::memcpy(buffers[i].data() + 2 * k, &h, 2);
                }
            }
            inPtrs[i] = buffers[i].data();
        }
    }
    std::vector<unsigned char> workspace(ws);
    void* outPtr = buffers[nbIn].data();
    CHECK(run->enqueue(desc.data(), &desc[nbIn], inPtrs.data(), &outPtr, workspace.data(), nullptr) == 0);

    // The same computation through the C ABI, every argument named.
    std::vector<unsigned char> expect(buffers[nbIn].size());
    MsarFusedMixerArgs a{};
    a.query = buffers[0].data();
    a.gate_weight = buffers[1].data();
    a.gate_bias = buffers[2].data();
    a.gate_scale = buffers[3].data();
    a.conv_weight = buffers[4].data();
    void const* sources[] = {buffers[5].data(), buffers[6].data(), buffers[7].data()};
    a.sources = sources;
    a.n_sources = 3;
    a.batch = B;
    a.seq = T;
    a.d = d;
    a.conv_rows = N;
    a.stream_kernels = ks.data();
    a.n_streams = static_cast<int32_t>(m);
    a.eps = eps;
    a.out = expect.data();
    a.workspace = workspace.data();
    a.workspace_size = ws;
    CHECK(msarFusedMixerForward(dtypeCode, &a, nullptr) == MSAR_STATUS_OK);
    CHECK(expect == buffers[nbIn]);
    bool finite = true;
    for (int64_t k = 0; k < B * T * d && elt == 4; ++k)
    {
        float v;
        std::memcpy(&v, expect.data() + 4 * k, 4);
        finite = finite && std::isfinite(v);
    }
    CHECK(finite);

    // With a resource context whose allocator counts: enqueue allocates nothing, the same bits every call.
    {
        CountingAllocator allocator;
        FakeResourceContext resources(&allocator);
        std::unique_ptr<IPluginV3> ctx2(rt2->attachToContext(&resources));
        auto* run2 = capability<IPluginV3OneRuntime>(ctx2.get(), PluginCapabilityType::kRUNTIME);
        CHECK(run2->onShapeChange(desc.data(), nbIn, &desc[nbIn], 1) == 0);
        for (int rep = 0; rep < 2; ++rep)
        {
            std::fill(buffers[nbIn].begin(), buffers[nbIn].end(), static_cast<unsigned char>(0));
            CHECK(run2->enqueue(desc.data(), &desc[nbIn], inPtrs.data(), &outPtr, workspace.data(), nullptr) == 0);
            CHECK(expect == buffers[nbIn]);
        }
        ctx2.reset();
        CHECK(allocator.allocations == 0 && allocator.frees == 0);
        // The counter sees a call when there is one (if enqueue allocated again, as before issue 23, it would).
        allocator.deallocate(allocator.allocate(16, 16, 0));
        CHECK(allocator.allocations == 1 && allocator.frees == 1);
    }

    // Shape errors at run time are refused, not run.
    auto badDesc = desc;
    badDesc[7].dims = dimsOf({B, T + 1, d});
    CHECK(run->onShapeChange(badDesc.data(), nbIn, &badDesc[nbIn], 1) != 0);
}

void testDepthRetrieval()
{
    float const eps = 1e-6F;
    std::vector<PluginField> f;
    f.emplace_back("eps", &eps, PluginFieldType::kFLOAT32, 1);
    f.emplace_back("plugin_version", "1", PluginFieldType::kCHAR, 1);
    f.emplace_back("plugin_namespace", "", PluginFieldType::kCHAR, 0);
    PluginFieldCollection fc{static_cast<int32_t>(f.size()), f.data()};
    std::unique_ptr<IPluginV3> plugin(creatorNamed("DepthRetrieval")->createPlugin("n", &fc, TensorRTPhase::kBUILD));
    CHECK(plugin != nullptr);
    auto* build = capability<IPluginV3OneBuild>(plugin.get(), PluginCapabilityType::kBUILD);
    auto* rt = capability<IPluginV3OneRuntime>(plugin.get(), PluginCapabilityType::kRUNTIME);

    int64_t const B = 2, T = 1, m = 4, d = 40;
    std::vector<std::vector<int64_t>> const shapes = {{m, d}, {B, T, m, d}, {B, T, m, d}};
    int32_t const nbIn = 3;
    ExprShapes exprs({{m, d}, {-1, -1, m, d}, {-1, -1, m, d}});
    DimsExprs outExpr{};
    FakeExprBuilder builder;
    CHECK(build->getOutputShapes(exprs.shapes.data(), nbIn, nullptr, 0, &outExpr, 1, builder) == 0);
    CHECK(outExpr.nbDims == 4 && outExpr.d[2]->getConstantValue() == m);
    ExprShapes bad({{m, d}, {-1, -1, m, d}, {-1, -1, m - 1, d}});
    CHECK(build->getOutputShapes(bad.shapes.data(), nbIn, nullptr, 0, &outExpr, 1, builder) != 0);

    std::vector<PluginTensorDesc> desc(nbIn + 1);
    std::vector<std::vector<float>> buffers(nbIn + 1);
    std::vector<void const*> inPtrs(nbIn);
    for (int32_t i = 0; i <= nbIn; ++i)
    {
        auto const& s = i < nbIn ? shapes[i] : shapes[1];
        desc[i].dims = dimsOf(s);
        desc[i].type = DataType::kFLOAT;
        desc[i].format = TensorFormat::kLINEAR;
        buffers[i] = randomFloats(volume(s), 5u + static_cast<uint32_t>(i), i == 0 ? 0.4F : 1.0F);
        if (i < nbIn)
        {
            inPtrs[i] = buffers[i].data();
        }
    }
    std::unique_ptr<IPluginV3> ctx(rt->attachToContext(nullptr));
    auto* run = capability<IPluginV3OneRuntime>(ctx.get(), PluginCapabilityType::kRUNTIME);
    CHECK(run->onShapeChange(desc.data(), nbIn, &desc[nbIn], 1) == 0);
    void* outPtr = buffers[nbIn].data();
    CHECK(run->enqueue(desc.data(), &desc[nbIn], inPtrs.data(), &outPtr, nullptr, nullptr) == 0);

    std::vector<float> expect(buffers[nbIn].size());
    void const* views[] = {buffers[1].data(), buffers[2].data()};
    MsarDepthRetrievalArgs a{};
    a.query = buffers[0].data();
    a.views = views;
    a.n_sources = 2;
    a.batch = B;
    a.seq = T;
    a.n_streams = m;
    a.d = d;
    a.eps = eps;
    a.out = expect.data();
    CHECK(msarDepthRetrievalForward(MSAR_DTYPE_FLOAT32, &a, nullptr) == MSAR_STATUS_OK);
    CHECK(expect == buffers[nbIn]);
    // The output is a convex combination of the two views, channel by channel.
    bool convex = true;
    for (size_t k = 0; k < expect.size(); ++k)
    {
        float const lo = std::fmin(buffers[1][k], buffers[2][k]) - 1e-5F;
        float const hi = std::fmax(buffers[1][k], buffers[2][k]) + 1e-5F;
        convex = convex && expect[k] >= lo && expect[k] <= hi;
    }
    CHECK(convex);
}
} // namespace

int main()
{
    testCreators();
    testFusedMixer(DataType::kFLOAT, MSAR_DTYPE_FLOAT32);
    testFusedMixer(DataType::kHALF, MSAR_DTYPE_FLOAT16);
    testDepthRetrieval();
    std::printf("glueTest: %d checks passed\n", gChecks);
    return 0;
}

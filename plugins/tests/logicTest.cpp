/*
 * Checks of the host rules (common/msarPluginLogic.h, the generated
 * common/msarOpContracts.h and each plugin folder's xRules.h; no TensorRT, no
 * CUDA runtime): the attribute codec and its serialisation round trip, shape
 * rules and the dtype table. The logicTest target of plugins/CMakeLists.txt
 * (CTest), run by tests/test_plugins.py.
 * Prints "logicTest: N checks passed" or the first failure (exit 1).
 */
#include "msarDepthRetrievalPlugin/depthRetrievalRules.h"
#include "msarFusedMixerPlugin/fusedMixerRules.h"

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>

using namespace msar;

namespace
{
int gChecks = 0;

void check(bool ok, char const* what, int line)
{
    ++gChecks;
    if (!ok)
    {
        std::printf("logicTest: FAILED line %d: %s\n", line, what);
        std::exit(1);
    }
}
#define CHECK(x) check((x), #x, __LINE__)

//! `f` must throw a PluginError whose message contains `needle`.
void expectError(std::function<void()> const& f, char const* needle, int line)
{
    ++gChecks;
    try
    {
        f();
    }
    catch (PluginError const& e)
    {
        if (std::string(e.what()).find(needle) == std::string::npos)
        {
            std::printf("logicTest: FAILED line %d: message '%s' lacks '%s'\n", line, e.what(), needle);
            std::exit(1);
        }
        return;
    }
    std::printf("logicTest: FAILED line %d: no error (expected '%s')\n", line, needle);
    std::exit(1);
}
#define EXPECT_ERROR(stmt, needle) expectError([&]() { stmt; }, needle, __LINE__)

Shape shape(std::initializer_list<int64_t> dims)
{
    Shape s;
    s.nbDims = static_cast<int32_t>(dims.size());
    int32_t i = 0;
    for (auto v : dims)
    {
        s.d[i++] = v;
    }
    return s;
}

//! FusedMixer inputs for n sources, m = len(ks), width d, batch B, sequence T.
std::vector<Shape> mixerShapes(std::vector<int32_t> const& ks, int32_t n, int64_t d, int64_t B, int64_t T, int64_t N)
{
    int64_t const m = static_cast<int64_t>(ks.size());
    int64_t K = 0;
    for (size_t r = 1; r < ks.size(); ++r)
    {
        K += ks[r];
    }
    std::vector<Shape> s = {shape({m, d}), shape({m, m * d}), shape({m}), shape({}), shape({N, K, d})};
    for (int32_t i = 0; i < n; ++i)
    {
        s.push_back(shape({B, T, d}));
    }
    return s;
}

FusedMixerAttrs roundTrip(FusedMixerAttrs const& a)
{
    auto const fields = fusedMixerFieldsToSerialize(a);
    return parseFusedMixerFields(fields.data(), static_cast<int32_t>(fields.size()));
}

void testFieldNames()
{
    // Creator field names == serialised field names == ONNX attribute names.
    FusedMixerAttrs a;
    a.stream_kernels = {1, 4, 8, 12};
    auto const ser = fusedMixerFieldsToSerialize(a);
    CHECK(ser.size() == sizeof(kFusedMixerFields) / sizeof(kFusedMixerFields[0]));
    for (size_t i = 0; i < ser.size(); ++i)
    {
        CHECK(std::string(ser[i].name) == kFusedMixerFields[i].name);
        CHECK(ser[i].kind == kFusedMixerFields[i].kind);
    }
    auto const dser = depthRetrievalFieldsToSerialize(DepthRetrievalAttrs{});
    CHECK(dser.size() == sizeof(kDepthRetrievalFields) / sizeof(kDepthRetrievalFields[0]));
    for (size_t i = 0; i < dser.size(); ++i)
    {
        CHECK(std::string(dser[i].name) == kDepthRetrievalFields[i].name);
        CHECK(dser[i].kind == kDepthRetrievalFields[i].kind);
    }
    CHECK(std::string(kFusedMixerName) == "FusedMixer");
    CHECK(std::string(kDepthRetrievalName) == "DepthRetrieval");
    CHECK(std::string(kPluginVersion) == "1");
    CHECK(std::string(kPluginNamespace).empty());
}

void testAttributes()
{
    FusedMixerAttrs a;
    a.stream_kernels = {1, 4, 8, 12};
    a.eps = 1e-5F;
    CHECK(roundTrip(a) == a);
    CHECK(a.nStreams() == 4 && a.taps() == 24 && a.kmax() == 12);
    FusedMixerAttrs one;
    one.stream_kernels = {1};
    CHECK(roundTrip(one) == one && one.taps() == 0 && one.kmax() == 1);

    DepthRetrievalAttrs d;
    d.eps = 3e-6F;
    auto const dfields = depthRetrievalFieldsToSerialize(d);
    CHECK(parseDepthRetrievalFields(dfields.data(), static_cast<int32_t>(dfields.size())) == d);

    // What the ONNX parser hands over: INTS -> INT32 array, FLOAT, STRING (no terminator, may be empty).
    int32_t const ks[] = {1, 3, 5};
    float const eps = 1e-6F;
    FieldView const parsed[] = {
        {"stream_kernels", FieldKind::kINT32, ks, 3},
        {"eps", FieldKind::kFLOAT32, &eps, 1},
        {"plugin_version", FieldKind::kCHAR, "1", 1},
        {"plugin_namespace", FieldKind::kCHAR, "", 0},
    };
    FusedMixerAttrs const p = parseFusedMixerFields(parsed, 4);
    CHECK(p.stream_kernels == std::vector<int32_t>({1, 3, 5}) && p.eps == eps);
    // eps is optional (default 1e-6), stream_kernels is not.
    CHECK(parseFusedMixerFields(parsed, 1).eps == FusedMixerAttrFields{}.eps);
    EXPECT_ERROR(parseFusedMixerFields(parsed + 1, 1), "stream_kernels is required");

    FieldView const unknown[] = {{"stream_kernels", FieldKind::kINT32, ks, 3}, {"alpha", FieldKind::kFLOAT32, &eps, 1}};
    // The list of known names is the generated field table's (so a new attribute needs no edit here).
    EXPECT_ERROR(parseFusedMixerFields(unknown, 2), "FusedMixer: unknown attribute 'alpha' (known: stream_kernels, eps, ");
    FieldView const wrongType[] = {{"stream_kernels", FieldKind::kFLOAT32, &eps, 1}};
    EXPECT_ERROR(parseFusedMixerFields(wrongType, 1), "must be INT32");
    int32_t const badFirst[] = {2, 3};
    FieldView const bf[] = {{"stream_kernels", FieldKind::kINT32, badFirst, 2}};
    EXPECT_ERROR(parseFusedMixerFields(bf, 1), "stream_kernels[0] must be 1");
    int32_t const tooBig[] = {1, kMaxKernel + 1};
    FieldView const tb[] = {{"stream_kernels", FieldKind::kINT32, tooBig, 2}};
    EXPECT_ERROR(parseFusedMixerFields(tb, 1), "outside 1..");
    int32_t const manyStreams[kMaxStreams + 1] = {1, 2, 2, 2, 2, 2, 2, 2, 2};
    FieldView const ms[] = {{"stream_kernels", FieldKind::kINT32, manyStreams, kMaxStreams + 1}};
    EXPECT_ERROR(parseFusedMixerFields(ms, 1), "at most");
    float const badEps = -1.F;
    FieldView const be[] = {{"stream_kernels", FieldKind::kINT32, ks, 3}, {"eps", FieldKind::kFLOAT32, &badEps, 1}};
    EXPECT_ERROR(parseFusedMixerFields(be, 2), "eps must be a finite positive float");
    FieldView const version2[] = {{"stream_kernels", FieldKind::kINT32, ks, 3}, {"plugin_version", FieldKind::kCHAR, "2", 1}};
    EXPECT_ERROR(parseFusedMixerFields(version2, 2), "plugin_version '2'");
    FieldView const ns[] = {{"eps", FieldKind::kFLOAT32, &eps, 1}, {"plugin_namespace", FieldKind::kCHAR, "x", 1}};
    EXPECT_ERROR(parseDepthRetrievalFields(ns, 2), "plugin_namespace 'x'");
    FieldView const dUnknown[] = {{"stream_kernels", FieldKind::kINT32, ks, 3}};
    EXPECT_ERROR(parseDepthRetrievalFields(dUnknown, 1),
        "DepthRetrieval: unknown attribute 'stream_kernels' (known: eps, plugin_version, plugin_namespace)");
    // A serialised C string may carry its terminator.
    FieldView const terminated[] = {{"stream_kernels", FieldKind::kINT32, ks, 3}, {"plugin_version", FieldKind::kCHAR, "1", 2}};
    CHECK(parseFusedMixerFields(terminated, 2).stream_kernels.size() == 3);
}

void testFusedMixerShapes()
{
    FusedMixerAttrs a;
    a.stream_kernels = {1, 4, 8, 12};
    auto s = mixerShapes(a.stream_kernels, 3, 64, 2, 17, 5);
    FusedMixerDims const r = checkFusedMixerShapes(a, s.data(), 8, 1, true);
    CHECK(r.n == 3 && r.m == 4 && r.taps == 24 && r.rows == 5 && r.batch == 2 && r.seq == 17 && r.d == 64);

    // Build time: batch and sequence unknown.
    auto dyn = mixerShapes(a.stream_kernels, 2, 64, -1, -1, 5);
    FusedMixerDims const rd = checkFusedMixerShapes(a, dyn.data(), 7, 1, false);
    CHECK(rd.batch == -1 && rd.seq == -1 && rd.d == 64);
    EXPECT_ERROR(checkFusedMixerShapes(a, dyn.data(), 7, 1, true), "unresolved dimension");

    // A one-element gate_scale is accepted.
    auto s1 = s;
    s1[3] = shape({1});
    CHECK(checkFusedMixerShapes(a, s1.data(), 8, 1, true).n == 3);

    auto bad = s;
    bad[0] = shape({3, 64});
    EXPECT_ERROR(checkFusedMixerShapes(a, bad.data(), 8, 1, true), "'query'");
    bad = s;
    bad[1] = shape({4, 4 * 63});
    EXPECT_ERROR(checkFusedMixerShapes(a, bad.data(), 8, 1, true), "m*d");
    bad = s;
    bad[2] = shape({4, 1});
    EXPECT_ERROR(checkFusedMixerShapes(a, bad.data(), 8, 1, true), "rank 1");
    bad = s;
    bad[3] = shape({2});
    EXPECT_ERROR(checkFusedMixerShapes(a, bad.data(), 8, 1, true), "scalar");
    bad = s;
    bad[4] = shape({5, 23, 64});
    EXPECT_ERROR(checkFusedMixerShapes(a, bad.data(), 8, 1, true), "sum(stream_kernels[1:])");
    bad = s;
    bad[4] = shape({5, 64, 24}); // the layout before issue 23 ([N, d, K]): a file exported then is refused
    EXPECT_ERROR(checkFusedMixerShapes(a, bad.data(), 8, 1, true), "sum(stream_kernels[1:])");
    bad = s;
    bad[4] = shape({2, 24, 64});
    EXPECT_ERROR(checkFusedMixerShapes(a, bad.data(), 8, 1, true), "N >= n");
    bad = s;
    bad[7] = shape({2, 16, 64});
    EXPECT_ERROR(checkFusedMixerShapes(a, bad.data(), 8, 1, true), "sequence length");
    bad = s;
    bad[6] = shape({3, 17, 64});
    EXPECT_ERROR(checkFusedMixerShapes(a, bad.data(), 8, 1, true), "batch");
    bad = s;
    bad[5] = shape({2, 17, 32});
    EXPECT_ERROR(checkFusedMixerShapes(a, bad.data(), 8, 1, true), "axis 2 must be d");
    EXPECT_ERROR(checkFusedMixerShapes(a, s.data(), 5, 1, true), "at least one source");
    EXPECT_ERROR(checkFusedMixerShapes(a, s.data(), 8, 2, true), "1 output");
    auto many = mixerShapes(a.stream_kernels, kMaxSources + 1, 8, 1, 1, kMaxSources + 1);
    EXPECT_ERROR(checkFusedMixerShapes(a, many.data(), static_cast<int32_t>(many.size()), 1, true), "at most");
}

void testDepthRetrievalShapes()
{
    std::vector<Shape> s = {shape({4, 64}), shape({2, 1, 4, 64}), shape({2, 1, 4, 64})};
    DepthRetrievalDims const r = checkDepthRetrievalShapes(s.data(), 3, 1, true);
    CHECK(r.n == 2 && r.m == 4 && r.d == 64 && r.batch == 2 && r.seq == 1);
    std::vector<Shape> dyn = {shape({1, 64}), shape({-1, -1, 1, 64})};
    CHECK(checkDepthRetrievalShapes(dyn.data(), 2, 1, false).m == 1);
    EXPECT_ERROR(checkDepthRetrievalShapes(dyn.data(), 2, 1, true), "unresolved");
    auto bad = s;
    bad[2] = shape({2, 1, 3, 64});
    EXPECT_ERROR(checkDepthRetrievalShapes(bad.data(), 3, 1, true), "m (query rows)");
    bad = s;
    bad[1] = shape({2, 4, 64});
    EXPECT_ERROR(checkDepthRetrievalShapes(bad.data(), 3, 1, true), "rank 4");
    EXPECT_ERROR(checkDepthRetrievalShapes(s.data(), 1, 1, true), "at least one view");
}

void testDTypes()
{
    CHECK(isSupported(DType::kFLOAT32) && isSupported(DType::kFLOAT16) && isSupported(DType::kBFLOAT16));
    CHECK(!isSupported(DType::kUNSUPPORTED));
    CHECK(std::string(dtypeName(DType::kBFLOAT16)) == "bfloat16");
    CHECK(static_cast<int32_t>(DType::kFLOAT32) == MSAR_DTYPE_FLOAT32);
    CHECK(static_cast<int32_t>(DType::kFLOAT16) == MSAR_DTYPE_FLOAT16);
    CHECK(static_cast<int32_t>(DType::kBFLOAT16) == MSAR_DTYPE_BFLOAT16);
    CHECK(kDTypeTable[0].bytes == 4 && kDTypeTable[1].bytes == 2 && kDTypeTable[2].bytes == 2);
    DType const same[] = {DType::kFLOAT16, DType::kFLOAT16, DType::kFLOAT16};
    CHECK(typeCombinationOk(0, same) && typeCombinationOk(2, same));
    DType const mixed[] = {DType::kFLOAT16, DType::kFLOAT32};
    CHECK(!typeCombinationOk(1, mixed));
    DType const bad[] = {DType::kUNSUPPORTED};
    CHECK(!typeCombinationOk(0, bad));
    CHECK(std::string(msarStatusString(MSAR_STATUS_WORKSPACE_TOO_SMALL)) == "workspace too small");
}
} // namespace

int main()
{
    testFieldNames();
    testAttributes();
    testFusedMixerShapes();
    testDepthRetrievalShapes();
    testDTypes();
    std::printf("logicTest: %d checks passed\n", gChecks);
    return 0;
}

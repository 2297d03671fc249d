/*
 * Stored views against recomputed views, over a whole prefill's mixing (docs/ort_kernels.md, "Stored
 * views instead of recomputed ones"). Not part of the library: a measurement harness.
 *   A: the library's scoredMixer (cpuScoredMixer.cpp, linked as is): every mixer recomputes its
 *      sources' conv views from the raw sources.
 *   B: a weighted sum over views SourceScores would have stored ([B, T, m, d], float32 or float16
 *      converted on load): work item = (batch row, tile of tokens); alpha softmaxed once per tile, z
 *      [tile][m][d] in L2, 4 sources' tiles read contiguously per pass over z; then the gate as
 *      cpuScoredMixer does it. Plus B's extra cost in SourceScores: the store of the views, measured
 *      on its own (the views written from an L1 tile, float32 or converted to float16), and, as an
 *      upper bound, the library's SourceViews (compute + store).
 * For l = 1..17 (d 512, T 512, 8 blocks) mixer l has l sources; between mixers a 48 MB buffer is read
 * (the block's weights evicting L2 and L3). Variants interleaved, order rotated per round; wall time,
 * medians over rounds; 1 thread, and 2 (a persistent worker plus the caller).
 *
 *   S=plugins/msarOrtOps; D=/tmp/views-ab; mkdir -p $D
 *   for f in cpuScoredMixer cpuSourceViews; do g++ -O3 -march=native -std=c++20 -c $S/$f.cpp -o $D/$f.o; done
 *   g++ -O3 -march=native -std=c++20 -pthread $S/scoredViewsAB.cpp $D/*.o -o $D/ab
 *   $D/ab [rounds 7] [d 512] [T 512] [blocks 8]      # TILE=16: tokens per work item of B
 * On a shared machine, check first that both cores are free (two CPU-bound loops side by side should
 * take the wall time of one): the 2-thread rows mean nothing otherwise.
 */
#include "cpuKernels.h"
#include "cpuVector.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <immintrin.h>
#include <memory>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

using namespace msar::cpu;

namespace
{

struct Serial : Parallel
{
    void run(std::size_t total, std::size_t, void (*fn)(void*, std::size_t), void* data) const override
    {
        for (std::size_t i = 0; i < total; ++i)
        {
            fn(data, i);
        }
    }
};

thread_local int64_t tItems = 0;  // work items this thread ran (the worker's share is printed)
std::atomic<int64_t> workerItems{0};

//! The caller and one persistent worker take items from a shared counter. The worker spins 5 ms after a
//! job before it sleeps (a futex wake on this VM came too late for a mixer's millisecond jobs: the
//! caller had done them all), as ORT's pool spins; the caller spins for the worker's last item.
struct TwoThreads : Parallel
{
    mutable std::atomic<int64_t> gen{0}, next{0}, done{0};
    mutable std::size_t total = 0;
    mutable void (*fn)(void*, std::size_t) = nullptr;
    mutable void* data = nullptr;
    std::atomic<bool> stop{false};
    std::thread worker;
    TwoThreads()
    {
        worker = std::thread([this] {
            int64_t seen = 0;
            for (;;)
            {
                auto const idle = std::chrono::steady_clock::now();
                while (gen.load() == seen && std::chrono::steady_clock::now() - idle < std::chrono::milliseconds(5))
                {
                    _mm_pause();
                }
                gen.wait(seen);
                seen = gen.load();
                if (stop)
                {
                    workerItems = tItems;
                    return;
                }
                work();
            }
        });
    }
    ~TwoThreads()
    {
        stop = true;
        gen.fetch_add(1);
        gen.notify_all();
        worker.join();
    }
    void work() const
    {
        for (;;)
        {
            auto const i = static_cast<std::size_t>(next.fetch_add(1));
            if (i >= total)
            {
                return;
            }
            fn(data, i);
            ++tItems;
            done.fetch_add(1);
        }
    }
    void run(std::size_t t, std::size_t, void (*f)(void*, std::size_t), void* d) const override
    {
        total = t, fn = f, data = d;
        done = 0;
        next = 0;
        gen.fetch_add(1);
        gen.notify_all();
        work();
        while (done.load() < static_cast<int64_t>(t))
        {
            _mm_pause();
        }
    }
};

//! B: the weighted sum over stored views and the gate. View storage float32 or float16.
struct StoredProblem
{
    bool half;
    int64_t B, T, d, n, m;
    std::vector<void const*> views;  // n x [B, T, m, d]
    float const* scores;             // [n, B, T, m]
    float const* gate;               // [m][m][d] (loadGate's layout, d whole vectors)
    float const* bias;
    float scale;
    float* h;  // [B, T, d]
    int64_t tile;
};

inline vf loadView(void const* base, int64_t offset, bool half)
{
    if (!half)
    {
        return vload(static_cast<float const*>(base) + offset);
    }
#if defined(__AVX512F__)
    return reinterpret_cast<vf>(_mm512_cvtph_ps(_mm256_loadu_si256(
        reinterpret_cast<__m256i const*>(static_cast<_Float16 const*>(base) + offset))));
#else
    return reinterpret_cast<vf>(_mm256_cvtph_ps(_mm_loadu_si128(
        reinterpret_cast<__m128i const*>(static_cast<_Float16 const*>(base) + offset))));
#endif
}

thread_local std::vector<float> tZ, tAlpha;

//! z[0 .. span) += sum over G sources of a[g] * view_g, the views' rows contiguous from their offset.
template <int G>
void accumulate(float* z, void const* const* v, int64_t offset, float const* a, int64_t span, bool half)
{
    vf as[G];
    for (int g = 0; g < G; ++g)
    {
        as[g] = vsplat(a[g]);
    }
    for (int64_t c = 0; c < span; c += kVW)
    {
        vf acc = vload(z + c);
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g)
        {
            acc += as[g] * loadView(v[g], offset + c, half);
        }
        vstore(z + c, acc);
    }
}

void storedItem(void* data, std::size_t item)
{
    StoredProblem const& p = *static_cast<StoredProblem*>(data);
    int64_t const tiles = (p.T + p.tile - 1) / p.tile, b = static_cast<int64_t>(item) / tiles;
    int64_t const t0 = (static_cast<int64_t>(item) % tiles) * p.tile, tn = std::min(p.tile, p.T - t0);
    int64_t const m = p.m, d = p.d, n = p.n, md = m * d;
    tZ.assign(tn * md, 0.F);
    tAlpha.resize(tn * m * n);
    for (int64_t tt = 0; tt < tn; ++tt)  // alpha [tt][r][i]: the softmax over the sources, once per tile
    {
        for (int64_t r = 0; r < m; ++r)
        {
            float* a = tAlpha.data() + (tt * m + r) * n;
            float max = -1e30F, sum = 0.F;
            for (int64_t i = 0; i < n; ++i)
            {
                a[i] = p.scores[((i * p.B + b) * p.T + t0 + tt) * m + r];
                max = std::max(max, a[i]);
            }
            for (int64_t i = 0; i < n; ++i)
            {
                a[i] = std::exp(a[i] - max);
                sum += a[i];
            }
            for (int64_t i = 0; i < n; ++i)
            {
                a[i] /= sum;
            }
        }
    }
    float a[4];
    for (int64_t i0 = 0; i0 < n; i0 += 4)
    {
        int64_t const G = std::min<int64_t>(4, n - i0);
        for (int64_t tt = 0; tt < tn; ++tt)
        {
            for (int64_t r = 0; r < m; ++r)
            {
                for (int64_t g = 0; g < G; ++g)
                {
                    a[g] = tAlpha[(tt * m + r) * n + i0 + g];
                }
                float* z = tZ.data() + (tt * m + r) * d;
                int64_t const offset = ((b * p.T + t0 + tt) * m + r) * d;
                void const* const* v = p.views.data() + i0;
                switch (G)
                {
                case 4: accumulate<4>(z, v, offset, a, d, p.half); break;
                case 3: accumulate<3>(z, v, offset, a, d, p.half); break;
                case 2: accumulate<2>(z, v, offset, a, d, p.half); break;
                default: accumulate<1>(z, v, offset, a, d, p.half); break;
                }
            }
        }
    }
    for (int64_t tt = 0; tt < tn; ++tt)  // the gate, as cpuScoredMixer's phase 2
    {
        float const* z = tZ.data() + tt * md;
        float g[8];
        for (int64_t o = 0; o < m; ++o)
        {
            vf acc{};
            for (int64_t c = 0; c < md; c += kVW)
            {
                acc += vload(p.gate + o * md + c) * vload(z + c);
            }
            g[o] = 1.F / (1.F + std::exp(-(p.scale * hsum(acc) + p.bias[o])));
        }
        float* out = p.h + (b * p.T + t0 + tt) * d;
        for (int64_t c = 0; c < d; c += kVW)
        {
            vf acc{};
            for (int64_t r = 0; r < m; ++r)
            {
                acc += vsplat(g[r]) * vload(z + r * d + c);
            }
            vstore(out + c, acc);
        }
    }
}

//! B's extra store in SourceScores: one source's views written from an L1 tile of one token's views.
struct StoreProblem
{
    bool half;
    int64_t rows, md;  // B*T rows of m*d
    float const* tile;
    void* views;
};

void storeItem(void* data, std::size_t item)
{
    StoreProblem const& p = *static_cast<StoreProblem*>(data);
    int64_t const per = (p.rows + 31) / 32;
    for (int64_t t = item * per; t < std::min(p.rows, (int64_t(item) + 1) * per); ++t)
    {
        if (!p.half)
        {
            std::memcpy(static_cast<float*>(p.views) + t * p.md, p.tile, p.md * sizeof(float));
            continue;
        }
        _Float16* out = static_cast<_Float16*>(p.views) + t * p.md;
        for (int64_t c = 0; c < p.md; c += kVW)
        {
#if defined(__AVX512F__)
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + c),
                                _mm512_cvtps_ph(reinterpret_cast<__m512>(vload(p.tile + c)), _MM_FROUND_TO_NEAREST_INT));
#else
            _mm_storeu_si128(reinterpret_cast<__m128i*>(out + c),
                             _mm256_cvtps_ph(reinterpret_cast<__m256>(vload(p.tile + c)), _MM_FROUND_TO_NEAREST_INT));
#endif
        }
    }
}

double seconds()
{
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::vector<float> sweep(48 << 20 >> 2, 1.F);
volatile float sink;

//! The block's weights between two mixers: every line of 48 MB read (L2 1 MB, L3 32 MB).
void evict()
{
    float s = 0.F;
    for (std::size_t i = 0; i < sweep.size(); i += 16)
    {
        s += sweep[i];
    }
    sink = s;
}

double median(std::vector<double> v)
{
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

} // namespace

int main(int argc, char** argv)
{
    int const rounds = argc > 1 ? atoi(argv[1]) : 7, d = argc > 2 ? atoi(argv[2]) : 512;
    int const T = argc > 3 ? atoi(argv[3]) : 512, blocks = argc > 4 ? atoi(argv[4]) : 8;
    int64_t const tile = getenv("TILE") ? atoi(getenv("TILE")) : 16;
    int const N = 2 * blocks + 1, m = 4, K = 24, B = 1, H = 11;  // N mixers; mixer l has sources 0..l-1
    std::vector<int32_t> const kernels{1, 4, 8, 12};
    std::mt19937 rng(0);
    std::normal_distribution<float> gauss(0, 1);
    auto rnd = [&](std::size_t count, float scale) {
        std::vector<float> v(count);
        for (auto& x : v)
        {
            x = gauss(rng) * scale;
        }
        return v;
    };
    auto gw = rnd(m * m * d, 0.02F), gb = rnd(m, 0.1F), gs = std::vector<float>{1.F};
    auto cw = rnd(static_cast<std::size_t>(N) * K * d, 0.3F);
    std::vector<std::vector<float>> src, views32;
    std::vector<std::vector<_Float16>> views16;
    std::vector<float> history(B * H * d, 0.F);
    std::vector<int64_t> mask(B * T, 1);
    Serial serial;
    for (int i = 0; i < N; ++i)
    {
        src.push_back(rnd(static_cast<std::size_t>(B) * T * d, 1.F));
        views32.emplace_back(static_cast<std::size_t>(B) * T * m * d);
        SourceViewsProblem v{Storage::kFloat32, B, T, d, kernels, cw.data() + i * K * d, history.data(),
                             src[i].data(), mask.data(), views32[i].data()};
        sourceViews(v, serial);
        views16.emplace_back(views32[i].size());
        std::transform(views32[i].begin(), views32[i].end(), views16[i].begin(),
                       [](float x) { return static_cast<_Float16>(x); });
    }
    std::vector<std::vector<float>> scores;  // mixer l: [l, B, T, m]
    for (int l = 1; l <= N; ++l)
    {
        scores.push_back(rnd(static_cast<std::size_t>(l) * B * T * m, 1.F));
    }
    std::vector<float> gate;
    float bias[8], scale;
    loadGate(gw.data(), gb.data(), gs.data(), m, d, d, Storage::kFloat32, gate, bias, &scale);
    std::vector<float> hA(static_cast<std::size_t>(B) * T * d), hB(hA.size());
    auto recomputed = [&](int l, Parallel const& par) {
        FusedMixerProblem p;
        p.storage = Storage::kFloat32;
        p.B = B, p.T = T, p.d = d, p.n = l, p.kernels = kernels, p.eps = 1e-6F;
        p.gate_weight = gw.data(), p.gate_bias = gb.data(), p.gate_scale = gs.data();
        p.conv_weight = cw.data(), p.h = hA.data(), p.scores = scores[l - 1].data();
        for (int i = 0; i < l; ++i)
        {
            p.sources.push_back(src[i].data());
        }
        scoredMixer(p, par);
    };
    auto stored = [&](int l, bool half, Parallel const& par) {
        StoredProblem p{half, B, T, d, l, m, {}, scores[l - 1].data(), gate.data(), bias, scale, hB.data(), tile};
        for (int i = 0; i < l; ++i)
        {
            p.views.push_back(half ? static_cast<void const*>(views16[i].data()) : views32[i].data());
        }
        par.run(static_cast<std::size_t>(B * ((T + tile - 1) / tile)), 0, storedItem, &p);
    };
    // Correctness: B against A for every mixer, and both against float64 for the last.
    double worst32 = 0, worst16 = 0;
    for (int l = 1; l <= N; ++l)
    {
        recomputed(l, serial);
        for (int half = 0; half < 2; ++half)
        {
            stored(l, half, serial);
            double diff = 0;
            for (std::size_t j = 0; j < hA.size(); ++j)
            {
                diff = std::max(diff, static_cast<double>(std::fabs(hA[j] - hB[j])));
            }
            (half ? worst16 : worst32) = std::max(half ? worst16 : worst32, diff);
        }
    }
    {
        int const l = N;
        std::vector<double> ref(hA.size());
        std::vector<double> z(m * d);
        int const offs[4] = {0, 0, 4, 12};
        for (int t = 0; t < T; ++t)
        {
            std::fill(z.begin(), z.end(), 0.0);
            for (int r = 0; r < m; ++r)
            {
                double max = -1e300, sum = 0;
                std::vector<double> a(l);
                for (int i = 0; i < l; ++i)
                {
                    max = std::max(max, double(scores[l - 1][(i * T + t) * m + r]));
                }
                for (int i = 0; i < l; ++i)
                {
                    sum += a[i] = std::exp(double(scores[l - 1][(i * T + t) * m + r]) - max);
                }
                for (int i = 0; i < l; ++i)
                {
                    for (int c = 0; c < d; ++c)
                    {
                        double v = 0;
                        if (r == 0)
                        {
                            v = src[i][t * d + c];
                        }
                        for (int j = 0; r > 0 && j < kernels[r]; ++j)
                        {
                            int const u = t - (kernels[r] - 1 - j);
                            v += u < 0 ? 0.0 : double(cw[(i * K + offs[r] + j) * d + c]) * src[i][u * d + c];
                        }
                        z[r * d + c] += a[i] / sum * v;
                    }
                }
            }
            double g[4];
            for (int o = 0; o < m; ++o)
            {
                double logit = 0;
                for (int c = 0; c < m * d; ++c)
                {
                    logit += double(gw[o * m * d + c]) * z[c];
                }
                g[o] = 1 / (1 + std::exp(-(double(gs[0]) * logit + gb[o])));
            }
            for (int c = 0; c < d; ++c)
            {
                for (int r = 0; r < m; ++r)
                {
                    ref[t * d + c] += g[r] * z[r * d + c];
                }
            }
        }
        double dA = 0, dB32 = 0, dB16 = 0;
        recomputed(l, serial);
        for (int half = 0; half < 2; ++half)
        {
            stored(l, half, serial);
            for (std::size_t j = 0; j < ref.size(); ++j)
            {
                (half ? dB16 : dB32) = std::max(half ? dB16 : dB32, std::fabs(hB[j] - ref[j]));
            }
        }
        for (std::size_t j = 0; j < ref.size(); ++j)
        {
            dA = std::max(dA, std::fabs(hA[j] - ref[j]));
        }
        printf("max |h_B - h_A| over the %d mixers: float32 views %.2e, float16 views %.2e\n", N, worst32, worst16);
        printf("mixer %d against float64: A %.2e, B float32 %.2e, B float16 %.2e (max |h| about %.1f)\n", l, dA, dB32,
               dB16, *std::max_element(ref.begin(), ref.end()));
    }
    // Timing.
    auto twoOwned = std::make_unique<TwoThreads>();
    TwoThreads const& two = *twoOwned;
    std::vector<float> tileBuf = rnd(m * d, 1.F);
    auto allMixers = [&](std::function<void(int)> const& f) {
        double total = 0;
        for (int l = 1; l <= N; ++l)
        {
            evict();
            double const t0 = seconds();
            f(l);
            total += seconds() - t0;
        }
        return total;
    };
    auto allStores = [&](bool half, Parallel const& par) {  // every source's views, once (SourceScores i)
        double total = 0;
        for (int i = 0; i < N; ++i)
        {
            evict();
            StoreProblem p{half, B * T, m * d, tileBuf.data(),
                           half ? static_cast<void*>(views16[i].data()) : views32[i].data()};
            double const t0 = seconds();
            par.run(32, 0, storeItem, &p);
            total += seconds() - t0;
        }
        return total;
    };
    std::vector<std::pair<std::string, std::function<double()>>> variants{
        {"A recomputed 1t", [&] { return allMixers([&](int l) { recomputed(l, serial); }); }},
        {"B stored f32 1t", [&] { return allMixers([&](int l) { stored(l, false, serial); }); }},
        {"B stored f16 1t", [&] { return allMixers([&](int l) { stored(l, true, serial); }); }},
        {"A recomputed 2t", [&] { return allMixers([&](int l) { recomputed(l, two); }); }},
        {"B stored f32 2t", [&] { return allMixers([&](int l) { stored(l, false, two); }); }},
        {"B stored f16 2t", [&] { return allMixers([&](int l) { stored(l, true, two); }); }},
        {"store f32 1t", [&] { return allStores(false, serial); }},
        {"store f16 1t", [&] { return allStores(true, serial); }},
        {"store f32 2t", [&] { return allStores(false, two); }},
        {"store f16 2t", [&] { return allStores(true, two); }},
        {"SourceViews f32 1t", [&] {
             double total = 0;
             for (int i = 0; i < N; ++i)
             {
                 evict();
                 SourceViewsProblem v{Storage::kFloat32, B, T, d, kernels, cw.data() + i * K * d, history.data(),
                                      src[i].data(), mask.data(), views32[i].data()};
                 double const t0 = seconds();
                 sourceViews(v, serial);
                 total += seconds() - t0;
             }
             return total;
         }},
    };
    std::map<std::string, std::vector<double>> times;
    std::vector<double> ratio1, ratio2;
    for (int r = 0; r <= rounds; ++r)  // round 0 warms up
    {
        std::map<std::string, double> now;
        for (std::size_t k = 0; k < variants.size(); ++k)
        {
            auto const& v = variants[(k + r) % variants.size()];
            now[v.first] = v.second();
        }
        if (r > 0)
        {
            for (auto const& [name, t] : now)
            {
                times[name].push_back(t);
            }
        }
    }
    printf("d %d T %d blocks %d (%d mixers, %d pairs), tile %ld, %d rounds; totals over all mixers, ms:\n", d, T,
           blocks, N, N * (N + 1) / 2, static_cast<long>(tile), rounds);
    for (auto const& [name, t] : times)
    {
        printf("  %-20s median %7.2f  [%7.2f .. %7.2f]\n", name.c_str(), median(t) * 1e3,
               *std::min_element(t.begin(), t.end()) * 1e3, *std::max_element(t.begin(), t.end()) * 1e3);
    }
    int64_t const callerItems = tItems;
    twoOwned.reset();
    printf("  2t work items: caller %ld, worker %ld\n", static_cast<long>(callerItems),
           static_cast<long>(workerItems.load()));
    for (char const* th : {"1t", "2t"})
    {
        for (char const* prec : {"f32", "f16"})
        {
            std::string const a = std::string("A recomputed ") + th, b = std::string("B stored ") + prec + " " + th;
            std::string const s = std::string("store ") + prec + " " + th;
            std::vector<double> q, qs;
            for (std::size_t k = 0; k < times[a].size(); ++k)
            {
                q.push_back(times[b][k] / times[a][k]);
                qs.push_back((times[b][k] + times[s][k]) / times[a][k]);
            }
            printf("  %s %s: B/A median of rounds %.3f; (B + store)/A %.3f\n", th, prec, median(q), median(qs));
        }
    }
}

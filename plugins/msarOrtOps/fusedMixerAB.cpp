/*
 * FusedMixer (or ScoredMixer) A/B: two builds of cpuFusedMixer.cpp (or cpuScoredMixer.cpp;
 * namespaces msarA and msarB) on the same inputs, called alternately on one thread, thread CPU time,
 * best of N and the per-round ratios; a machine shared with other work still gives a usable ratio
 * (docs/ort_kernels.md). Not part of the library.
 *
 *   D=/tmp/mixer-ab; F=cpuFusedMixer; mkdir -p $D     # F=cpuScoredMixer with -DSCORED below
 *   cp -r OLD/plugins/msarOrtOps $D/A; cp -r plugins/msarOrtOps $D/B
 *   for v in A B; do g++ -O3 -march=native -std=c++20 -Dmsar=msar$v -c $D/$v/$F.cpp -o $D/$v.o; done
 *   g++ -O3 -march=native -std=c++20 -I$D [-DSCORED] plugins/msarOrtOps/fusedMixerAB.cpp $D/A.o $D/B.o -o $D/ab
 *   $D/ab [n 17] [d 512] [T 512] [rounds 25]
 * Where the sources lie: by default n distinct buffers, left in L3 by the previous call; SAME=1 every
 * source the same buffer (L2-resident); SWEEP=1 a 48 MB buffer read before each call (evicted).
 * Run it once with A and B the same code first: the ratio it gives is the harness's own bias (B runs
 * second). On 2026-12-03's machine that was 1.16 for FusedMixer and 0.97-1.01 for ScoredMixer.
 */
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <time.h>
#include <vector>
#define msar msarA
#include "A/cpuKernels.h"
#undef msar
#undef MSAR_ORT_CPU_KERNELS_H
#define msar msarB
#include "B/cpuKernels.h"
#undef msar

#ifdef SCORED
#define MIXER(ns, p, par) ns::cpu::scoredMixer(p, par)
#else
#define MIXER(ns, p, par) ns::cpu::fusedMixer(p, par)
#endif

template <class P>
struct Serial : P
{
    void run(std::size_t total, std::size_t, void (*fn)(void*, std::size_t), void* data) const override
    {
        for (std::size_t i = 0; i < total; ++i)
        {
            fn(data, i);
        }
    }
};

static double cpuSeconds()
{
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

int main(int argc, char** argv)
{
    int const n = argc > 1 ? atoi(argv[1]) : 17, d = argc > 2 ? atoi(argv[2]) : 512, T = argc > 3 ? atoi(argv[3]) : 512;
    int const rounds = argc > 4 ? atoi(argv[4]) : 25;
    std::vector<int32_t> const kernels{1, 4, 8, 12};
    int const m = 4, K = 24;
    std::mt19937 g(0);
    std::normal_distribution<float> N(0, 1);
    auto rnd = [&](std::size_t count, float scale) {
        std::vector<float> v(count);
        for (auto& x : v)
        {
            x = N(g) * scale;
        }
        return v;
    };
    auto q = rnd(m * d, 0.05F), gw = rnd(m * m * d, 0.02F), gb = rnd(m, 0.1F), gs = std::vector<float>{1.F};
    auto cw = rnd(static_cast<std::size_t>(n) * K * d, 0.3F);
    std::vector<std::vector<float>> src;
    for (int i = 0; i < n; ++i)
    {
        src.push_back(rnd(static_cast<std::size_t>(T) * d, 1.F));
    }
    std::vector<float> hA(static_cast<std::size_t>(T) * d), hB(hA.size());
    auto scores = rnd(static_cast<std::size_t>(n) * T * m, 1.F);  // ScoredMixer's given scores [n, B, T, m]
    std::vector<char> sweep(48 << 20);
    auto fill = [&](auto& p, float* h) {
        p.storage = decltype(p.storage)::kFloat32;
        p.B = 1, p.T = T, p.d = d, p.n = n, p.kernels = kernels, p.eps = 1e-6F;
        p.query = q.data(), p.gate_weight = gw.data(), p.gate_bias = gb.data(), p.gate_scale = gs.data();
        p.conv_weight = cw.data(), p.h = h;
#ifdef SCORED
        p.scores = scores.data();
#endif
        for (auto& s : src)
        {
            p.sources.push_back(getenv("SAME") ? src[0].data() : s.data());
        }
    };
    msarA::cpu::FusedMixerProblem pa;
    msarB::cpu::FusedMixerProblem pb;
    fill(pa, hA.data());
    fill(pb, hB.data());
    Serial<msarA::cpu::Parallel> sa;
    Serial<msarB::cpu::Parallel> sb;
    double bestA = 1e9, bestB = 1e9;
    std::vector<double> ratios;
    for (int r = 0; r <= rounds; ++r)  // round 0 warms up
    {
        auto evict = [&] {
            if (getenv("SWEEP"))
            {
                for (auto& c : sweep)
                {
                    c = static_cast<char>(c + 1);
                }
            }
        };
        evict();
        double const t0 = cpuSeconds();
        MIXER(msarA, pa, sa);
        double const t1 = cpuSeconds();
        evict();
        double const t2 = cpuSeconds();
        MIXER(msarB, pb, sb);
        double const t3 = cpuSeconds();
        if (r > 0)
        {
            bestA = std::min(bestA, t1 - t0), bestB = std::min(bestB, t3 - t2);
            ratios.push_back((t3 - t2) / (t1 - t0));
        }
    }
    double diff = 0;
    for (std::size_t i = 0; i < hA.size(); ++i)
    {
        diff = std::max(diff, static_cast<double>(std::fabs(hA[i] - hB[i])));
    }
    std::sort(ratios.begin(), ratios.end());
#ifdef SCORED
    double const macs = 28.0 * n * T * d;  // multiply-adds per channel, source and token (views once)
#else
    double const macs = 60.0 * n * T * d;  // multiply-adds per channel, source and token (views twice)
#endif
    printf("n %d d %d T %d: A %.2f ms (%.1f GMAC/s), B %.2f ms (%.1f GMAC/s); B/A best %.3f, median of rounds %.3f "
           "[%.3f..%.3f]; max |hA - hB| %.2e\n",
           n, d, T, bestA * 1e3, macs / bestA * 1e-9, bestB * 1e3, macs / bestB * 1e-9, bestB / bestA,
           ratios[ratios.size() / 2], ratios.front(), ratios.back(), diff);
}

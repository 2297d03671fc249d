/*
 * FusedMixer on the CPU.  One work item is TILE tokens of one batch row:
 *   0. every source's window for the tile (TILE + kmax - 1 rows, zeros before
 *      t = 0): float32 rows read where they are when the tile lies inside the
 *      sequence, else converted once into a chunk-major float32 copy (one
 *      chunk of kChunk channels of every row contiguous);
 *   1. per source and chunk, the conv views of kRegs tokens in registers
 *      (each tap loaded once per chunk and used for every token) and their
 *      q . v and v . v -> scores;
 *   2. the max-subtracted softmax over the sources;
 *   3. per chunk, the views again (24 FMAs per channel; a stored view buffer
 *      was no faster and grows with n: docs/ort_kernels.md), z accumulated in
 *      an L1 buffer, the gate logits' partial sums; then the gates and h.
 * Taps are converted once per call into [source][chunk][tap][kChunk], the
 * order the loops read them.
 */
#include "cpuKernels.h"
#include "cpuVector.h"

#include <algorithm>
#include <limits>
#include <stdexcept>

namespace msar::cpu
{
namespace
{

constexpr int64_t kMaxStreams = 8;   // MSAR_MAX_STREAMS (common/msarKernelTypes.h)
constexpr int64_t kChunk = 8 * kVW;  // channels whose rows, taps and sums stay in L1 together
constexpr int64_t kRegs = 8;         // tokens whose views are in registers together
constexpr int64_t kTile = 32;        // tokens per work item: the window's halo (kmax - 1 rows) read once for them

struct Prepared
{
    FusedMixerProblem const* p;
    int64_t m, dp, chunks, H, K, tile, tiles;
    int64_t offsets[kMaxStreams];  // first tap of stream r in a conv_weight row
    std::vector<float> query;      // [m][dp]
    std::vector<float> gate;       // [m out][m in][dp]: W's d-block of stream `in` for logit `out`
    float bias[kMaxStreams];
    float scale;
    std::vector<float> taps;  // [n][chunk][K][kChunk]
};

//! One source's window for a tile: row u, channel c at base[(c / kChunk) * chunk + u * row + c % kChunk].
struct Window
{
    float const* base;
    int64_t chunk, row;
};

struct Scratch
{
    std::vector<float> windows, scores, zchunk, z, h;
    std::vector<Window> views;
    std::vector<vf> logits;
};

thread_local Scratch tScratch;

template <typename V>
typename V::value_type* sized(V& v, int64_t n)
{
    if (static_cast<int64_t>(v.size()) < n)
    {
        v.resize(n);
    }
    return v.data();
}

//! Stream r's views of one chunk for TILE tokens, in acc; rows: the chunk's window rows.
template <int64_t TILE>
inline void streamViews(Prepared const& P, int64_t r, float const* rows, int64_t rs, float const* taps, int64_t cc, vf* acc)
{
    int64_t const k = P.p->kernels[r];
    float const* first = rows + (P.H - (k - 1)) * rs + cc;  // tap j multiplies token t-(k-1-j)
    if (r == 0)
    {
        for (int64_t t = 0; t < TILE; ++t)
        {
            acc[t] = vload(first + t * rs);
        }
        return;
    }
    taps += P.offsets[r] * kChunk + cc;
    for (int64_t t = 0; t < TILE; ++t)
    {
        acc[t] = vf{};
    }
    for (int64_t j = 0; j < k; ++j)
    {
        vf const w = vload(taps + j * kChunk);
        for (int64_t t = 0; t < TILE; ++t)
        {
            acc[t] += w * vload(first + (j + t) * rs);
        }
    }
}

//! Pass 1 for source i: scores[t][r] = q^(r) . RMSNorm(v^(r)_t).
template <int64_t TILE>
void scoresOf(Prepared const& P, int64_t i, Window const& window, float* scores)
{
    int64_t const m = P.m;
    vf parts[TILE * kMaxStreams * 2] = {};
    for (int64_t ch = 0; ch < P.chunks; ++ch)
    {
        float const* win = window.base + ch * window.chunk;
        float const* taps = P.taps.data() + (i * P.chunks + ch) * P.K * kChunk;
        for (int64_t r = 0; r < m; ++r)
        {
            vf dot[TILE] = {}, squares[TILE] = {};
            for (int64_t cc = 0; cc < kChunk; cc += kVW)
            {
                vf acc[TILE];
                streamViews<TILE>(P, r, win, window.row, taps, cc, acc);
                vf const q = vload(P.query.data() + r * P.dp + ch * kChunk + cc);
                for (int64_t t = 0; t < TILE; ++t)
                {
                    dot[t] += q * acc[t];
                    squares[t] += acc[t] * acc[t];
                }
            }
            for (int64_t t = 0; t < TILE; ++t)
            {
                parts[(t * m + r) * 2] += dot[t];
                parts[(t * m + r) * 2 + 1] += squares[t];
            }
        }
    }
    for (int64_t tr = 0; tr < TILE * m; ++tr)
    {
        scores[tr] = score(hsum(parts[tr * 2]), hsum(parts[tr * 2 + 1]), P.p->d, P.p->eps);
    }
}

//! scores[i][tr] -> alpha in place: softmax over i, max-subtracted.
void softmaxOverSources(float* scores, int64_t n, int64_t stride)
{
    for (int64_t tr = 0; tr < stride; ++tr)
    {
        float max = -std::numeric_limits<float>::infinity();
        for (int64_t i = 0; i < n; ++i)
        {
            max = std::max(max, scores[i * stride + tr]);
        }
        float sum = 0.F;
        for (int64_t i = 0; i < n; ++i)
        {
            float& s = scores[i * stride + tr];
            s = std::exp(s - max);
            sum += s;
        }
        float const inv = 1.F / sum;
        for (int64_t i = 0; i < n; ++i)
        {
            scores[i * stride + tr] *= inv;
        }
    }
}

//! Pass 3: z[t][r][:] = sum_i alpha[i][t][r] v_i[t][r][:] chunk by chunk, and the gate logits'
//! partial sums logits[t][o] (vectors) = sum_r W[o][r-block] . z[t][r].
template <int64_t TILE>
void retrieve(Prepared const& P, Window const* windows, int64_t shift, float const* alpha, int64_t stride, float* zchunk,
              float* z, vf* logits)
{
    FusedMixerProblem const& p = *P.p;
    int64_t const m = P.m, dp = P.dp;
    std::fill_n(logits, TILE * m, vf{});
    for (int64_t ch = 0; ch < P.chunks; ++ch)
    {
        std::fill_n(zchunk, TILE * m * kChunk, 0.F);
        for (int64_t i = 0; i < p.n; ++i)
        {
            float const* win = windows[i].base + ch * windows[i].chunk + shift * windows[i].row;
            float const* taps = P.taps.data() + (i * P.chunks + ch) * P.K * kChunk;
            for (int64_t r = 0; r < m; ++r)
            {
                vf a[TILE];
                for (int64_t t = 0; t < TILE; ++t)
                {
                    a[t] = vsplat(alpha[i * stride + t * m + r]);
                }
                for (int64_t cc = 0; cc < kChunk; cc += kVW)
                {
                    vf acc[TILE];
                    streamViews<TILE>(P, r, win, windows[i].row, taps, cc, acc);
                    for (int64_t t = 0; t < TILE; ++t)
                    {
                        float* zp = zchunk + (t * m + r) * kChunk + cc;
                        vstore(zp, vload(zp) + a[t] * acc[t]);
                    }
                }
            }
        }
        for (int64_t t = 0; t < TILE; ++t)
        {
            for (int64_t r = 0; r < m; ++r)
            {
                float const* zc = zchunk + (t * m + r) * kChunk;
                std::copy_n(zc, kChunk, z + (t * m + r) * dp + ch * kChunk);
                for (int64_t o = 0; o < m; ++o)
                {
                    float const* w = P.gate.data() + (o * m + r) * dp + ch * kChunk;
                    for (int64_t cc = 0; cc < kChunk; cc += kVW)
                    {
                        logits[t * m + o] += vload(w + cc) * vload(zc + cc);
                    }
                }
            }
        }
    }
}

template <int64_t TILE>
void runTile(Prepared const& P, int64_t item)
{
    FusedMixerProblem const& p = *P.p;
    int64_t const dp = P.dp, m = P.m, H = P.H, d = p.d, rows = TILE + H;
    int64_t const b = item / P.tiles, t0 = (item % P.tiles) * TILE, tn = std::min(TILE, p.T - t0);
    Scratch& s = tScratch;
    float* windows = sized(s.windows, p.n * rows * dp);
    float* scores = sized(s.scores, p.n * TILE * m);
    float* zchunk = sized(s.zchunk, kRegs * m * kChunk);
    float* z = sized(s.z, TILE * m * dp);
    float* h = sized(s.h, dp);
    vf* logits = sized(s.logits, TILE * m);
    Window* window = sized(s.views, p.n);
    // float32 rows whose chunks are whole are read where they are (no copy) once the tile's
    // window lies inside the sequence
    bool const inPlace = p.storage == Storage::kFloat32 && dp == d && t0 >= H && t0 + TILE <= p.T;
    for (int64_t i = 0; i < p.n; ++i)
    {
        if (inPlace)
        {
            window[i] = {static_cast<float const*>(p.sources[i]) + (b * p.T + t0 - H) * d, kChunk, d};
        }
        else
        {
            float* copy = windows + i * P.chunks * rows * kChunk;
            window[i] = {copy, rows * kChunk, kChunk};
            for (int64_t u = 0; u < rows; ++u)
            {
                int64_t const t = t0 - H + u;
                for (int64_t ch = 0; ch < P.chunks; ++ch)
                {
                    float* dst = copy + (ch * rows + u) * kChunk;
                    int64_t const c0 = ch * kChunk, count = std::max<int64_t>(0, std::min(kChunk, d - c0));
                    if (t < 0 || t >= p.T)
                    {
                        std::fill_n(dst, kChunk, 0.F);  // zeros before the sequence start (and past its end)
                    }
                    else
                    {
                        loadRow(dst, p.sources[i], (b * p.T + t) * d + c0, count, kChunk, p.storage);
                    }
                }
            }
        }
        constexpr int64_t R = TILE < kRegs ? TILE : kRegs;
        for (int64_t t = 0; t < tn; t += R)
        {
            Window const shifted{window[i].base + t * window[i].row, window[i].chunk, window[i].row};
            scoresOf<R>(P, i, shifted, scores + i * TILE * m + t * m);
        }
    }
    softmaxOverSources(scores, p.n, TILE * m);
    constexpr int64_t R = TILE < kRegs ? TILE : kRegs;
    for (int64_t t = 0; t < tn; t += R)
    {
        retrieve<R>(P, window, t, scores + t * m, TILE * m, zchunk, z + t * m * dp, logits + t * m);
    }
    for (int64_t t = 0; t < tn; ++t)
    {
        float g[kMaxStreams];
        for (int64_t o = 0; o < m; ++o)
        {
            g[o] = 1.F / (1.F + std::exp(-(P.scale * hsum(logits[t * m + o]) + P.bias[o])));
        }
        for (int64_t c = 0; c < dp; c += kVW)
        {
            vf acc = vf{};
            for (int64_t r = 0; r < m; ++r)
            {
                acc += vsplat(g[r]) * vload(z + (t * m + r) * dp + c);
            }
            vstore(h + c, acc);
        }
        storeRow(p.h, (b * p.T + t0 + t) * d, h, d, p.storage);
    }
}

template <int64_t TILE>
void runItem(void* data, std::size_t item)
{
    runTile<TILE>(*static_cast<Prepared const*>(data), static_cast<int64_t>(item));
}

} // namespace

void fusedMixer(FusedMixerProblem const& p, Parallel const& parallel)
{
    Prepared P;
    P.p = &p;
    P.m = static_cast<int64_t>(p.kernels.size());
    if (P.m < 1 || P.m > kMaxStreams || p.kernels[0] != 1)
    {
        throw std::invalid_argument("stream_kernels must start with 1 and have at most 8 streams");
    }
    P.dp = (p.d + kChunk - 1) / kChunk * kChunk;
    P.chunks = P.dp / kChunk;
    P.K = 0;
    int64_t kmax = 1;
    P.offsets[0] = 0;
    for (int64_t r = 1; r < P.m; ++r)
    {
        if (p.kernels[r] < 1)
        {
            throw std::invalid_argument("stream_kernels must be positive");
        }
        P.offsets[r] = P.K;
        P.K += p.kernels[r];
        kmax = std::max<int64_t>(kmax, p.kernels[r]);
    }
    P.H = kmax - 1;
    int64_t const dp = P.dp, d = p.d, m = P.m;
    P.query.assign(m * dp, 0.F);
    for (int64_t r = 0; r < m; ++r)
    {
        loadRow(P.query.data() + r * dp, p.query, r * d, d, dp, p.storage);
    }
    P.gate.assign(m * m * dp, 0.F);
    for (int64_t o = 0; o < m; ++o)
    {
        for (int64_t r = 0; r < m; ++r)
        {
            loadRow(P.gate.data() + (o * m + r) * dp, p.gate_weight, o * m * d + r * d, d, dp, p.storage);
        }
    }
    loadRow(P.bias, p.gate_bias, 0, m, m, p.storage);
    loadRow(&P.scale, p.gate_scale, 0, 1, 1, p.storage);
    // conv_weight rows are [K][d]; the loops want [chunk][K][kChunk] (one chunk's taps together).
    P.taps.assign(p.n * P.K * dp, 0.F);
    for (int64_t i = 0; i < p.n; ++i)
    {
        for (int64_t ch = 0; ch < P.chunks; ++ch)
        {
            int64_t const c0 = ch * kChunk, count = std::max<int64_t>(0, std::min(kChunk, d - c0));
            for (int64_t j = 0; j < P.K; ++j)
            {
                loadRow(P.taps.data() + ((i * P.chunks + ch) * P.K + j) * kChunk, p.conv_weight, (i * P.K + j) * d + c0,
                        count, kChunk, p.storage);
            }
        }
    }
    // Short sequences (decode-sized calls) take smaller tiles: no work on tokens that do not exist.
    P.tile = kTile;
    while (P.tile > 1 && P.tile >= 2 * p.T)
    {
        P.tile /= 2;
    }
    P.tiles = (p.T + P.tile - 1) / P.tile;
    void (*fn)(void*, std::size_t) = P.tile == 32 ? runItem<32> : P.tile == 16 ? runItem<16> : P.tile == 8 ? runItem<8>
                                   : P.tile == 4  ? runItem<4>  : P.tile == 2  ? runItem<2>  : runItem<1>;
    parallel.run(static_cast<std::size_t>(p.B * P.tiles), 0, fn, &P);
}

} // namespace msar::cpu

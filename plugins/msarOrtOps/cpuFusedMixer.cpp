/*
 * FusedMixer on the CPU.  One work item is TILE tokens of one batch row; its data is visited chunk by
 * chunk (kChunk channels), so what one chunk's loops touch stays in L1 and each source's window and
 * taps are read from L2 or beyond once per pass and tile:
 *   0. every source's window for the tile (TILE + kmax - 1 rows, zeros before t = 0): float32 rows
 *      read where they are when the tile lies inside the sequence, else converted once into a
 *      chunk-major float32 copy; in-place rows lie d floats apart, so each pass copies a chunk's
 *      rows into a contiguous L1 buffer before its streams read them (chunkRows);
 *   1. per source, chunk and stream, the conv views of kRegs tokens in registers (taps and the
 *      window's rows each loaded once per kRegs tokens: the loops are unrolled for each kernel size)
 *      and their q . v and v . v -> scores;
 *   2. the max-subtracted softmax over the sources;
 *   3. per chunk: z of every token of the tile for that chunk in an L1 buffer, summed over the sources
 *      (the views recomputed: 24 FMAs per channel; a stored view buffer grows with n and was no
 *      faster, docs/ort_kernels.md), then the gate logits' partial sums; finally the gates and h.
 * Taps are converted once per call into [source][chunk][tap][kChunk], the order the loops read them.
 */
#include "cpuConvViews.h"
#include "cpuKernels.h"
#include "cpuVector.h"

#include <algorithm>
#include <limits>
#include <stdexcept>

namespace msar::cpu
{
namespace
{

constexpr int64_t kMaxStreams = 8;  // MSAR_MAX_STREAMS (common/msarKernelTypes.h)
using views::kChunk;
constexpr int64_t kRegs = 4;    // tokens whose views are in registers together (8 spill: 12 taps + 3 x 8 sums)
constexpr int64_t kTile = 32;   // tokens per work item: the taps and the window's halo read once for them

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
    std::vector<float> windows, scores, zchunk, z, h, stage;
    std::vector<Window> views;
    std::vector<vf> parts, logits;
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

//! Pass 1: the views' q . v and v . v, summed over the chunk in registers, into parts[t][r][2].
template <int64_t R>
struct ScoreSink
{
    float const* q;  // this stream's query, this chunk
    vf* parts;    // [TILE][m][2] for stream r: parts + (t * m + r) * 2
    int64_t m;
    vf dot[R] = {}, squares[R] = {};
    void begin(int64_t)
    {
        for (int64_t t = 0; t < R; ++t)
        {
            dot[t] = squares[t] = vf{};
        }
    }
    void take(int64_t, int64_t cc, vf const* acc)
    {
        vf const qv = vload(q + cc);
        for (int64_t t = 0; t < R; ++t)
        {
            dot[t] += qv * acc[t];
            squares[t] += acc[t] * acc[t];
        }
    }
    void end(int64_t s)
    {
        for (int64_t t = 0; t < R; ++t)
        {
            parts[((s + t) * m) * 2] += dot[t];
            parts[((s + t) * m) * 2 + 1] += squares[t];
        }
    }
};

//! Pass 3: z[t][r][chunk] += alpha[i][t][r] v, the chunk's z in L1.
template <int64_t R>
struct ZSink
{
    float const* alpha;  // alpha[i] + r: token t at alpha[t * m]
    float* z;            // zchunk + r * kChunk: token t at z + t * m * kChunk
    int64_t m;
    vf a[R] = {};
    void begin(int64_t s)
    {
        for (int64_t t = 0; t < R; ++t)
        {
            a[t] = vsplat(alpha[(s + t) * m]);
        }
    }
    void take(int64_t s, int64_t cc, vf const* acc)
    {
        for (int64_t t = 0; t < R; ++t)
        {
            float* zp = z + (s + t) * m * kChunk + cc;
            vstore(zp, vload(zp) + a[t] * acc[t]);
        }
    }
    void end(int64_t) {}
};

//! One chunk of source i's window as contiguous rows (row stride kChunk). In-place rows lie d floats
//! apart, so a chunk's rows fall into a few L1 sets and evict each other between streams; they are
//! copied once per pass into `stage`, which L1 holds.
inline float const* chunkRows(Window const& w, int64_t ch, int64_t rows, float* stage)
{
    float const* src = w.base + ch * w.chunk;
    if (w.row == kChunk)
    {
        return src;
    }
    for (int64_t u = 0; u < rows; ++u)
    {
        for (int64_t cc = 0; cc < kChunk; cc += kVW)
        {
            vstore(stage + u * kChunk + cc, vload(src + u * w.row + cc));
        }
    }
    return stage;
}

template <int64_t TILE>
void runTile(Prepared const& P, int64_t item)
{
    constexpr int64_t R = TILE < kRegs ? TILE : kRegs;
    FusedMixerProblem const& p = *P.p;
    int64_t const dp = P.dp, m = P.m, H = P.H, d = p.d, rows = TILE + H;
    int64_t const b = item / P.tiles, t0 = (item % P.tiles) * TILE, tn = std::min(TILE, p.T - t0);
    Scratch& s = tScratch;
    float* windows = sized(s.windows, p.n * rows * dp);
    float* scores = sized(s.scores, p.n * TILE * m);
    float* zchunk = sized(s.zchunk, TILE * m * kChunk);
    float* z = sized(s.z, TILE * m * dp);
    float* h = sized(s.h, dp);
    float* stage = sized(s.stage, rows * kChunk);
    vf* parts = sized(s.parts, TILE * m * 2);
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
        // pass 1
        std::fill_n(parts, TILE * m * 2, vf{});
        for (int64_t ch = 0; ch < P.chunks; ++ch)
        {
            float const* win = chunkRows(window[i], ch, rows, stage);
            float const* taps = P.taps.data() + (i * P.chunks + ch) * P.K * kChunk;
            for (int64_t r = 0; r < m; ++r)
            {
                int64_t const k = p.kernels[r];
                ScoreSink<R> sink{P.query.data() + r * dp + ch * kChunk, parts + r * 2, m};
                views::dispatchStream<TILE, R>(k, win + (H - (k - 1)) * kChunk, kChunk, taps + P.offsets[r] * kChunk,
                                               sink);
            }
        }
        for (int64_t tr = 0; tr < TILE * m; ++tr)
        {
            scores[i * TILE * m + tr] = score(hsum(parts[tr * 2]), hsum(parts[tr * 2 + 1]), d, p.eps);
        }
    }
    // pass 2: scores[i][t][r] -> alpha, max-subtracted softmax over i
    for (int64_t tr = 0; tr < TILE * m; ++tr)
    {
        float max = -std::numeric_limits<float>::infinity();
        for (int64_t i = 0; i < p.n; ++i)
        {
            max = std::max(max, scores[i * TILE * m + tr]);
        }
        float sum = 0.F;
        for (int64_t i = 0; i < p.n; ++i)
        {
            float& e = scores[i * TILE * m + tr];
            e = std::exp(e - max);
            sum += e;
        }
        float const inv = 1.F / sum;
        for (int64_t i = 0; i < p.n; ++i)
        {
            scores[i * TILE * m + tr] *= inv;
        }
    }
    // pass 3
    std::fill_n(logits, TILE * m, vf{});
    for (int64_t ch = 0; ch < P.chunks; ++ch)
    {
        std::fill_n(zchunk, TILE * m * kChunk, 0.F);
        for (int64_t i = 0; i < p.n; ++i)
        {
            float const* win = chunkRows(window[i], ch, rows, stage);
            float const* taps = P.taps.data() + (i * P.chunks + ch) * P.K * kChunk;
            for (int64_t r = 0; r < m; ++r)
            {
                int64_t const k = p.kernels[r];
                ZSink<R> sink{scores + i * TILE * m + r, zchunk + r * kChunk, m};
                views::dispatchStream<TILE, R>(k, win + (H - (k - 1)) * kChunk, kChunk, taps + P.offsets[r] * kChunk,
                                               sink);
            }
        }
        for (int64_t t = 0; t < tn; ++t)
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
    P.dp = (p.d + kChunk - 1) / kChunk * kChunk;
    P.chunks = P.dp / kChunk;
    StreamTaps const st = streamTaps(p.kernels);
    P.K = st.K;
    P.H = st.kmax - 1;
    std::copy_n(st.offsets, P.m, P.offsets);
    int64_t const dp = P.dp, d = p.d, m = P.m;
    P.query.assign(m * dp, 0.F);
    for (int64_t r = 0; r < m; ++r)
    {
        loadRow(P.query.data() + r * dp, p.query, r * d, d, dp, p.storage);
    }
    loadGate(p.gate_weight, p.gate_bias, p.gate_scale, m, d, dp, p.storage, P.gate, P.bias, &P.scale);
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

/*
 * The msar ops on the CPU, for ONNX Runtime (ortOps.cpp) - plain C++, no ORT
 * types, so the arithmetic can be read and tested on its own.
 *
 * Float32 inside whatever the storage type (MSAR_SPEC 1.2: norms, scores and
 * the softmax in float32); the softmax is max-subtracted, computed online over
 * the sources (flash-attention style), so a mixer with n sources never holds n
 * views at once.  Channels are padded to a whole number of SIMD vectors in the
 * scratch buffers (the pad is zero and never reaches an output).
 */
#ifndef MSAR_ORT_CPU_KERNELS_H
#define MSAR_ORT_CPU_KERNELS_H

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <vector>

namespace msar::cpu
{

enum class Storage
{
    kFloat32,
    kFloat16,
    kBFloat16,
};

//! Runs fn(data, i) for i in [0, total); ORT's intra-op pool in the library, a loop in tests.
//! batch: 0 lets the pool split the work, 1 runs it on the calling thread.
struct Parallel
{
    virtual ~Parallel() = default;
    virtual void run(std::size_t total, std::size_t batch, void (*fn)(void*, std::size_t), void* data) const = 0;
};

//! What stream_kernels (first is 1) make of a conv_weight row: K taps of streams 1..m-1 back to
//! back (stream r's first at offsets[r]), and kmax, the longest kernel (so kmax-1 rows of history).
struct StreamTaps
{
    int64_t K = 0, kmax = 1;
    int64_t offsets[8] = {};
};

//! stream_kernels checked (first 1, at most 8 streams, all positive) and laid out.
inline StreamTaps streamTaps(std::vector<int32_t> const& kernels)
{
    if (kernels.empty() || kernels.size() > 8 || kernels[0] != 1)
    {
        throw std::invalid_argument("stream_kernels must start with 1 and have at most 8 streams");
    }
    StreamTaps s;
    for (std::size_t r = 1; r < kernels.size(); ++r)
    {
        if (kernels[r] < 1)
        {
            throw std::invalid_argument("stream_kernels must be positive");
        }
        s.offsets[r] = s.K;
        s.K += kernels[r];
        s.kmax = kernels[r] > s.kmax ? kernels[r] : s.kmax;
    }
    return s;
}

//! FusedMixer (msar_export/contracts.py): one mixer from the raw sources.
struct FusedMixerProblem
{
    Storage storage;
    int64_t B, T, d, n;            // batch, tokens, width, sources
    std::vector<int32_t> kernels;  // stream_kernels, first is 1
    float eps;
    void const* query;        // [m, d]
    void const* gate_weight;  // [m, m*d]
    void const* gate_bias;    // [m]
    void const* gate_scale;   // []
    void const* conv_weight;  // [N >= n, K, d]: taps of stream r at rows offset_r .. offset_r + k_r - 1
    std::vector<void const*> sources;  // n x [B, T, d]
    void* h;                           // [B, T, d]
    //! ScoredMixer: the scores [n, B, T, m] (float32 whatever the storage) replace the scoring pass;
    //! query and eps are then unused.
    float const* scores = nullptr;
};

//! SourceScores (msar_export/contracts.py): one source's scores against every later mixer's queries.
struct SourceScoresProblem
{
    Storage storage;
    int64_t B, T, d, P;            // batch, tokens, width, later mixers
    std::vector<int32_t> kernels;  // stream_kernels, first is 1
    float eps;
    void const* conv_weight;  // [K, d]
    void const* queries;      // [P, m, d]
    void const* source;       // [B, T, d]
    float* scores;            // [P, B, T, m]
};

//! DepthRetrieval (msar_export/contracts.py): retrieval over already expanded views.
struct DepthRetrievalProblem
{
    Storage storage;
    int64_t B, T, m, d, n;
    float eps;
    void const* query;               // [m, d]
    std::vector<void const*> views;  // n x [B, T, m, d]
    void* z;                         // [B, T, m, d]
};

//! SourceViews (msar_export/contracts.py): the m views of one source after its history.
struct SourceViewsProblem
{
    Storage storage;
    int64_t B, T, d;
    std::vector<int32_t> kernels;  // stream_kernels, first is 1
    void const* conv_weight;       // [K, d]
    void const* history;           // [B, kmax-1, d]: the state's row for this source
    void const* source;            // [B, T, d]
    int64_t const* mask;           // [B, T]: zero marks a padded token, read as a zero row
    void* views;                   // [B, T, m, d]
};

//! ConvState (msar_export/contracts.py): per source, the last H = kmax-1 positions of [past[i]; x_i].
struct ConvStateProblem
{
    Storage storage;
    int64_t N, B, H, T, d;
    void const* past;                  // [N, B, H, d]
    int64_t const* mask;               // [B, T]: zero marks a padded token, kept as a zero row
    std::vector<void const*> sources;  // N x [B, T, d]
    void* present;                     // [N, B, H, d]
};

//! StreamGate (msar_export/contracts.py): mixer l's scalar stream fusion over its retrieved streams.
struct StreamGateProblem
{
    Storage storage;
    int64_t B, T, m, d;
    void const* gate_weight;  // [m, m*d]
    void const* gate_bias;    // [m]
    void const* gate_scale;   // []
    void const* z;            // [B, T, m, d]
    void* h;                  // [B, T, d]
};

void fusedMixer(FusedMixerProblem const& p, Parallel const& parallel);
void sourceScores(SourceScoresProblem const& p, Parallel const& parallel);
//! ScoredMixer: p.scores set, p.query unused.
void scoredMixer(FusedMixerProblem const& p, Parallel const& parallel);
void streamGate(StreamGateProblem const& p, Parallel const& parallel);
void sourceViews(SourceViewsProblem const& p, Parallel const& parallel);
void convState(ConvStateProblem const& p, Parallel const& parallel);
void depthRetrieval(DepthRetrievalProblem const& p, Parallel const& parallel);

} // namespace msar::cpu

#endif // MSAR_ORT_CPU_KERNELS_H

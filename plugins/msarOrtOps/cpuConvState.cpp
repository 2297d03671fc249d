/*
 * ConvState on the CPU: the decode graph's next convolution state, one node for every source at the
 * end of a step. Per (source, batch row) the last H positions of [past row; the source's T tokens]
 * are copied, bytes as they are (no arithmetic, so no float32 round trip); padded tokens become zeros.
 */
#include "cpuKernels.h"

#include <cstring>

namespace msar::cpu
{
namespace
{

void source(ConvStateProblem const& p, int64_t i)
{
    if (p.H == 0)
    {
        return;  // stream_kernels [1]: the state keeps no position, and an empty tensor's data may be null
    }
    std::size_t const elem = p.storage == Storage::kFloat32 ? 4 : 2;
    std::size_t const row = static_cast<std::size_t>(p.d) * elem;
    auto* out = static_cast<unsigned char*>(p.present);
    auto const* past = static_cast<unsigned char const*>(p.past);
    int64_t const fromPast = p.H > p.T ? p.H - p.T : 0;  // rows of the past that stay, the newest of them
    auto const* x = static_cast<unsigned char const*>(p.sources[i]);
    for (int64_t b = 0; b < p.B; ++b)
    {
        unsigned char* dst = out + static_cast<std::size_t>((i * p.B + b) * p.H) * row;
        std::memcpy(dst, past + static_cast<std::size_t>((i * p.B + b) * p.H + p.H - fromPast) * row, fromPast * row);
        int64_t const fromX = p.H - fromPast;  // the source's last fromX tokens
        for (int64_t t = p.T - fromX; t < p.T; ++t)
        {
            unsigned char* to = dst + (fromPast + t - (p.T - fromX)) * row;
            if (p.mask[b * p.T + t] == 0)
            {
                std::memset(to, 0, row);  // a padded token: a zero row (all-zero bits are +0 in every storage)
            }
            else
            {
                std::memcpy(to, x + static_cast<std::size_t>(b * p.T + t) * row, row);
            }
        }
    }
}

} // namespace

void convState(ConvStateProblem const& p, Parallel const& parallel)
{
    // Work item: one source's rows of every batch row. A batch-8 step's state is a few MB, cold from
    // DRAM: two threads read it faster than one; a batch-1 step's is small enough for one.
    std::size_t const elem = p.storage == Storage::kFloat32 ? 4 : 2;
    std::size_t const batch = p.N * p.B * p.H * p.d * static_cast<int64_t>(elem) <= (int64_t{1} << 20) ? 1 : 0;
    parallel.run(static_cast<std::size_t>(p.N), batch,
                 [](void* data, std::size_t item) { source(*static_cast<ConvStateProblem const*>(data), static_cast<int64_t>(item)); },
                 const_cast<ConvStateProblem*>(&p));
}

} // namespace msar::cpu

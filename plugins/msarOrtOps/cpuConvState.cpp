/*
 * ConvState on the CPU: the decode graph's next convolution state, one node for every source at the
 * end of a step. Per (source, batch row) the last H positions of [past row; the source's T tokens]
 * are copied, bytes as they are (no arithmetic, so no float32 round trip). One thread: a batch-8
 * step's state is a few MB of copies, less than the pool's round trip would save.
 */
#include "cpuKernels.h"

#include <cstring>

namespace msar::cpu
{

void convState(ConvStateProblem const& p)
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
    for (int64_t i = 0; i < p.N; ++i)
    {
        auto const* x = static_cast<unsigned char const*>(p.sources[i]);
        for (int64_t b = 0; b < p.B; ++b)
        {
            unsigned char* dst = out + static_cast<std::size_t>((i * p.B + b) * p.H) * row;
            std::memcpy(dst, past + static_cast<std::size_t>((i * p.B + b) * p.H + p.H - fromPast) * row, fromPast * row);
            int64_t const fromX = p.H - fromPast;  // the source's last fromX tokens
            std::memcpy(dst + fromPast * row, x + static_cast<std::size_t>(b * p.T + p.T - fromX) * row, fromX * row);
        }
    }
}

} // namespace msar::cpu

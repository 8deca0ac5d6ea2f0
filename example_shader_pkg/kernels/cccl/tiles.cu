// tiles.cu -- cooperative-groups tiles (nvidia-cuda-runtime headers).
#include "khal.h"
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>

namespace cg = cooperative_groups;

// out[t] = max(x[32 t .. 32 t + 31]) for every warp-sized tile t of x that has
// elements; reduced with cg::reduce over a 32-thread tiled_partition.
KHAL_ENTRY(tile_max, 256, (KHAL_STORAGE(const float, x), KHAL_STORAGE(float, out)))
{
    const cg::thread_block_tile<32> tile = cg::tiled_partition<32>(cg::this_thread_block());
    const uint64_t i = KHAL_GLOBAL_ID;
    const float v = i < x.len ? x[i] : -__int_as_float(0x7f800000);  // -inf pads a partial tile
    const float m = cg::reduce(tile, v, cg::greater<float>());
    const uint64_t t = i / 32;
    if (tile.thread_rank() == 0 && t * 32 < x.len && t < out.len) out[t] = m;
}

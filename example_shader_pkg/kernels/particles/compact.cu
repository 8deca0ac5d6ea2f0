// compact.cu -- device-side counts of alive particles, for indirect dispatch.
#include "khal.h"
#include "particles.cuh"

// count += number of alive particles among the first params.n (zero `count`
// first). One atomicAdd per block after a shuffle/shared-memory reduction.
KHAL_ENTRY(count_active, 128, (KHAL_STORAGE(const Particle, particles),
                               KHAL_UNIFORM(SimParams, params),
                               KHAL_STORAGE_VALUE(uint32_t, count)))
{
    const example::u64 n = example::particle_count(params, particles.len);
    const example::u64 stride = KHAL_NUM_GROUPS * example::kParticleBlock;
    unsigned alive = 0;
    for (example::u64 i = KHAL_GLOBAL_ID; i < n; i += stride) {
        alive += __ldg(&particles[i].life) > 0.0f ? 1u : 0u;
    }
    const unsigned block_alive = example::block_reduce_sum<example::kParticleBlock>(alive);
    if (KHAL_LOCAL_ID == 0 && block_alive != 0) atomicAdd(&count, block_alive);
}

// Stream compaction: the index of every alive particle is appended to
// alive_indices, alive_count being the atomic cursor (zero it first; it ends
// as the number of alive particles even if alive_indices is too short, in
// which case the surplus indices are dropped). Order follows atomic arrival
// across warps and index order within a warp.
KHAL_ENTRY(compact_alive, 128, (KHAL_STORAGE(const Particle, particles),
                                KHAL_UNIFORM(SimParams, params),
                                KHAL_STORAGE(uint32_t, alive_indices),
                                KHAL_STORAGE_VALUE(uint32_t, alive_count)))
{
    const example::u64 n = example::particle_count(params, particles.len);
    const example::u64 stride = KHAL_NUM_GROUPS * example::kParticleBlock;
    // Warp-uniform trip count (consecutive ids per warp) for warp_append.
    for (example::u64 i = KHAL_GLOBAL_ID; __any_sync(example::kFullMask, i < n); i += stride) {
        const bool alive = i < n && __ldg(&particles[i].life) > 0.0f;
        const unsigned slot = example::warp_append(&alive_count, alive);
        if (alive && slot < alive_indices.len) alive_indices[slot] = static_cast<uint32_t>(i);
    }
}

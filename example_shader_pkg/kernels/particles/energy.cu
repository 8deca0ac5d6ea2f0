// energy.cu -- work over the compacted alive list; its size lives on the device.
#include "khal.h"
#include "particles.cuh"

// energy += sum over alive_indices[0 .. alive_count) of 0.5 m |v|^2 (zero
// `energy` first). Meant for indirect dispatch with alive_count threads, but
// it reads the count itself, so any launch size is correct.
KHAL_ENTRY(kinetic_energy, 128, (KHAL_STORAGE(const Particle, particles),
                                 KHAL_STORAGE(const uint32_t, alive_indices),
                                 KHAL_STORAGE_VALUE(const uint32_t, alive_count),
                                 KHAL_STORAGE_VALUE(float, energy)))
{
    const example::u64 listed = alive_count;
    const example::u64 n = listed < alive_indices.len ? listed : alive_indices.len;
    const example::u64 stride = KHAL_NUM_GROUPS * example::kParticleBlock;
    float acc = 0.0f;
    for (example::u64 i = KHAL_GLOBAL_ID; i < n; i += stride) {
        const uint32_t idx = __ldg(&alive_indices[i]);
        if (idx >= particles.len) continue;
        const Particle& p = particles[idx];
        const float v2 = p.vx * p.vx + p.vy * p.vy + p.vz * p.vz;
        acc += 0.5f * p.mass * v2;
    }
    const float block_energy = example::block_reduce_sum<example::kParticleBlock>(acc);
    if (KHAL_LOCAL_ID == 0 && block_energy != 0.0f) atomicAdd(&energy, block_energy);
}

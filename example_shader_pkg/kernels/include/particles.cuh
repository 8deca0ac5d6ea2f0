// particles.cuh -- the particle record and helpers of the particles crate.
#ifndef EXAMPLE_PARTICLES_CUH
#define EXAMPLE_PARTICLES_CUH

#include "khal.h"
#include "params.cuh"
#include "common.cuh"

// 32 bytes, two 16-byte halves. Mirrored by example_shader_pkg.Particle and
// example_shader_pkg.PARTICLE_DTYPE.
struct Particle {
    float px, py, pz;  // position
    float life;        // seconds left; a particle is alive while life > 0
    float vx, vy, vz;  // velocity
    float mass;
};

namespace example {

enum : unsigned { kParticleBlock = 128 };  // block size of every particles entry

__device__ __forceinline__ bool is_alive(const Particle& p) { return p.life > 0.0f; }

// Particles the step covers: the uniform's n, clamped to the storage.
__device__ __forceinline__ u64 particle_count(const SimParams& params, u64 len) {
    const u64 n = params.n;
    return n < len ? n : len;
}

}  // namespace example

#endif  // EXAMPLE_PARTICLES_CUH

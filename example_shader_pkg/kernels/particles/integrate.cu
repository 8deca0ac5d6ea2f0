// integrate.cu -- the motion half of a particle step.
//
// Arithmetic is written with __fmul_rn/__fadd_rn so the compiler does not fuse
// it into FMAs: the step then matches a float32 NumPy reference bit for bit.
#include "khal.h"
#include "particles.cuh"

// Semi-implicit Euler for alive particles (life > 0):
//   vy += gravity * dt;  p += v * dt;  life -= dt
// over the first min(params.n, len(particles)) particles.
KHAL_ENTRY(integrate, 128, (KHAL_STORAGE(Particle, particles), KHAL_UNIFORM(SimParams, params)))
{
    const example::u64 n = example::particle_count(params, particles.len);
    const example::u64 stride = KHAL_NUM_GROUPS * example::kParticleBlock;
    const float dt = params.dt;
    const float dv = __fmul_rn(params.gravity, dt);
    for (example::u64 i = KHAL_GLOBAL_ID; i < n; i += stride) {
        Particle p = particles[i];
        if (!example::is_alive(p)) continue;
        p.vy = __fadd_rn(p.vy, dv);
        p.px = __fadd_rn(p.px, __fmul_rn(p.vx, dt));
        p.py = __fadd_rn(p.py, __fmul_rn(p.vy, dt));
        p.pz = __fadd_rn(p.pz, __fmul_rn(p.vz, dt));
        p.life = __fsub_rn(p.life, dt);
        particles[i] = p;
    }
}

// Ground plane y = 0: an alive particle below it is reflected back above it
// and its downward velocity is reversed, both scaled by the restitution.
KHAL_ENTRY(collide_ground, 128, (KHAL_STORAGE(Particle, particles), KHAL_UNIFORM(SimParams, params)))
{
    const example::u64 n = example::particle_count(params, particles.len);
    const example::u64 stride = KHAL_NUM_GROUPS * example::kParticleBlock;
    const float e = params.restitution;
    for (example::u64 i = KHAL_GLOBAL_ID; i < n; i += stride) {
        Particle& p = particles[i];
        if (!example::is_alive(p) || !(p.py < 0.0f)) continue;
        p.py = __fmul_rn(-p.py, e);
        if (p.vy < 0.0f) p.vy = __fmul_rn(-p.vy, e);
    }
}

// params.cuh -- uniform structs of the example crates.
//
// Uniforms are plain structs in the global namespace (the generated kernels
// name them unqualified). The Python package mirrors each one field for field
// as a ctypes.Structure (example_shader_pkg/structs.py): keep the two in step.
#ifndef EXAMPLE_PARAMS_CUH
#define EXAMPLE_PARAMS_CUH

#include "khal.h"

// saxpy: y = a * x + y
struct SaxpyParams {
    float a;
};

// particles crate: one simulation step.
struct SimParams {
    float dt;           // time step (s)
    float gravity;      // acceleration along y (m/s^2), e.g. -9.81
    float restitution;  // velocity kept on a ground bounce, 0..1
    uint32_t n;         // live prefix of the particle storage to process
};

#endif  // EXAMPLE_PARAMS_CUH

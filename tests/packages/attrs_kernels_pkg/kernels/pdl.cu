// A dependent pair with programmatic dependent launch: the producer signals early
// (griddepcontrol.launch_dependents, cudaTriggerProgrammaticLaunchCompletion), the consumer (KHAL_PDL)
// may start while the producer finishes and waits for its results in
// cudaGridDependencySynchronize (griddepcontrol.wait) before reading them. Written as inline PTX
// (sm_90), which needs no runtime header.
#include "khal.h"

KHAL_ENTRY(pdl_producer, 256, (KHAL_STORAGE(const float, x), KHAL_STORAGE(float, y), KHAL_SCALAR(unsigned int, n)),
           KHAL_PDL)
{
    const unsigned long long i = KHAL_GLOBAL_ID;
    asm volatile("griddepcontrol.wait;" ::: "memory");  // the previous kernel's writes (PDL)
    if (i < n) y[i] = x[i] * 2.0f + 1.0f;
    asm volatile("griddepcontrol.launch_dependents;");
}

KHAL_ENTRY(pdl_consumer, 256, (KHAL_STORAGE(const float, y), KHAL_STORAGE(float, z), KHAL_SCALAR(unsigned int, n)),
           KHAL_PDL)
{
    const unsigned long long i = KHAL_GLOBAL_ID;
    asm volatile("griddepcontrol.wait;" ::: "memory");  // cudaGridDependencySynchronize()
    if (i < n) z[i] = y[i] * y[i];
    asm volatile("griddepcontrol.launch_dependents;");
}

// the same pair without PDL, for the benchmark
KHAL_ENTRY(plain_producer, 256, (KHAL_STORAGE(const float, x), KHAL_STORAGE(float, y), KHAL_SCALAR(unsigned int, n)))
{
    const unsigned long long i = KHAL_GLOBAL_ID;
    if (i < n) y[i] = x[i] * 2.0f + 1.0f;
}

KHAL_ENTRY(plain_consumer, 256, (KHAL_STORAGE(const float, y), KHAL_STORAGE(float, z), KHAL_SCALAR(unsigned int, n)))
{
    const unsigned long long i = KHAL_GLOBAL_ID;
    if (i < n) z[i] = y[i] * y[i];
}

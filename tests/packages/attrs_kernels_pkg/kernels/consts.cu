// Module globals the host fills and resets: a __constant__ lookup table and a __device__ counter.
#include "khal.h"

__constant__ float khal_free_table_lut[256];  // (a name holding "khal" is hatch-khal's own: not listed)
__constant__ float lut[256];
__device__ unsigned int hits;

// out[i] = lut[idx[i] & 255]; counts the lookups of entry 0 in `hits`
KHAL_ENTRY(table_lookup, 256, (KHAL_STORAGE(const unsigned int, idx), KHAL_STORAGE(float, out),
                               KHAL_SCALAR(unsigned int, n)))
{
    const unsigned long long i = KHAL_GLOBAL_ID;
    if (i < n) {
        const unsigned int j = idx[i] & 255u;
        out[i] = lut[j];
        if (j == 0) atomicAdd(&hits, 1u);
    }
}

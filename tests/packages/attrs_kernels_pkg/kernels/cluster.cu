// Thread-block clusters and distributed shared memory (sm_90): clusters of 2 blocks; each block
// writes its 128 inputs to its own shared memory, the cluster syncs, and each block reads its
// partner's shared memory (cluster.map_shared_rank) to write out[i] = x[i] + x[partner's i].
#include "khal.h"
#include <cooperative_groups.h>

namespace cg = cooperative_groups;

// The pair sum of one block of 128 threads in a cluster of 2 (both entries below run it).
__device__ void pair_sum(::khal::Storage<const float> x, ::khal::Storage<float> out)
{
    __shared__ float s[128];
    cg::cluster_group cluster = cg::this_cluster();
    const unsigned rank = cluster.block_rank();
    const unsigned long long i = (unsigned long long)blockIdx.x * 128 + threadIdx.x;
    s[threadIdx.x] = x[i];
    cluster.sync();
    const float* other = cluster.map_shared_rank(s, rank ^ 1u);
    out[i] = s[threadIdx.x] + other[threadIdx.x];
    cluster.sync();  // the partner's shared memory must outlive its readers
}

KHAL_ENTRY(cluster_pair_sum, 128, (KHAL_STORAGE(const float, x), KHAL_STORAGE(float, out)), KHAL_CLUSTER(2, 1, 1))
{
    pair_sum(x, out);
}

// The same pair sum, its clusters spread over the GPU's processor clusters (the policy Triton's
// launcher asks for: CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE = SPREAD).
KHAL_ENTRY(cluster_pair_sum_spread, 128, (KHAL_STORAGE(const float, x), KHAL_STORAGE(float, out)),
           KHAL_CLUSTER(2, 1, 1), KHAL_CLUSTER_SCHEDULING(spread))
{
    pair_sum(x, out);
}

// The same pair sum, compiled without __cluster_dims__: the cluster is chosen at launch
// (kernels.cluster_pair_sum_at_launch.launch(grid, None, x, out, cluster=2)).
KHAL_ENTRY(cluster_pair_sum_at_launch, 128, (KHAL_STORAGE(const float, x), KHAL_STORAGE(float, out)))
{
    pair_sum(x, out);
}

// Each block writes its rank in its cluster and the cluster's size (what the launch gave it).
KHAL_ENTRY(cluster_shape, 32, (KHAL_STORAGE(unsigned, out)))
{
    cg::cluster_group cluster = cg::this_cluster();
    if (threadIdx.x == 0) {
        out[2 * blockIdx.x] = cluster.block_rank();
        out[2 * blockIdx.x + 1] = cluster.num_blocks();
    }
}

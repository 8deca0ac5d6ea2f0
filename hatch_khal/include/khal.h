// khal.h -- entry-point markers and binding types for hatch-khal kernel crates.
//
// Shipped with hatch_khal and put on the NVRTC include path of every crate.
// An entry point is written as
//
//   KHAL_ENTRY(saxpy, 256, (KHAL_STORAGE(const float, x),
//                           KHAL_STORAGE(float, y),
//                           KHAL_UNIFORM(SaxpyParams, params)))
//   {
//       uint64_t i = KHAL_GLOBAL_ID;
//       if (i < y.len) y[i] = params.a * x[i] + y[i];
//   }
//
// The hook reads the marker with a small grammar (see hatch_khal/entries.py)
// and generates, per entry, an extern "C" __global__ kernel named
// <entry>_khal_<hash> that receives the khal ABI:
//   storage  -> (T* ptr, uint64_t count)   (slices, fixed arrays, single values)
//   uniform  -> (const T* ptr)
//   scalar   -> T by value, exact C width
// and calls the function defined here.
#ifndef KHAL_H
#define KHAL_H

#define KHAL_ABI_VERSION 1

#ifndef KHAL_NO_STDINT
// NVRTC ships no <stdint.h>; these are exactly CCCL's definitions under NVRTC
// (<cuda/std/cstdint>), so including CCCL or the CUDA headers later redeclares
// the very same types. Define KHAL_NO_STDINT to provide your own.
typedef signed char int8_t;
typedef signed short int16_t;
typedef signed int int32_t;
typedef signed long long int64_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
#endif

namespace khal {

typedef unsigned long long u64;

// What the generated kernel tells the entry about the current thread. In a
// direct dispatch group_id == blockIdx.x; in an indirect (persistent-grid)
// dispatch the generated kernel loops over groups and sets it per iteration.
struct Invocation {
    u64 global_id;   // group_id * block_size + local_id
    u64 group_id;
    u64 num_groups;
    unsigned local_id;
};

// A storage binding: a device pointer and an element count (never a byte length).
template <typename T>
struct Storage {
    T* ptr;
    u64 len;
    __device__ __forceinline__ T& operator[](u64 i) const { return ptr[i]; }
    __device__ __forceinline__ u64 size() const { return len; }
    __device__ __forceinline__ T* data() const { return ptr; }
};

}  // namespace khal

#define KHAL_UNPAREN_(...) __VA_ARGS__
#define KHAL_UNPAREN(args) KHAL_UNPAREN_ args

// Under the hook, every entry must be one the hook's scanner read (it declares
// khal_scanned_entry_<name> for those): a KHAL_ENTRY made by a macro is an error here.
#ifdef KHAL_SCANNED
#define KHAL_CHECK_SCANNED_(name) static_assert(khal_scanned_entry_##name, "KHAL_ENTRY hidden from hatch-khal");
#else
#define KHAL_CHECK_SCANNED_(name)
#endif

// Entry marker: KHAL_ENTRY(name, block_size, (params...)) { body }
#define KHAL_ENTRY(name, block_size, params) \
    KHAL_CHECK_SCANNED_(name) \
    __device__ __forceinline__ void khal_entry_##name( \
        const ::khal::Invocation khal_invocation, KHAL_UNPAREN(params))

// Parameter markers (usable only inside KHAL_ENTRY's parameter list).
#define KHAL_STORAGE(T, name) ::khal::Storage<T> name
#define KHAL_STORAGE_ARRAY(T, N, name) T (&name)[N]
#define KHAL_STORAGE_VALUE(T, name) T& name
#define KHAL_UNIFORM(T, name) const T& name
#define KHAL_SCALAR(T, name) T name

// Thread indexing inside an entry body.
#define KHAL_GLOBAL_ID (khal_invocation.global_id)
#define KHAL_LOCAL_ID (khal_invocation.local_id)
#define KHAL_GROUP_ID (khal_invocation.group_id)
#define KHAL_NUM_GROUPS (khal_invocation.num_groups)

#endif  // KHAL_H

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
// or, templated, once for several element types:
//
//   template <typename T>
//   KHAL_ENTRY(scale, 256, (KHAL_STORAGE(T, x), KHAL_SCALAR(T, a))) { ... }
//   KHAL_INSTANTIATE(scale, scale_f32, float)
//   KHAL_INSTANTIATE(scale, scale_f64, double)
//
// The hook reads the markers with a small grammar (see hatch_khal/entries.py)
// and generates, per entry, an extern "C" __global__ kernel named
// <entry>_khal_<hash> that receives the khal ABI:
//   storage  -> (T* ptr, uint64_t count)   (slices, fixed arrays, single values)
//   uniform  -> (const T* ptr)
//   scalar   -> T by value, exact C width
// and calls the function defined here. Parameter types are taken from that
// function's own type (khal::entry_sig), and what each element type is (its size,
// alignment, and which scalar of the ABI it is, if any: khal::type_id) is compiled
// into probe globals the hook reads back from the binary: the compiler resolves
// typedefs, macros, `long`, `unsigned int`, templates; the hook never guesses.
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

// What the generated kernel tells the entry about the current thread, per axis. In a
// direct dispatch group_id == blockIdx.x; in an indirect (persistent-grid) dispatch the
// generated kernel loops over groups and sets it per iteration.
struct Invocation {
    u64 global_id;   // group_id * block_size + local_id (x)
    u64 group_id;
    u64 num_groups;
    unsigned local_id;
    unsigned local_id_y, local_id_z;
    u64 global_id_y, global_id_z;
    u64 group_id_y, group_id_z;
    u64 num_groups_y, num_groups_z;
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

// -- type traits for the generated code (no standard library under NVRTC) ----------------
template <typename T> struct remove_cv { typedef T type; };
template <typename T> struct remove_cv<const T> { typedef T type; };
template <typename T> struct remove_cv<volatile T> { typedef T type; };
template <typename T> struct remove_cv<const volatile T> { typedef T type; };
template <typename...> struct void_t_ { typedef void type; };
template <typename T> __device__ T&& declval_() noexcept;
template <typename A, typename B> struct same_ { enum { value = 0 }; };
template <typename A> struct same_<A, A> { enum { value = 1 }; };

// An entry parameter's element type, cv-qualifiers kept (the kernel's pointer type).
template <typename P> struct element { typedef P type; };                    // scalar: T
template <typename T> struct element<Storage<T> > { typedef T type; };       // slice
template <typename T, unsigned long long N> struct element<T (&)[N]> { typedef T type; };  // fixed array
template <typename T> struct element<T&> { typedef T type; };                // single value, uniform
template <typename P> using element_t = typename element<P>::type;
template <typename P> using value_t = typename remove_cv<element_t<P> >::type;

// The parameter types of an entry function (after Invocation, blockIdx, gridDim).
template <unsigned I, typename... A> struct type_at_;
template <typename H, typename... A> struct type_at_<0, H, A...> { typedef H type; };
template <unsigned I, typename H, typename... A> struct type_at_<I, H, A...> : type_at_<I - 1, A...> {};
template <typename F> struct entry_sig;
template <typename... A> struct entry_sig<void (*)(A...)> {
    template <unsigned I> using arg = typename type_at_<I + 3, A...>::type;
};

// A fixed-array binding rebuilt from the ABI's (pointer, count).
template <typename P> struct array_ref;
template <typename T, unsigned long long N> struct array_ref<T (&)[N]> {
    static __device__ __forceinline__ T (&from(T* p))[N] { return *reinterpret_cast<T(*)[N]>(p); }
};

// What a type is, as the compiler sees it: kind << 8 | sizeof. Kinds: 0 not a scalar (a
// struct), 1 signed integer, 2 unsigned integer, 3 float, 4 bool, 5 complex, 6 bfloat.
// khal_runtime.abi.type_id / type_id_scalar read it back. (Enumerators, not static members:
// nothing of these traits is emitted into the binary but the probes.)
template <typename T, typename = void> struct type_id_ { enum : u64 { value = 0 }; };
#define KHAL_TYPE_ID_(T, kind) \
    template <> struct type_id_<T, void> { enum : u64 { value = ((u64)(kind) << 8) | sizeof(T) }; };
#define KHAL_INT_ID_(T) KHAL_TYPE_ID_(T, ((T)-1 < (T)0) ? 1 : 2)
KHAL_INT_ID_(char) KHAL_INT_ID_(signed char) KHAL_INT_ID_(unsigned char)
KHAL_INT_ID_(short) KHAL_INT_ID_(unsigned short) KHAL_INT_ID_(int) KHAL_INT_ID_(unsigned int)
KHAL_INT_ID_(long) KHAL_INT_ID_(unsigned long) KHAL_INT_ID_(long long) KHAL_INT_ID_(unsigned long long)
KHAL_INT_ID_(wchar_t) KHAL_INT_ID_(char16_t) KHAL_INT_ID_(char32_t)
KHAL_TYPE_ID_(float, 3) KHAL_TYPE_ID_(double, 3) KHAL_TYPE_ID_(long double, 3) KHAL_TYPE_ID_(bool, 4)
#undef KHAL_INT_ID_
// complex: a class with value_type float or double, real() and imag(), two values in size
// (cuda::std::complex, thrust::complex, std::complex all are)
template <typename T> struct complex_id_ {
    typedef typename T::value_type V;
    enum : u64 { value = ((same_<V, float>::value || same_<V, double>::value) && sizeof(T) == 2 * sizeof(V))
                         ? ((u64)5 << 8 | sizeof(T)) : 0 };
};
template <typename T>
struct type_id_<T, typename void_t_<typename T::value_type, decltype(declval_<const T&>().real()),
                                    decltype(declval_<const T&>().imag())>::type> : complex_id_<T> {};
// an enum is its underlying integer
template <typename T, bool = __is_enum(T)> struct enum_id_ { enum : u64 { value = type_id_<T>::value }; };
template <typename T> struct enum_id_<T, true> { enum : u64 { value = type_id_<__underlying_type(T)>::value }; };
template <typename T> struct type_id { enum : u64 { value = enum_id_<typename remove_cv<T>::type>::value }; };

}  // namespace khal

#define KHAL_UNPAREN_(...) __VA_ARGS__
#define KHAL_UNPAREN(args) KHAL_UNPAREN_ args

// Under the hook, every entry must be one the hook's scanner read (it declares
// khal_scanned_entry_<name> for those): a KHAL_ENTRY made by a macro is an error here.
// The check sits in the return type, so that `template <...> KHAL_ENTRY(...)` is one
// declaration.
namespace khal { template <bool> struct scanned_ { typedef void type; }; }
#ifdef KHAL_SCANNED
#define KHAL_RETURN_(name) ::khal::scanned_<khal_scanned_entry_##name>::type
#define KHAL_CHECK_INSTANCE_(name) static_assert(khal_scanned_entry_##name, "KHAL_INSTANTIATE hidden from hatch-khal");
#else
#define KHAL_RETURN_(name) void
#define KHAL_CHECK_INSTANCE_(name)
#endif

// Entry marker: KHAL_ENTRY(name, block_size, (params...) [, option...]) { body }
// block_size: 256, (16, 16) or (8, 8, 4). Options, any order, each once (read by the hook, not
// the compiler): KHAL_LAUNCH_BOUNDS(n | none); and the launch attributes, set once per function
// at load: KHAL_SHARED_MEM(bytes) (dynamic shared memory, above 48 KB too; the typed call launches
// with it), KHAL_COOPERATIVE (a co-resident grid: grid.sync()), KHAL_CLUSTER(x[, y[, z]])
// (compiled in as __cluster_dims__, sm_90+), KHAL_PDL (programmatic dependent launch). Inside the body, `blockIdx` and `gridDim` are
// parameters: the indirect (persistent-grid) variant passes the group it runs, so bodies
// that read them directly stay correct there.
#define KHAL_ENTRY(name, block_size, params, ...) \
    __device__ __forceinline__ KHAL_RETURN_(name) khal_entry_##name( \
        const ::khal::Invocation khal_invocation, const uint3 blockIdx, const dim3 gridDim, KHAL_UNPAREN(params))

// KHAL_INSTANTIATE(template_entry, entry_name, template arguments...): one entry per line.
#define KHAL_INSTANTIATE(template_name, name, ...) KHAL_CHECK_INSTANCE_(name)

// Parameter markers (usable only inside KHAL_ENTRY's parameter list). Under the hook, the
// generated unit defines them from khal_runtime.abi.KINDS before including this header;
// these copies serve editors and compiles outside the hook (tests/test_kinds.py checks that
// they agree with the table).
#ifndef KHAL_SCANNED
#define KHAL_STORAGE(T, name) ::khal::Storage<T> name
#define KHAL_STORAGE_ARRAY(T, N, name) T (&name)[N]
#define KHAL_STORAGE_VALUE(T, name) T& name
#define KHAL_UNIFORM(T, name) const T& name
#define KHAL_SCALAR(T, name) T name
#endif

// KHAL_FIXED_BLOCK(): a statement for an entry body (or a function it calls) whose code assumes the
// compiled block size without the id macros below folding it in, e.g. cub::BlockRadixSort<T, 128>,
// a constexpr tile of the block's size, or group ids multiplied by a constant: an explicit launch()
// must then use the compiled block. It leaves a tagged comment in the PTX (no instruction), which
// the build reads as it reads the fold of KHAL_GLOBAL_ID (khal_runtime.binaries.ptx_kernel_reads).
#define KHAL_FIXED_BLOCK() asm volatile("// khal:fold.x")

// Thread indexing inside an entry body (the unsuffixed ones are x).
#define KHAL_GLOBAL_ID (khal_invocation.global_id)
#define KHAL_LOCAL_ID (khal_invocation.local_id)
#define KHAL_GROUP_ID (khal_invocation.group_id)
#define KHAL_NUM_GROUPS (khal_invocation.num_groups)
#define KHAL_GLOBAL_ID_X (khal_invocation.global_id)
#define KHAL_LOCAL_ID_X (khal_invocation.local_id)
#define KHAL_GROUP_ID_X (khal_invocation.group_id)
#define KHAL_NUM_GROUPS_X (khal_invocation.num_groups)
#define KHAL_GLOBAL_ID_Y (khal_invocation.global_id_y)
#define KHAL_LOCAL_ID_Y (khal_invocation.local_id_y)
#define KHAL_GROUP_ID_Y (khal_invocation.group_id_y)
#define KHAL_NUM_GROUPS_Y (khal_invocation.num_groups_y)
#define KHAL_GLOBAL_ID_Z (khal_invocation.global_id_z)
#define KHAL_LOCAL_ID_Z (khal_invocation.local_id_z)
#define KHAL_GROUP_ID_Z (khal_invocation.group_id_z)
#define KHAL_NUM_GROUPS_Z (khal_invocation.num_groups_z)

#endif  // KHAL_H

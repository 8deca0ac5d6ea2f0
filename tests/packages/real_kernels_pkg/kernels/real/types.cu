// Element types spelled as real kernels spell them: typedefs, macros, `long`, multi-word
// builtins, a TYPE_NAME from the crate's defines. The compiler says what each one is.
typedef float real_t;
typedef unsigned int uint_t;
#define INDEX_T long long

KHAL_ENTRY(spellings, 256, (KHAL_STORAGE(const real_t __restrict__, r), KHAL_STORAGE(long, l),
                            KHAL_STORAGE(unsigned int, u), KHAL_STORAGE(INDEX_T, ll),
                            KHAL_STORAGE(signed char, sc), KHAL_STORAGE(long int, li),
                            KHAL_STORAGE(TYPE_NAME, tn), KHAL_SCALAR(uint_t, k), KHAL_SCALAR(long, offset)))
{
    uint64_t i = KHAL_GLOBAL_ID;
    if (i < r.len) {
        l[i] = (long)(r[i] * 2) + offset;
        u[i] = (unsigned)i * k;
        ll[i] = -(INDEX_T)i * 1000000000LL;
        sc[i] = (signed char)((int)(i % 100) - 50);
        li[i] = (long int)i * 3;
        tn[i] = (TYPE_NAME)r[i] / 4;
    }
}

// A struct element (16 bytes): arrays of a structured dtype of that size
struct Particle { float x, y; int id, pad; };
KHAL_ENTRY(move, 128, (KHAL_STORAGE(Particle, p), KHAL_SCALAR(float, dx)))
{
    uint64_t i = KHAL_GLOBAL_ID;
    if (i < p.len) { p[i].x += dx; p[i].id += 1; }
}

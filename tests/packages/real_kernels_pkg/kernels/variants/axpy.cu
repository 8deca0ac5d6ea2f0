// One source, several crates: TYPE_NAME and USE_FAST_PATH come from each crate's defines.
KHAL_ENTRY(axpy, 256, (KHAL_STORAGE(const TYPE_NAME, x), KHAL_STORAGE(TYPE_NAME, y), KHAL_SCALAR(TYPE_NAME, a)))
{
    uint64_t i = KHAL_GLOBAL_ID;
    if (i < y.len) y[i] = a * x[i] + y[i];
}

// The same entry in both branches of an #if: the crate's defines pick one.
#if USE_FAST_PATH
KHAL_ENTRY(path, 32, (KHAL_STORAGE(int, which))) { if (KHAL_GLOBAL_ID == 0) which[0] = 1; }
#else
KHAL_ENTRY(path, 32, (KHAL_STORAGE(int, which))) { if (KHAL_GLOBAL_ID == 0) which[0] = 2; }
#endif

#if 0
KHAL_ENTRY(retired, 32, (KHAL_STORAGE(NoSuchType, x))) { }
#endif

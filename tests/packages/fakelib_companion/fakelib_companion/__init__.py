"""A companion of fakelib-triton: its kernels precompiled (tests/packages/fakelib_companion)."""

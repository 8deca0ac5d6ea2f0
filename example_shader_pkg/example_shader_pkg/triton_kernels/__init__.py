"""The example's Triton kernels (crate ``tutorials``): :mod:`.tutorials`, Triton's tutorial kernels
01-03 as written for Triton's JIT. Launch them as Triton code does (``add_kernel[grid](...)``, see
:mod:`example_shader_pkg.tutorials`): once ``example_shader_pkg`` is imported, the kernels are the
wheel's, precompiled; Triton's compiler is never called."""

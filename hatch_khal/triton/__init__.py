"""Triton crates: ``.py`` sources with ``@triton.jit`` kernels, instances declared in the crate
(:mod:`hatch_khal.triton.instances`), compiled at build time by Triton in a worker process
(:mod:`hatch_khal.triton.worker`) into the crate's PTX and cubins (:mod:`hatch_khal.triton.language`).
No Triton at run time: the entries launch through khal's CUDA path (:mod:`khal_runtime.triton`)."""

#: the Triton a Triton crate is built with (added to an isolated build's requirements; recorded in
#: the manifest's toolchain)
TRITON_VERSION = "3.6.0"
TRITON_REQUIREMENT = f"triton=={TRITON_VERSION}"

"""hatch-khal: compile kernel crates to PTX and cubins (and, for Slang crates, WGSL and SPIR-V)
at wheel-build time.

Front-ends: the hatchling hook (:mod:`hatch_khal.plugin`, registered by :mod:`hatch_khal.hooks`)
and the setuptools command (:mod:`hatch_khal.setuptools_ext`), sharing :mod:`hatch_khal.frontend`.
The build (:func:`hatch_khal.builder.build_packages`) runs the stages :mod:`~hatch_khal.plan`,
:mod:`~hatch_khal.compile_stage`, :mod:`~hatch_khal.assemble` and :mod:`~hatch_khal.output`, handing
each other frozen records per crate (``Planned`` -> ``Prepared`` -> ``Compiled``), with a language
seam (:mod:`hatch_khal.languages`; CUDA C++ in :mod:`hatch_khal.cuda`, Slang in
:mod:`hatch_khal.slang.language` over the Slang stage :mod:`hatch_khal.slang`, Triton in
:mod:`hatch_khal.triton.language`) and a compiler
seam (:mod:`hatch_khal.compilers`; NVRTC in :mod:`hatch_khal.nvrtc`). The manifest model and the
ABI are shared with the runtime: :mod:`khal_runtime.manifest`, :mod:`khal_runtime.abi`.
"""

from hatch_khal.__about__ import __version__

__all__ = ["__version__"]

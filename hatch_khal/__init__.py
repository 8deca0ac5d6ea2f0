"""hatch-khal: compile kernel crates to PTX and cubins at wheel-build time.

The hatchling plugin lives in :mod:`hatch_khal.plugin` (registered by
:mod:`hatch_khal.hooks`); the build itself in :mod:`hatch_khal.builder`, which
the setuptools command reuses. The manifest model is shared with the runtime:
:mod:`khal_runtime.manifest`.
"""

from hatch_khal.__about__ import __version__

__all__ = ["__version__"]

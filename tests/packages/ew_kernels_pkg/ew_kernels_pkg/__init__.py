from ._khal import kernels

__all__ = ["kernels"]

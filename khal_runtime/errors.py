"""Every failure the runtime raises, one class per kind of problem.

All derive from :class:`KhalError`; each message names what failed (package,
crate, entry, parameter, file) and what to do about it.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

__all__ = [
    "ArgumentError",
    "ArgumentValueError",
    "ArtifactError",
    "BackendFallbackWarning",
    "BackendUnavailableError",
    "BackendVarError",
    "CaptureError",
    "CudaError",
    "EnvVarError",
    "HashMismatchError",
    "KhalError",
    "LaunchAttributeError",
    "ManifestError",
    "NoCompatibleBinaryError",
    "ParamLayoutError",
    "PtxTooNewError",
    "TritonAssumptionError",
    "TritonAutotuneError",
    "TritonJitFallbackWarning",
    "TritonMissingVariantError",
    "StaleBuildError",
    "TritonServeError",
    "TritonStandInError",
    # the WebGPU backend's (in 0.2.0 khal_runtime.backends.webgpu.errors, which still names them)
    "GroupLimitError",
    "PipelineCreationError",
    "UnalignedViewError",
    "WebGpuError",
]


class KhalError(Exception):
    """Base class of every khal_runtime error."""


class EnvVarError(KhalError, ValueError):
    """An environment variable khal reads has a value it does not understand (``KHAL_SKIP_SPIRV=flase``,
    ``KHAL_BACKEND=vulkan``, ``KHAL_WEBGPU_BATCH=0``): the message names the variable, the value and
    the values it accepts. One class for every such variable, at build and at run time; a
    ValueError, as the variables' own errors were before."""

    def __init__(self, message: str, *, variable: str = "", value: str = ""):
        super().__init__(message)
        self.variable = variable
        self.value = value


class ManifestError(KhalError, ValueError):
    """The manifest is missing, not JSON, of a newer schema, or invalid."""


class ArtifactError(KhalError):
    """An artifact is missing, escapes the package, or its sha256/size does not match."""


class HashMismatchError(KhalError):
    """An entry symbol in a binary does not carry the hash the manifest (host) expects."""

    def __init__(self, message: str, *, entry: str = "", expected: str = "", found: str | None = None):
        super().__init__(message)
        self.entry = entry
        self.expected = expected
        self.found = found


class StaleBuildError(KhalError):
    """An editable install's sources changed after its kernels were built."""


class ParamLayoutError(KhalError):
    """The binary's parameter layout disagrees with the manifest's ABI."""


class BackendUnavailableError(KhalError, RuntimeError):
    """No backend can run kernels here (no usable CUDA driver/device, no WebGPU adapter), or the
    one ``KHAL_BACKEND`` asks for is unusable or lacks what the package needs."""


class BackendVarError(EnvVarError, BackendUnavailableError):
    """``KHAL_BACKEND`` names no backend: an :class:`EnvVarError`, and a
    :class:`BackendUnavailableError` as it was before EnvVarError existed (handlers of that keep
    working)."""


class BackendFallbackWarning(UserWarning):
    """``KHAL_BACKEND=auto`` chose WebGPU where CUDA was expected (CUDA unusable, or a loaded
    package has no CUDA binary for the device): warned once per process. Filter it with
    ``warnings.filterwarnings("ignore", category=khal_runtime.BackendFallbackWarning)`` or set
    ``KHAL_BACKEND=webgpu`` to say that WebGPU is meant."""


class NoCompatibleBinaryError(KhalError):
    """The package ships no cubin for this GPU and no PTX the driver can JIT."""


class PtxTooNewError(NoCompatibleBinaryError):
    """Only PTX would fit this GPU, and its ISA version is newer than the driver understands."""


class CudaError(KhalError, RuntimeError):
    """A CUDA driver call failed; ``.code`` holds the CUresult name."""

    def __init__(self, message: str, code: str = ""):
        super().__init__(message)
        self.code = code


class ArgumentError(KhalError, TypeError):
    """A launch argument has the wrong kind, dtype, element size, or count (raised before launch).

    Subclasses TypeError; value problems (sizes) raise :class:`ArgumentValueError`.
    """


class ArgumentValueError(KhalError, ValueError):
    """A launch argument has the right type but a wrong size/shape/value (raised before launch)."""


class LaunchAttributeError(KhalError, ValueError):
    """An entry's launch attributes (dynamic shared memory, cooperative grid, clusters, PDL) cannot be
    honoured: the device lacks what they need, a launch asks for more than the entry declared or the
    device can hold co-resident, or the path (indirect dispatch, WebGPU) has no such launch."""


class TritonAssumptionError(ArgumentValueError):
    """A Triton entry's call breaks an assumption every binary the crate ships for it was compiled
    with (a pointer not 16-byte aligned, an integer not divisible by 16), and the crate has no
    conservative instance (``fallback = false``)."""


class TritonAutotuneError(KhalError, RuntimeError):
    """An autotuned Triton family (``autotune = true``) cannot launch or name the config asked for:
    no config is chosen yet for these key values where nothing may time them (``bind``,
    ``chosen``), or a pin (``k.pin``, ``KHAL_TRITON_CONFIG``) names a config it does not have."""


class TritonMissingVariantError(KhalError, LookupError):
    """A Triton kernel's own call (``kernels.<kernel>[grid](...)``) that no built variant covers: no
    variant of its constexprs, options, argument types and ``None`` arguments, or none whose
    assumptions (alignment, divisibility, ``== 1``) the call meets. The message lists the nearest
    built variants, the lock-file table that would build the missing one and the record command."""


class TritonJitFallbackWarning(UserWarning):
    """A Triton kernel's call no built variant covers went to Triton's JIT (the crate's
    ``jit-fallback``, or ``KHAL_TRITON_JIT_FALLBACK=1``): said once per missing variant, which is
    appended to the record file (``KHAL_TRITON_RECORD``) for the next build."""


class CaptureError(KhalError, RuntimeError):
    """Something was done during CUDA graph capture that would break the capture."""



class TritonServeError(KhalError, ImportError):
    """A companion package (a crate that serves another library's Triton kernels,
    ``Crate.triton.serves``) was built for another version of that library, or the library's module
    files differ from those it was built from, or the library is not installed: the companion
    refuses to serve it (raised by its ``load()``, so by its ``import``; an ``ImportError``, so that
    ``try: import companion / except ImportError`` keeps Triton's JIT)."""


class TritonStandInError(KhalError, RuntimeError):
    """Host code ran without Triton installed and asked khal's Triton stand-in for something it does
    not have: a Triton API beyond ``jit`` / ``autotune`` / ``heuristics`` / ``Config`` / ``cdiv`` /
    ``next_power_of_2`` / ``language`` dtypes and ``constexpr`` (named in the message), or a launch
    of a kernel no loaded package serves."""


# -- the WebGPU backend's ----------------------------------------------------------------------------
class WebGpuError(KhalError, RuntimeError):
    """A WebGPU call failed (validation, out of memory, a lost device); the message names the
    entries or the operation involved."""


class PipelineCreationError(WebGpuError):
    """The shader module or compute pipeline of an entry could not be created."""


class GroupLimitError(ArgumentValueError):
    """A launch asks for more workgroups in one dimension than the device allows."""


class UnalignedViewError(ArgumentValueError):
    """A buffer slice cannot be bound: its offset is not a multiple of the device's
    ``min_storage_buffer_offset_alignment`` (or its size is not a multiple of 4 bytes)."""


def unimplemented(obj: Any, members: Iterable[str], callables: Iterable[str],
                  has: Callable[[Any, str], bool] = hasattr) -> str | None:
    """What ``obj`` lacks of a contract (a Protocol's ``members``, of which ``callables`` must be
    callable): ``"missing a, b; not callable: c"``, or None when it has everything. The registries
    of backends and kernel languages check an implementation with it when they load it."""
    missing = [m for m in members if not has(obj, m)]
    bad = [m for m in callables if m not in missing and not callable(getattr(obj, m))]
    if not missing and not bad:
        return None
    return "; ".join(filter(None, [f"missing {', '.join(missing)}" if missing else "",
                                   f"not callable: {', '.join(bad)}" if bad else ""]))


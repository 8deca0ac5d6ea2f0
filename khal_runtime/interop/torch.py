"""PyTorch tensors as storage arguments (recognised by module name; torch is never imported).

``data_ptr()``, many times cheaper than ``__cuda_array_interface__`` (benchmarks/RESULTS.md). A tensor can change
in place (``resize_``, ``set_``, ``t_``, ``.data =``) but not without a sign: every in-place op
bumps its ``_version`` (under ``no_grad`` and ``inference_mode`` too) and ``.data =`` moves its
``data_ptr()`` or changes its dtype, so its memo policy is "versioned": a repeated launch checks
the three. A launch holds the tensor's storage so that its address cannot be handed to other data
while remembered. Inference tensors have no version counter (``UNVERSIONED``): a repeated launch
compares their pointer, dtype, count and contiguity. ``torch.cuda.Stream``
objects are ``stream=`` arguments, and torch dtypes name ABI element types, through this
module's hooks. It registers itself when :mod:`khal_runtime.interop` imports it.
"""

from __future__ import annotations

import sys
from typing import Any, Hashable

from khal_runtime import abi, capture_state
from khal_runtime.errors import ArgumentError, ArgumentValueError
from khal_runtime.interop.registry import UNVERSIONED, ArrayType, BadArgument, add_probe

__all__ = ["dtype_name", "probe", "stream_handle"]


def _bad(t: Any) -> BadArgument:
    if not t.is_cuda:
        kind = getattr(getattr(t, "device", None), "type", "cpu")
        what = "a host tensor" if kind == "cpu" else "not a CUDA tensor"
        return BadArgument(ArgumentError, f"is {what} (device {t.device}); move it with .cuda()")
    return BadArgument(ArgumentValueError, "is a non-contiguous tensor; pass .contiguous()")


def extract(t: Any) -> tuple[int, int, Hashable]:
    if t.is_cuda and t.is_contiguous():
        ptr, count = t.data_ptr(), t.numel()
        if ptr or not count:
            return ptr, count, t.dtype
        raise BadArgument(ArgumentValueError, f"is a tensor of {count} elements with no memory "
                          "(its storage was freed, e.g. untyped_storage().resize_(0)); "
                          "reallocate it before the launch, or pass another tensor")
    raise _bad(t)


def device(t: Any) -> int | None:
    # is_cuda first: get_device() also numbers other accelerators' devices
    return int(t.get_device()) if t.is_cuda else None


def storage(t: Any) -> Any:
    return t.untyped_storage()


def version(t: Any) -> tuple[Any, Any] | None:
    try:
        # asked first: an inference tensor's _version raises a C++ error, whose backtrace
        # costs tens of microseconds; it has no version counter: its memo compares what an
        # in-place op can change under the same identity (pointer, count, dtype, contiguity)
        if t.is_inference():
            return UNVERSIONED, t.untyped_storage()
        return t._version, t.untyped_storage()
    except Exception:  # noqa: BLE001
        return None


INLINE = (
    "if not ({a}.is_cuda and {a}.get_device() == {d} and {a}.is_contiguous()): raise Short()",
    "p{i} = {a}.data_ptr(); c{i} = {a}.numel(); k{i} = {a}.dtype",
    "if not p{i} and c{i}: raise Short()",
)


_NAMES = {
    "torch.float32": "float32", "torch.float": "float32", "torch.float64": "float64",
    "torch.double": "float64", "torch.float16": "float16", "torch.half": "float16",
    "torch.bfloat16": "bfloat16", "torch.int8": "int8", "torch.int16": "int16",
    "torch.int32": "int32", "torch.int64": "int64", "torch.uint8": "uint8",
    "torch.uint16": "uint16", "torch.uint32": "uint32", "torch.uint64": "uint64",
    "torch.bool": "bool", "torch.complex64": "complex64", "torch.cfloat": "complex64",
    "torch.complex128": "complex128", "torch.cdouble": "complex128",
}


def dtype_name(key: Any) -> tuple[str, int] | None:
    """(element type name, itemsize) of a ``torch.dtype``, else None."""
    if not (type(key).__module__ or "").startswith("torch"):
        return None
    name = _NAMES.get(str(key), str(key).removeprefix("torch."))  # (torch.float8_e4m3fn: float8_e4m3fn)
    return name, int(getattr(key, "itemsize", abi.SCALARS[name].size if name in abi.SCALARS else 0))


def probe(obj: Any) -> ArrayType | None:
    tp = type(obj)
    if not (tp.__module__ or "").startswith("torch") or not hasattr(obj, "data_ptr") \
            or not hasattr(obj, "is_cuda"):
        return None
    versioned = hasattr(tp, "_version") and hasattr(obj, "untyped_storage") and hasattr(obj, "is_inference")
    return ArrayType("torch.Tensor", extract, device, "versioned" if versioned else None,
                     version if versioned else None, storage if hasattr(obj, "untyped_storage") else None,
                     INLINE, stream_handle, dtype_name)


def stream_handle(obj: Any) -> tuple[int, int | None] | None:
    """(CUstream handle, device) of a ``torch.cuda.Stream``, else None."""
    if not (type(obj).__module__ or "").startswith("torch") or not hasattr(obj, "cuda_stream"):
        return None
    return int(obj.cuda_stream), int(obj.device_index)


def capturing() -> bool:
    """Whether this thread is inside a ``torch.cuda.graph`` capture (torch already imported and
    CUDA initialised by it; never imports torch)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    cuda = torch.cuda
    return bool(cuda.is_initialized() and cuda.is_current_stream_capturing())


# a DeviceBuffer freed by the garbage collector inside torch.cuda.graph waits for it to end
capture_state.add_foreign_probe(capturing)


# first among the probes: a tensor also has __cuda_array_interface__ and __dlpack__
add_probe(probe, order=10, stream=stream_handle, dtype_name=dtype_name)

"""Runtime helpers shared by the CPU tests of the launch path (fake driver, tests/helpers/fakecuda.py): the
five-parameter entry ``five`` and its struct, torch-like tensors, a launch slot as an integer."""

from __future__ import annotations

import ctypes
import os
import re
import struct
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from khal_runtime.device import Stream
from khal_runtime.kernels import Kernel
from khal_runtime.manifest import Param
from tests.helpers.fakecuda import FakeDriver, fake_kernels, make_entry, stream


def generated_name(what: str) -> str:
    """A regular expression for the name code generated as ``what`` is compiled under: its file
    (khal_runtime.generated.source_dir), or ``<khal what-N>`` where no file can be written."""
    slug = re.escape(re.sub(r"[^A-Za-z0-9_.]+", "-", what).strip("-."))
    sep = re.escape(os.sep)
    return rf'(?:[^"]*{sep}khal-generated-[^"{sep}]+{sep}{slug}-[0-9a-f]{{16}}\.py|<khal {re.escape(what)}-\d+>)'


class P(ctypes.Structure):
    _fields_ = [("a", ctypes.c_float), ("b", ctypes.c_float)]


FIVE = (Param(name="x", kind="storage", shape="slice", element_type="float32", element_size=4, element_align=4),
        Param(name="y", kind="storage", shape="slice", writable=True, element_type="float32", element_size=4,
              element_align=4),
        Param(name="z", kind="storage", shape="array", length=4, element_type="float32", element_size=4,
              element_align=4),
        Param(name="p", kind="uniform", element_type="P", element_size=8, element_align=4),
        Param(name="s", kind="scalar", element_type="float32", element_size=4, element_align=4))


def _kernel(fake: FakeDriver) -> tuple[Kernel, Stream]:
    """Entry ``five`` of a fake package, loaded and planned on device 0, and a borrowed stream
    whose native handle reads "STREAM"."""
    ks = fake_kernels(fake, Path(tempfile.mkdtemp(prefix="khal-fast-")), [make_entry("five", FIVE)])
    k = ks.five
    k.plan(0)
    return k, stream()


class Tensor:
    def __init__(self, ptr: int, n: int, contiguous: bool = True, device: int = 0) -> None:
        self.ptr, self.n, self.contiguous, self.index = ptr, n, contiguous, device
        self.dtype = "float32"
        self.is_cuda = device >= 0
        self.device = SimpleNamespace(type="cuda" if device >= 0 else "cpu", index=device)

    def get_device(self) -> int:
        return self.index

    def is_contiguous(self) -> bool:
        return self.contiguous

    def data_ptr(self) -> int:
        return self.ptr

    def numel(self) -> int:
        return self.n


Tensor.__module__ = "torch"


def _u64(launch: dict[str, Any], slot: int) -> int:
    return struct.unpack("<Q", launch["slots"][slot])[0]


class Storage:
    """What ``untyped_storage()`` returns: the memory a tensor views."""


class VersionedTensor:
    """torch.Tensor as the runtime reads it, with the version counter in-place ops bump and the
    storage ``.data =`` replaces. ``reads`` counts the reads a full argument read makes."""

    _version = 0  # class attribute, as on torch.Tensor (a descriptor there)
    reads = 0

    def __init__(self, ptr: int, n: int) -> None:
        self.ptr, self.n, self._version, self.storage = ptr, n, 0, Storage()
        self.dtype = "float32"
        self.is_cuda = True

    def get_device(self) -> int:
        return 0

    def is_contiguous(self) -> bool:
        return True

    def data_ptr(self) -> int:
        return self.ptr

    def numel(self) -> int:
        VersionedTensor.reads += 1
        return self.n

    def untyped_storage(self) -> Storage:
        return self.storage

    def is_inference(self) -> bool:
        return False

    # what torch does to a tensor in place
    def resize_(self, n: int) -> None:
        self.n, self._version = n, self._version + 1

    def set_data(self, ptr: int, n: int) -> None:  # ``t.data = other``: the version is kept
        self.ptr, self.n, self.storage = ptr, n, Storage()


VersionedTensor.__module__ = "torch"

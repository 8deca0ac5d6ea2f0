"""The calls that khal-triton.lock was recorded from: the example's Triton host code
(``example_shader_pkg.tutorials``) run by Triton's interpreter on CPU tensors, under the recorder.

From this folder (the example's project), with Triton and a CPU torch installed::

    TRITON_INTERPRET=1 python -m hatch_khal triton record --replace -- python record_warmup.py

Each launch is recorded as the variant Triton's JIT would compile for it on an NVIDIA GPU (its
specialisation of every argument: a 16-byte aligned pointer ``:16``, an integer divisible by 16
``:16``, an integer equal to 1 compiled in ``:1``), and the build compiles each recorded variant for
every arch. Per kernel and dtype the calls are:

* the aligned shapes of the tests and benchmarks (every pointer aligned, every size a multiple of
  16): the fast variant, exactly the JIT's for those calls (the benchmarks' larger sizes take the
  same variant: they are not run here, the interpreter is slow);
* one conservative call that breaks every assumption a caller of the host function can break
  (unaligned inputs, odd strides, ragged sizes): its variant assumes nothing of those arguments,
  so it serves every other call (the tests' ragged and unaligned shapes included), as a hand-written
  instance's ``__base`` twin did.

Eight variants in all. A call that neither covers raises ``TritonMissingVariantError`` naming the
lock table to add; add its shape here and record again.

The package's modules are imported from this source tree without running its ``__init__`` (which
loads the built kernels and would serve the launches from them): here Triton runs the kernels.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
# example_shader_pkg as a bare package of the source tree: its modules, not its __init__ (no build needed)
_pkg = types.ModuleType("example_shader_pkg")
_pkg.__path__ = [str(HERE / "example_shader_pkg")]
sys.modules["example_shader_pkg"] = _pkg

from example_shader_pkg import tutorials  # noqa: E402 - after the package above

torch.manual_seed(0)


def strided(rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    """A (rows, cols) view at an unaligned address whose strides are neither 1 nor a multiple of 16."""
    return torch.randn(rows + 1, 3 * cols, dtype=dtype)[1:, ::3]


def offset_rows(rows: int, cols: int) -> torch.Tensor:
    """A (rows, cols) float32 view at an unaligned address, its rows contiguous, its row stride odd."""
    return torch.randn(rows, cols + 1)[:, 1:]


def check(got: torch.Tensor, want: torch.Tensor, what: str, tol: float = 1e-5) -> None:
    if not torch.allclose(got.float(), want.float(), atol=tol, rtol=tol):
        raise SystemExit(f"record_warmup: {what} is wrong")


for dtype in (torch.float32, torch.float16):
    for n in (4096, 98432):  # aligned, n % 16 == 0: the tests' and the benchmarks' sizes
        x, y = torch.rand(n, dtype=dtype), torch.rand(n, dtype=dtype)
        check(tutorials.add(x, y), x + y, f"add {n} {dtype}")
    x, y = torch.rand(98434, dtype=dtype)[1:], torch.rand(98434, dtype=dtype)[1:]  # conservative
    check(tutorials.add(x, y), x + y, f"add 98433 unaligned {dtype}")

for rows, cols in ((64, 1024), (4096, 1024)):  # aligned
    x = torch.randn(rows, cols)
    check(tutorials.softmax(x), torch.softmax(x, dim=1), f"softmax {rows}x{cols}")
x = offset_rows(1823, 781)  # conservative
check(tutorials.softmax(x), torch.softmax(x, dim=1), "softmax 1823x781 at an offset")

for m, n, k in ((128, 128, 64), (512, 512, 512)):  # aligned, row-major
    a, b = torch.randn(m, k, dtype=torch.float16), torch.randn(k, n, dtype=torch.float16)
    check(tutorials.matmul(a, b), a.float() @ b.float(), f"matmul {m}x{n}x{k}", tol=2e-2)
a, b = strided(333, 97, torch.float16), strided(97, 75, torch.float16)  # conservative
check(tutorials.matmul(a, b), a.float() @ b.float(), "matmul 333x75x97 strided", tol=2e-2)
print("record_warmup: ok")

"""pytest plugin for running Liger-Kernel's own tests against the companion wheel (``-p khal_liger_plugin``):
Triton's compiler is made unreachable (``triton.compile`` raises), then ``import liger_kernel_khal``, the
one line a user adds. Liger's code and tests are not changed."""

from __future__ import annotations

from typing import Any


def _unreachable(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("triton.compile was called: the companion did not serve a launch (khal_liger_plugin made "
                       "Triton's compiler unreachable)")


def _patch_triton() -> None:
    import triton
    import triton.compiler
    import triton.compiler.compiler

    triton.compile = _unreachable
    triton.compiler.compile = _unreachable
    triton.compiler.compiler.compile = _unreachable


_patch_triton()

import liger_kernel_khal  # noqa: E402,F401 - the one line


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    """Each process (xdist worker or not) writes its KHAL_TRITON_STATS counts beside the others
    (``KHAL_LIGER_STATS_DIR``): a worker's stderr, where the runtime prints its table, is not shown."""
    import json
    import os

    from khal_runtime.triton_call import stats

    folder = os.environ.get("KHAL_LIGER_STATS_DIR")
    if folder:
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"stats-{os.getpid()}.json"), "w") as f:
            json.dump(stats(), f)

"""Tiny shader projects written into a temp dir, for build tests."""

from __future__ import annotations

import textwrap
from pathlib import Path

SCALE_CU = """\
#include "common.cuh"
KHAL_ENTRY(scale, 128, (KHAL_STORAGE(float, y), KHAL_UNIFORM(Params, p), KHAL_SCALAR(float, bias)))
{
    uint64_t i = KHAL_GLOBAL_ID;
    if (i < y.len) y[i] = y[i] * p.a + bias + erff(y[i]) + expf(p.a) + sqrtf(bias) + sinf(y[i]);
}
"""

COMMON_CUH = """\
#pragma once
struct Params { float a; double b; };
"""

OTHER_CU = """\
KHAL_ENTRY(fill, 64, (KHAL_STORAGE(uint32_t, out), KHAL_SCALAR(uint32_t, value)))
{
    uint64_t i = KHAL_GLOBAL_ID;
    if (i < out.len) out[i] = value;
}
"""


HALF_CU = """\
#include <cuda_fp16.h>
#include <cooperative_groups.h>
#include <cub/warp/warp_reduce.cuh>
#include <cuda/std/cstdint>
KHAL_ENTRY(halve, 32, (KHAL_STORAGE(__half, x), KHAL_SCALAR(__half, s)))
{
    using WR = cub::WarpReduce<float>;
    __shared__ typename WR::TempStorage tmp;
    cuda::std::uint64_t i = KHAL_GLOBAL_ID;
    float v = i < x.len ? __half2float(x[i]) : 0.0f;
    float total = WR(tmp).Sum(v);
    if (i < x.len) x[i] = __float2half(__half2float(x[i]) * __half2float(s) + total * 0.0f);
}
"""


def make_project(
    root: Path,
    *,
    name: str = "mini-pkg",
    hook: str = 'archs = ["sm_90"]\n',
    crates: str | None = None,
    files: dict[str, str] | None = None,
    nvrtc_requirement: str | None = None,
    dependencies: str = '"khal-runtime>=0.1.0"',
) -> Path:
    """A project with package ``mini_pkg`` and crates ``alpha`` (scale) and ``beta`` (fill);
    ``dependencies``: the TOML array's items (the runtime, as a shader package lists it)."""
    pkg = name.replace("-", "_")
    root.mkdir(parents=True, exist_ok=True)
    (root / pkg).mkdir(exist_ok=True)
    (root / pkg / "__init__.py").write_text("import khal_runtime\nkernels = khal_runtime.load(__name__)\n")
    if crates is None:
        crates = textwrap.dedent(
            """\
            [[tool.hatch.build.targets.wheel.hooks.khal.crates]]
            name = "alpha"
            sources = ["kernels/alpha/*.cu"]
            include-dirs = ["kernels/include"]

            [[tool.hatch.build.targets.wheel.hooks.khal.crates]]
            name = "beta"
            sources = ["kernels/beta/*.cu"]
            """
        )
    req = f'nvrtc-requirement = "{nvrtc_requirement}"\n' if nvrtc_requirement else ""
    (root / "pyproject.toml").write_text(
        textwrap.dedent(
            f"""\
            [build-system]
            requires = ["hatchling>=1.24", "hatch-khal"]
            build-backend = "hatchling.build"

            [project]
            name = "{name}"
            version = "0.1.0"
            requires-python = ">=3.10"
            dependencies = [{dependencies}]

            [tool.hatch.build.targets.wheel]
            packages = ["{pkg}"]

            [tool.hatch.build.targets.wheel.hooks.khal]
            """
        )
        + req
        + hook
        + "\n"
        + crates
    )
    defaults = {
        "kernels/alpha/scale.cu": SCALE_CU,
        "kernels/include/common.cuh": COMMON_CUH,
        "kernels/beta/fill.cu": OTHER_CU,
    }
    defaults.update(files or {})
    for rel, text in defaults.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root

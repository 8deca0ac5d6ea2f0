"""The hook's configuration, validated with pydantic.

Read from ``[tool.hatch.build.targets.wheel.hooks.khal]`` (hatchling) or
``[tool.khal]`` (setuptools). Unknown keys are an error naming the key;
hatchling's own hook keys are tolerated. Environment variables may override
the arch lists (``KHAL_CUDA_ARCHS``, ``KHAL_PTX_ARCH``).
"""

from __future__ import annotations

import os
import re
from typing import Any, Literal, Mapping, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from khal_runtime.manifest import prebuilt_env_var

from hatch_khal.errors import ConfigError

__all__ = [
    "DEFAULT_ARCHS",
    "DEFAULT_PTX_ARCH",
    "HATCH_RESERVED_KEYS",
    "CrateConfig",
    "HookConfig",
    "ResolvedCrate",
    "env_var_for_crate",
    "parse_config",
]

#: Cubin archs built by default: Turing to Blackwell (those the NVRTC in use supports).
DEFAULT_ARCHS = ("sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120")
#: PTX for forward compatibility (JIT on newer GPUs), lowest arch so any GPU can JIT it.
DEFAULT_PTX_ARCH = "compute_75"
DEFAULT_NVRTC_REQUIREMENT = "nvidia-cuda-nvrtc>=12.8"

#: Keys hatchling itself reads from every build-hook table.
HATCH_RESERVED_KEYS = frozenset(
    {"dependencies", "require-runtime-dependencies", "require-runtime-features", "enable-by-default", "path"}
)

_CRATE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")
_SM = re.compile(r"^sm_(\d+)[af]?$")
_COMPUTE = re.compile(r"^compute_(\d+)[af]?$")
_DEFINE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


#: khal-builder's rule (upper-case, '-' to '_'); one definition, in the shared manifest module.
env_var_for_crate = prebuilt_env_var


def _check_sm(v: str) -> str:
    if not _SM.match(v):
        raise ValueError(f"{v!r} is not a cubin arch like 'sm_90'")
    return v


def _check_compute(v: str | None) -> str | None:
    if v in (None, "", "none"):
        return None
    if not _COMPUTE.match(v):
        raise ValueError(f"{v!r} is not a PTX arch like 'compute_75' (or 'none' for no PTX)")
    return v


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True, strict=True)


class CrateConfig(_Strict):
    name: str
    sources: list[str] = Field(min_length=1)
    include_dirs: list[str] = Field(default_factory=list, alias="include-dirs")
    package: Optional[str] = None
    archs: Optional[list[str]] = None
    ptx_arch: Optional[str] = Field(default="default", alias="ptx-arch")
    options: list[str] = Field(default_factory=list)
    defines: dict[str, Union[str, int]] = Field(default_factory=dict)
    cuda_headers: Optional[Literal["wheels", "system", "none"]] = Field(default=None, alias="cuda-headers")
    spirv: bool = False

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _CRATE_NAME.match(v):
            raise ValueError(f"crate name {v!r} must start with a letter and use only letters, digits, '-' and '_'")
        return v

    @field_validator("archs")
    @classmethod
    def _archs(cls, v: list[str] | None) -> list[str] | None:
        if v is not None:
            if not v:
                raise ValueError("must list at least one arch (or be left out for the defaults)")
            [_check_sm(a) for a in v]
        return v

    @field_validator("ptx_arch")
    @classmethod
    def _ptx(cls, v: str | None) -> str | None:
        return v if v == "default" else _check_compute(v)

    @field_validator("defines")
    @classmethod
    def _defines(cls, v: dict[str, str | int]) -> dict[str, str]:
        for k in v:
            if not _DEFINE.match(k):
                raise ValueError(f"define name {k!r} is not a C identifier")
        return {k: str(val) for k, val in v.items()}


class HookConfig(_Strict):
    crates: list[CrateConfig] = Field(min_length=1)
    package: Optional[str] = None
    archs: Optional[list[str]] = None
    ptx_arch: Optional[str] = Field(default=DEFAULT_PTX_ARCH, alias="ptx-arch")
    options: list[str] = Field(default_factory=list)
    defines: dict[str, Union[str, int]] = Field(default_factory=dict)
    include_dirs: list[str] = Field(default_factory=list, alias="include-dirs")
    cuda_headers: Literal["wheels", "system", "none"] = Field(default="wheels", alias="cuda-headers")
    nvrtc_requirement: str = Field(default=DEFAULT_NVRTC_REQUIREMENT, alias="nvrtc-requirement")

    @field_validator("archs")
    @classmethod
    def _archs(cls, v: list[str] | None) -> list[str] | None:
        return CrateConfig._archs(v)  # type: ignore[operator]

    @field_validator("ptx_arch")
    @classmethod
    def _ptx(cls, v: str | None) -> str | None:
        return _check_compute(v)

    @field_validator("defines")
    @classmethod
    def _defines(cls, v: dict[str, str | int]) -> dict[str, str]:
        return CrateConfig._defines(v)  # type: ignore[operator]

    @field_validator("nvrtc_requirement")
    @classmethod
    def _req(cls, v: str) -> str:
        from packaging.requirements import InvalidRequirement, Requirement

        try:
            req = Requirement(v)
        except InvalidRequirement as exc:
            raise ValueError(f"{v!r} is not a valid requirement ({exc})") from None
        if req.name.lower().replace("_", "-") != "nvidia-cuda-nvrtc":
            raise ValueError(f"must be a requirement on nvidia-cuda-nvrtc, got {req.name!r}")
        return v

    @model_validator(mode="after")
    def _unique(self) -> HookConfig:
        seen: dict[str, int] = {}
        for i, c in enumerate(self.crates):
            var = env_var_for_crate(c.name)
            if var in seen:
                raise ValueError(
                    f"crates[{i}] {c.name!r} clashes with crates[{seen[var]}] "
                    f"(both map to {var}); crate names must be unique"
                )
            seen[var] = i
        return self


class ResolvedCrate(BaseModel):
    """A crate with the hook-level defaults and the environment applied."""

    model_config = ConfigDict(frozen=True)

    name: str
    sources: list[str]
    include_dirs: list[str]
    package: str
    archs: list[str]
    archs_explicit: bool
    ptx_arch: Optional[str]
    options: list[str]
    defines: dict[str, str]
    cuda_headers: str
    spirv: bool


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (("." if out else "") + str(part))
    return out or "<root>"


def parse_config(
    raw: Mapping[str, Any], *, default_package: str | None, where: str = "khal hook"
) -> tuple[HookConfig, list[ResolvedCrate]]:
    """Validate the raw table and resolve every crate. Raises ConfigError."""
    data = {k: v for k, v in raw.items() if k not in HATCH_RESERVED_KEYS}
    try:
        cfg = HookConfig.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = _loc(err["loc"])
            if err["type"] == "extra_forbidden":
                problems.append(f"unknown option {loc!r}")
            elif err["type"] == "missing":
                problems.append(f"option {loc!r} is required")
            else:
                problems.append(f"option {loc!r}: {err['msg']} (got {err.get('input')!r})")
        raise ConfigError(f"{where}: invalid configuration: " + "; ".join(problems)) from None

    env_archs = os.environ.get("KHAL_CUDA_ARCHS", "").strip()
    env_ptx = os.environ.get("KHAL_PTX_ARCH", "").strip()
    if env_archs:
        parsed = [a.strip() for a in env_archs.replace(";", ",").split(",") if a.strip()]
        for a in parsed:
            if not _SM.match(a):
                raise ConfigError(f"KHAL_CUDA_ARCHS: {a!r} is not a cubin arch like 'sm_90'")
    if env_ptx:
        try:
            env_ptx = _check_compute(env_ptx) or "none"
        except ValueError as exc:
            raise ConfigError(f"KHAL_PTX_ARCH: {exc}") from None

    resolved = []
    for i, c in enumerate(cfg.crates):
        package = c.package or cfg.package or default_package
        if not package:
            raise ConfigError(
                f"{where}: crates[{i}] {c.name!r}: option 'package' is not set and no default could be "
                "derived from the project name; set 'package' to the package directory"
            )
        archs_explicit = bool(env_archs) or c.archs is not None or cfg.archs is not None
        archs = parsed if env_archs else list(c.archs or cfg.archs or DEFAULT_ARCHS)
        ptx = cfg.ptx_arch if c.ptx_arch == "default" else c.ptx_arch
        if env_ptx:
            ptx = None if env_ptx == "none" else env_ptx
        resolved.append(
            ResolvedCrate(
                name=c.name,
                sources=list(c.sources),
                include_dirs=list(cfg.include_dirs) + list(c.include_dirs),
                package=package.strip("/"),
                archs=sorted(set(archs), key=lambda a: (int(_SM.match(a).group(1)), a)),  # type: ignore[union-attr]
                archs_explicit=archs_explicit,
                ptx_arch=ptx,
                options=list(cfg.options) + list(c.options),
                defines={**cfg.defines, **c.defines},
                cuda_headers=c.cuda_headers or cfg.cuda_headers,
                spirv=c.spirv,
            )
        )
    return cfg, resolved

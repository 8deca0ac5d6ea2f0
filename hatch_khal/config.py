"""The hook's configuration, validated with pydantic.

Read from ``[tool.hatch.build.targets.wheel.hooks.khal]`` (hatchling) or
``[tool.khal]`` (setuptools). Unknown keys are an error naming the key (and the
right one, for a near miss such as ``include_dirs``); hatchling's own hook keys are
tolerated. Environment variables may override the arch lists (``KHAL_CUDA_ARCHS``,
``KHAL_PTX_ARCH``) and set the number of parallel compiles (``KHAL_JOBS``).

A crate's language follows from its ``sources``: globs of ``.slang`` files make a Slang
crate, anything else a CUDA C++ crate; one crate never mixes the two.
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import PurePosixPath, PureWindowsPath
from typing import TYPE_CHECKING, Any, Literal, Mapping, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from khal_runtime.abi import Arch, parse_arch, prebuilt_env_var

from hatch_khal.errors import ConfigError

if TYPE_CHECKING:
    from hatch_khal.languages import Language

__all__ = [
    "DEFAULT_ARCHS",
    "DEFAULT_PTX_ARCH",
    "HATCH_RESERVED_KEYS",
    "CrateConfig",
    "HookConfig",
    "DEFAULT_LANGUAGE",
    "ResolvedCrate",
    "canonical_package",
    "env_var_for_crate",
    "jobs_from_env",
    "parse_config",
]

#: Cubin archs built by default: Turing to Blackwell (those the NVRTC in use supports).
DEFAULT_ARCHS = ("sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120")
#: PTX for forward compatibility (JIT on newer GPUs), lowest arch so any GPU can JIT it.
DEFAULT_PTX_ARCH = "compute_75"
#: NVRTC added to an isolated build: CUDA 13.0's. NVRTC has no option to choose the PTX ISA it
#: writes (each release writes its own: 13.5 writes ISA 9.5), and a driver JITs PTX only up to its
#: own CUDA version, so the newest NVRTC would make PTX that only the newest drivers load
#: (CUDA_ERROR_UNSUPPORTED_PTX_VERSION on a CUDA 13.0 / R580 driver). 13.0's PTX (ISA 9.0) loads
#: on every CUDA 13 driver; cubins are unaffected. Projects for CUDA 12 drivers pin
#: nvidia-cuda-nvrtc-cu12 (docs/guide/configuration.md).
DEFAULT_NVRTC_REQUIREMENT = "nvidia-cuda-nvrtc~=13.0.0"

#: Keys hatchling itself reads from every build-hook table.
HATCH_RESERVED_KEYS = frozenset(
    {"dependencies", "require-runtime-dependencies", "require-runtime-features", "enable-by-default", "path"}
)

#: the language of sources whose suffix no language claims (``.cu``, a wildcard): CUDA C++. The
#: others' suffixes are their ``Language.suffixes`` (:mod:`hatch_khal.languages`).
DEFAULT_LANGUAGE = "cuda"

#: matched whole (re.fullmatch): a "$" would accept a trailing newline
_CRATE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
_DEFINE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
#: the Triton lock file at the project root when the hook option ``triton-lock`` names none
DEFAULT_TRITON_LOCK = "khal-triton.lock"

#: khal-builder's rule (upper-case, '-' to '_'); one definition, in the shared ABI module.
env_var_for_crate = prebuilt_env_var

#: Compiler options that make the compiler read (or write) files the hook does not hash:
#: option -> what to use instead. ``-I`` and ``-isystem`` also match their attached forms.
_FILE_OPTIONS: dict[str, str] = {
    "-I": "list the folder in 'include-dirs'",
    "--include-path": "list the folder in 'include-dirs'",
    "-isystem": "list the folder in 'include-dirs'",
    "-include": "#include the header from a source",
    "--pre-include": "#include the header from a source",
    "--pch-dir": "leave precompiled-header files out of 'options'",
    "--create-pch": "leave precompiled-header files out of 'options'",
    "--use-pch": "leave precompiled-header files out of 'options'",
    "-optf": "list the options themselves in 'options'",
    "--options-file": "list the options themselves in 'options'",
}
_ATTACHED = ("-I", "-isystem")

#: Spellings people reach for, mapped to the real key (close matches are found too).
_ALIASES = {
    "include": "include-dirs", "includes": "include-dirs", "include-path": "include-dirs",
    "include-paths": "include-dirs", "include-dir": "include-dirs", "arch": "archs",
    "sm": "archs", "ptx": "ptx-arch", "source": "sources", "srcs": "sources", "define": "defines",
    "option": "options", "flags": "options", "crate": "crates", "packages": "package",
    "slang-option": "slang-options", "slang-flags": "slang-options", "slangc-options": "slang-options",
    "headers": "cuda-headers", "nvrtc": "nvrtc-requirement",
}


def _cubin_arch(v: str) -> Arch:
    try:
        return parse_arch(v, ("sm",))
    except ValueError:
        raise ValueError(f"{v!r} is not a cubin arch like 'sm_90'") from None


def _ptx_arch(v: str | None) -> str | None:
    if v in (None, "", "none"):
        return None
    try:
        parse_arch(v, ("compute",))
    except ValueError:
        raise ValueError(f"{v!r} is not a PTX arch like 'compute_75' (or 'none' for no PTX)") from None
    return v


def _check_options(v: list[str]) -> list[str]:
    for opt in v:
        for flag, instead in _FILE_OPTIONS.items():
            attached = flag in _ATTACHED and opt.startswith(flag)
            if opt == flag or opt.startswith(flag + "=") or attached:
                raise ValueError(
                    f"{opt!r} makes the compiler read files that hatch-khal does not hash (so the cache "
                    f"and the entry hashes would miss their changes); {instead} instead "
                    "('include-dirs' folders are hashed file by file)"
                )
    return v


class _Strict(BaseModel):
    # aliases only: 'include_dirs' is an unknown key (named with its right spelling), not a synonym
    model_config = ConfigDict(extra="forbid", populate_by_name=False, frozen=True, strict=True)


class _CommonOptions(_Strict):
    """The options a crate and the hook table share (the hook's are every crate's defaults)."""

    package: Optional[str] = None
    archs: Optional[list[str]] = None
    options: list[str] = Field(default_factory=list)
    defines: dict[str, Union[str, int]] = Field(default_factory=dict)
    include_dirs: list[str] = Field(default_factory=list, alias="include-dirs")
    #: options given to the Slang compiler (Slang crates only)
    slang_options: list[str] = Field(default_factory=list, alias="slang-options")

    @field_validator("archs")
    @classmethod
    def _archs(cls, v: list[str] | None) -> list[str] | None:
        if v is not None:
            if not v:
                raise ValueError("must list at least one arch (or be left out for the defaults)")
            for a in v:
                _cubin_arch(a)
        return v

    @field_validator("ptx_arch", check_fields=False)
    @classmethod
    def _ptx(cls, v: str | None) -> str | None:
        return v if v == "default" else _ptx_arch(v)

    @field_validator("defines")
    @classmethod
    def _defines(cls, v: dict[str, str | int]) -> dict[str, str]:
        for k in v:
            if not _DEFINE.fullmatch(k):
                raise ValueError(f"define name {k!r} is not a C identifier")
        return {k: str(val) for k, val in v.items()}

    @field_validator("options")
    @classmethod
    def _options(cls, v: list[str]) -> list[str]:
        return _check_options(v)


class CrateConfig(_CommonOptions):
    name: str
    #: the crate's language by name (a built-in or an installed plugin's); default: from the
    #: sources' suffixes (:func:`_language`)
    language: Optional[str] = None
    #: required, unless a Triton crate gives ``modules`` instead (checked by :func:`_language`)
    sources: Optional[list[str]] = Field(default=None, min_length=1)
    #: Triton companion crates: installed modules whose kernels the crate serves (instead of ``sources``)
    modules: Optional[list[str]] = Field(default=None, min_length=1)
    #: Triton crates: a call no built variant covers goes to Triton's JIT where Triton is installed
    jit_fallback: Optional[bool] = Field(default=None, alias="jit-fallback")
    #: "default": the hook-level value
    ptx_arch: Optional[str] = Field(default="default", alias="ptx-arch")
    cuda_headers: Optional[Literal["wheels", "system", "none"]] = Field(default=None, alias="cuda-headers")
    #: Slang crates: build WGSL / SPIR-V (default true); CUDA C++ crates cannot
    spirv: Optional[bool] = None
    #: Triton crates: the instances to build (checked by :mod:`hatch_khal.triton.instances`)
    instances: Optional[list[dict[str, Any]]] = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _CRATE_NAME.fullmatch(v):
            raise ValueError(f"crate name {v!r} must start with a letter and use only letters, digits, '-' and '_'")
        return v

    @field_validator("modules")
    @classmethod
    def _modules(cls, v: list[str] | None) -> list[str] | None:
        for m in v or []:
            if not _MODULE.fullmatch(m):
                raise ValueError(f"{m!r} is not a dotted module name (liger_kernel.ops.rms_norm)")
        if v is not None and len(set(v)) != len(v):
            raise ValueError("names a module twice")
        return v


class HookConfig(_CommonOptions):
    crates: list[CrateConfig] = Field(min_length=1)
    ptx_arch: Optional[str] = Field(default=DEFAULT_PTX_ARCH, alias="ptx-arch")
    cuda_headers: Literal["wheels", "system", "none"] = Field(default="wheels", alias="cuda-headers")
    nvrtc_requirement: str = Field(default=DEFAULT_NVRTC_REQUIREMENT, alias="nvrtc-requirement")
    #: the Triton lock file, relative to the project root (None: ``khal-triton.lock``, if it exists)
    triton_lock: Optional[str] = Field(default=None, alias="triton-lock")

    @field_validator("triton_lock")
    @classmethod
    def _lock(cls, v: str | None) -> str | None:
        if v is not None and (not v.strip() or PurePosixPath(v).is_absolute() or PureWindowsPath(v).is_absolute()):
            raise ValueError("must be a file's path relative to the project root (khal-triton.lock)")
        return v
    #: the shared build cache's store (s3://bucket/prefix, http(s)://host/path); KHAL_CACHE_URL wins
    cache_url: Optional[str] = Field(default=None, alias="cache-url")

    @field_validator("cache_url")
    @classmethod
    def _cache_url(cls, v: str | None) -> str | None:
        if v:
            from hatch_khal.stores import check_url  # lazy: only when the option is set

            try:
                check_url(v, "option 'cache-url'")
            except ConfigError as exc:
                raise ValueError(str(exc).removeprefix("option 'cache-url' = ").removeprefix("option 'cache-url': "))
        return v or None

    @field_validator("nvrtc_requirement")
    @classmethod
    def _req(cls, v: str) -> str:
        # lazy: packaging is only needed when the table is validated
        from hatch_khal.nvidia_wheels import parse_nvrtc_requirement

        parse_nvrtc_requirement(v)  # nvidia-cuda-nvrtc (CUDA 13+) or nvidia-cuda-nvrtc-cu12; ValueError
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


def _keys(model: type[BaseModel]) -> list[str]:
    return [f.alias or name for name, f in model.model_fields.items()]


class ResolvedCrate(BaseModel):
    """A crate with the hook-level defaults and the environment applied."""

    model_config = ConfigDict(frozen=True)

    name: str
    #: the source language's name: "cuda" (CUDA C++), "slang", "triton" or an installed plugin's
    #: (:mod:`hatch_khal.languages`)
    language: str = DEFAULT_LANGUAGE
    sources: list[str]
    include_dirs: list[str]
    package: str
    archs: list[str]
    archs_explicit: bool
    ptx_arch: Optional[str]
    options: list[str]
    defines: dict[str, str]
    cuda_headers: str
    #: Slang crates: False skips the WebGPU stage (None: the default, build it)
    spirv: Optional[bool] = None
    #: Slang crates: options for the Slang compiler
    slang_options: list[str] = []
    #: Triton crates: the instance tables, as written (:mod:`hatch_khal.triton.instances`)
    instances: list[dict[str, Any]] = []
    #: Triton companion crates: the installed modules whose kernels it serves (its sources are none)
    modules: list[str] = []
    #: Triton crates: option ``jit-fallback``
    jit_fallback: bool = False
    #: Triton crates: the lock file, relative to the project root, and whether option ``triton-lock``
    #: named it (then it must exist; the default may not)
    triton_lock: str = DEFAULT_TRITON_LOCK
    triton_lock_explicit: bool = False
    #: the names of the build's crates of this crate's language (a Triton lock variant must name one)
    language_crates: list[str] = []
    #: a plugin language's own crate options, as its ``validate_options`` returned them
    language_options: dict[str, Any] = {}


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (("." if out else "") + str(part))
    return out or "<root>"


def _did_you_mean(loc: tuple[Any, ...]) -> str:
    key = str(loc[-1])
    in_crate = len(loc) >= 3 and loc[0] == "crates"
    valid = _keys(CrateConfig) if in_crate else _keys(HookConfig)
    other = _keys(HookConfig) if in_crate else _keys(CrateConfig)
    norm = key.strip().lower().replace("_", "-")
    guess = norm if norm in valid else _ALIASES.get(norm)
    if guess is None or guess not in valid:
        close = difflib.get_close_matches(norm, valid, n=1, cutoff=0.7)
        guess = close[0] if close else None
    if guess is not None and guess != key:
        return f"; did you mean {guess!r}?"
    if norm in other:
        return f"; {norm!r} is an option of {'the hook table, not of a crate' if in_crate else 'each crate'}"
    return ""


def jobs_from_env() -> int | None:
    """``KHAL_JOBS``: the number of parallel compiles, or None when unset."""
    raw = os.environ.get("KHAL_JOBS", "").strip()
    if not raw:
        return None
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise ConfigError(
            f"KHAL_JOBS={raw!r} is not a positive integer (the number of parallel compiles); "
            "set it to 1 or more, or unset it to use every CPU"
        )
    return n


def _env_archs() -> list[str] | None:
    raw = os.environ.get("KHAL_CUDA_ARCHS", "").strip()
    if not raw:
        return None
    parsed = [a.strip() for a in raw.replace(";", ",").split(",") if a.strip()]
    for a in parsed:
        try:
            _cubin_arch(a)
        except ValueError as exc:
            raise ConfigError(f"KHAL_CUDA_ARCHS: {exc}") from None
    return parsed


def _env_ptx() -> str | None:
    """KHAL_PTX_ARCH: None when unset, "none" for no PTX, else the arch."""
    raw = os.environ.get("KHAL_PTX_ARCH", "").strip()
    if not raw:
        return None
    try:
        return _ptx_arch(raw) or "none"
    except ValueError as exc:
        raise ConfigError(f"KHAL_PTX_ARCH: {exc}") from None


#: the crate options that belong to a language (its ``crate_options`` says which it takes): when given
#: (not None; ``spirv`` when true: ``spirv = false`` is every non-Slang crate's state anyway)
_LANGUAGE_OPTIONS: dict[str, str] = {"spirv": "spirv", "slang-options": "slang_options", "instances": "instances",
                                     "modules": "modules", "jit-fallback": "jit_fallback"}


def _given(crate: CrateConfig, key: str) -> bool:
    value = getattr(crate, _LANGUAGE_OPTIONS[key])
    return bool(value) if key in ("spirv", "slang-options") else value is not None


def _language(where: str, index: int, crate: CrateConfig, extras: Mapping[str, Any]) -> Language[Any, Any]:
    """The crate's language: option ``language``, else the one taking ``modules`` when the crate gives
    them, else its source globs' suffixes (a suffix no language claims is CUDA C++). ConfigError for
    a mix of languages or another language's option (each language says which options it takes)."""
    from hatch_khal.languages import ENTRY_POINT_GROUP, all_languages  # lazy: the registry imports this module

    prefix = f"{where}: crates[{index}] {crate.name!r}"
    languages = all_languages()
    taking = {key: [lang for lang in languages.values() if key in lang.crate_options]
              for key in {*_LANGUAGE_OPTIONS, *extras}}
    if crate.modules is not None and crate.sources is not None:
        raise ConfigError(f"{prefix}: options 'sources' and 'modules' are exclusive: 'modules' names an installed "
                          "library's modules whose kernels the crate serves (a companion crate), 'sources' "
                          "the project's own files")
    if crate.language is not None:
        if crate.language not in languages:
            raise ConfigError(f"{prefix}: option 'language' = {crate.language!r} names no language of this build "
                              f"(it has: {', '.join(sorted(languages))}); a plugin's language is found through the "
                              f"entry-point group {ENTRY_POINT_GROUP!r}: list its distribution in [build-system] "
                              "requires")
        language = languages[crate.language]
    elif crate.modules is not None:
        language = taking["modules"][0]
    else:
        if crate.sources is None:
            raise ConfigError(f"{where}: invalid configuration: option 'crates[{index}].sources' is required (or "
                              "'modules' for a Triton crate serving an installed library's kernels)")
        by_suffix: dict[str, list[Language[Any, Any]]] = {}
        for lang in languages.values():
            for suffix in lang.suffixes:
                by_suffix.setdefault(suffix.lower(), []).append(lang)
        by_language: dict[str, list[str]] = {}
        for pattern in crate.sources:
            suffix = "." + pattern.rsplit(".", 1)[1] if "." in pattern.rsplit("/", 1)[-1] else ""
            claims = by_suffix.get(suffix.lower(), [languages[DEFAULT_LANGUAGE]])
            if len(claims) > 1:
                raise ConfigError(f"{prefix}: {suffix} sources are claimed by the languages "
                                  f"{', '.join(repr(c.name) for c in claims)}: say which with option 'language'")
            by_language.setdefault(claims[0].name, []).append(pattern)
        if len(by_language) > 1:
            def files(globs: list[str]) -> str:
                suffixes = sorted({"." + g.rsplit(".", 1)[1] for g in globs if "." in g.rsplit("/", 1)[-1]})
                return " and ".join(f"the {x} files" for x in suffixes) or "the " + ", ".join(globs)
            raise ConfigError(
                f"{prefix}: option 'sources' mixes "
                + " with ".join(f"{languages[k].title} sources ({', '.join(v)})" for k, v in by_language.items())
                + "; a crate is compiled as one module of one language: put "
                + " and ".join(files(v) for v in by_language.values())
                + f" in {_COUNT_WORDS.get(len(by_language), len(by_language))} crates"
            )
        language = languages[next(iter(by_language))]
    language.check_crate(prefix, crate)
    for key in [*_LANGUAGE_OPTIONS, *extras]:
        given = _given(crate, key) if key in _LANGUAGE_OPTIONS else True
        if given and key not in language.crate_options:
            owners = " / ".join(lang.title for lang in taking[key]) or "no installed language's"
            raise ConfigError(f"{prefix}: option {key!r} is for {owners} crates; this crate's sources are "
                              f"{language.title}")
    return language


_COUNT_WORDS = {2: "two", 3: "three"}


def _language_extras(data: dict[str, Any]) -> tuple[dict[str, Any], dict[int, dict[str, Any]]]:
    """Take the plugin languages' own options out of each crate table (crate index -> options), for
    the crate's language to validate; every other key is pydantic's to accept or refuse."""
    crates = data.get("crates")
    known = set(_keys(CrateConfig))
    if not isinstance(crates, list) or all(not isinstance(c, dict) or set(c) <= known for c in crates):
        return data, {}
    from hatch_khal.languages import all_languages  # lazy: plugins are looked for only when needed

    own = {key for lang in all_languages().values() for key in lang.crate_options} - known
    extras: dict[int, dict[str, Any]] = {}
    out = []
    for i, c in enumerate(crates):
        if isinstance(c, dict) and own & set(c):
            extras[i] = {k: v for k, v in c.items() if k in own}
            c = {k: v for k, v in c.items() if k not in own}
        out.append(c)
    return {**data, "crates": out}, extras


def canonical_package(package: str) -> str:
    """One spelling per folder: ``./pkg``, ``pkg/``, ``pkg/.`` and ``pkg//`` are all ``pkg`` (the
    crates of a package are grouped by this name). A leading ``/`` and ``..`` stay, for
    :func:`hatch_khal.frontend.check_packages` to refuse; a symlink is refused there too."""
    return str(PurePosixPath(package))


def parse_config(
    raw: Mapping[str, Any], *, default_package: str | None, where: str = "khal hook"
) -> tuple[HookConfig, list[ResolvedCrate]]:
    """Validate the raw table and resolve every crate. Raises ConfigError."""
    data = {k: v for k, v in raw.items() if k not in HATCH_RESERVED_KEYS}
    data, extras = _language_extras(data)
    try:
        cfg = HookConfig.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = _loc(err["loc"])
            if err["type"] == "extra_forbidden":
                problems.append(f"unknown option {loc!r}{_did_you_mean(err['loc'])}")
            elif err["type"] == "missing":
                problems.append(f"option {loc!r} is required")
            else:
                msg = str(err["msg"]).removeprefix("Value error, ")
                problems.append(f"option {loc!r}: {msg} (got {err.get('input')!r})")
        raise ConfigError(f"{where}: invalid configuration: " + "; ".join(problems)) from None

    env_archs = _env_archs()
    env_ptx = _env_ptx()
    languages = [_language(where, i, c, extras.get(i, {})) for i, c in enumerate(cfg.crates)]
    names = [lang.name for lang in languages]
    resolved = []
    for i, c in enumerate(cfg.crates):
        package = c.package or cfg.package or default_package
        if not package:
            raise ConfigError(
                f"{where}: crates[{i}] {c.name!r}: option 'package' is not set and no default could be "
                "derived from the project name; set 'package' to the package directory"
            )
        archs = env_archs or list(c.archs or cfg.archs or DEFAULT_ARCHS)
        ptx = cfg.ptx_arch if c.ptx_arch == "default" else c.ptx_arch
        if env_ptx is not None:
            ptx = None if env_ptx == "none" else env_ptx
        lang = languages[i]
        language = lang.name
        own = lang.validate_options(f"{where}: crates[{i}] {c.name!r}", extras[i]) if i in extras else {}
        resolved.append(
            ResolvedCrate(
                name=c.name,
                language=language,
                sources=list(c.sources or []),
                include_dirs=list(cfg.include_dirs) + list(c.include_dirs),
                package=canonical_package(package),
                archs=sorted(set(archs), key=lambda a: (_cubin_arch(a).number, a)),
                archs_explicit=env_archs is not None or c.archs is not None or cfg.archs is not None,
                ptx_arch=ptx,
                options=list(cfg.options) + list(c.options),
                defines={**cfg.defines, **c.defines},  # type: ignore[dict-item]  # validated to str
                cuda_headers=c.cuda_headers or cfg.cuda_headers,
                spirv=c.spirv,
                slang_options=(list(cfg.slang_options) + list(c.slang_options)
                               if "slang-options" in lang.crate_options else []),
                instances=list(c.instances or []),
                modules=list(c.modules or []),
                jit_fallback=bool(c.jit_fallback),
                triton_lock=cfg.triton_lock or DEFAULT_TRITON_LOCK,
                triton_lock_explicit=cfg.triton_lock is not None,
                language_crates=[c2.name for c2, n in zip(cfg.crates, names) if n == language],
                language_options=own,
            )
        )
    return cfg, resolved


def __getattr__(name: str) -> Any:
    """``LANGUAGE_SUFFIXES`` (suffix -> language) of the previous release, made from the languages'
    own ``suffixes`` now, with a warning naming where they live."""
    if name == "LANGUAGE_SUFFIXES":
        import warnings  # lazy: only when the old name is read

        from hatch_khal.languages import all_languages  # lazy: the registry imports this module

        warnings.warn("hatch_khal.config.LANGUAGE_SUFFIXES is deprecated: each language says its own suffixes "
                      "(hatch_khal.languages.all_languages()[name].suffixes)", DeprecationWarning, stacklevel=2)
        return {suffix: lang.name for lang in all_languages().values() for suffix in lang.suffixes}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


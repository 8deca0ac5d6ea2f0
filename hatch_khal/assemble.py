"""Stage 3: turn the compile stage's records (:class:`~hatch_khal.languages.Compiled`) into
manifests and package files.

Every CUDA binary (compiled, cached or prebuilt) is read back: each entry symbol must carry
the hash the current sources give. The crate's language then makes the manifest entries, each
parameter's size, alignment and type from the compiler's own probes in the binary
(:mod:`hatch_khal.probes` for CUDA C++; reflection checked against them for Slang), and adds its
other artifacts (:meth:`hatch_khal.languages.Language.finish`: WGSL / SPIR-V for Slang).
Prebuilt files (``CUDA_OXIDE_SHADERS_PTX_<CRATE>``) enter here, read as regular files of bounded
size only; they replace the crate's CUDA binaries, nothing else.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from khal_runtime.abi import parse_arch, symbol_for
from khal_runtime.binaries import BinaryFormatError, BinaryInfo, khal_symbols, read_binary
from khal_runtime.manifest_load import DIGEST_NAME, build_digest
from khal_runtime.manifest import (
    MANIFEST_DIR,
    MANIFEST_NAME,
    SCHEMA_VERSION,
    Artifact,
    Crate,
    Editable,
    Manifest,
    Prebuilt,
    SourceFile,
    Toolchain,
    read_regular_file,
)

from hatch_khal.errors import KhalBuildError, PrebuiltError
from hatch_khal.hashing import sha256_bytes
from hatch_khal.languages import Compiled, Language
from hatch_khal.model import PackageOutput
from hatch_khal.stubs import stub_files

__all__ = ["MAX_PREBUILT_BYTES", "assemble_packages"]

#: A prebuilt binary larger than this is refused unread (real ones are a few MB).
MAX_PREBUILT_BYTES = 256 << 20


def _check_binary(crate: Compiled[Any, Any], info: BinaryInfo, what: str, error: type[KhalBuildError],
                  hint: str = "") -> None:
    """Every entry symbol (direct and indirect) carries the hash the current sources give."""
    found = khal_symbols(info)
    for e in crate.entries:
        got = found.get(e.name)
        if got is None:
            raise error(
                f"crate {crate.cfg.name!r}: {what} has no kernel for entry {e.name!r} "
                f"(expected symbol {symbol_for(e.name, e.hash)}){hint}"
            )
        if got != e.hash:
            raise error(
                f"crate {crate.cfg.name!r}: entry {e.name!r}: {what} carries hash {got}, the current "
                f"sources give {e.hash}{hint}"
            )
    expected = {e.name for e in crate.entries} | {f"{e.name}_indirect" for e in crate.entries}
    extra = sorted(set(found) - expected)
    if extra:
        raise error(
            f"crate {crate.cfg.name!r}: {what} has kernels for entries this crate does not define "
            f"({', '.join(extra)}): is it the binary of another crate?{hint}"
        )


class _Unreadable(Exception):
    pass


def _read_prebuilt(crate: Compiled[Any, Any], var: str, root: Path) -> tuple[bytes, BinaryInfo, Path]:
    """The binary the variable ``var`` names (its bytes, what it holds, its path), checked."""
    name = crate.cfg.name
    raw = os.environ[var]
    path = Path(raw)
    if not path.is_absolute():
        path = root / path
    if path.is_dir():
        raise PrebuiltError(f"{var}={raw}: is a directory; point it at a .ptx or .cubin file")
    try:
        # a regular file of bounded size: never /dev/zero, a FIFO or a huge sparse file
        data = read_regular_file(path, MAX_PREBUILT_BYTES, "it", _Unreadable)
    except FileNotFoundError:
        raise PrebuiltError(f"{var}={raw}: no such file (crate {name!r})") from None
    except _Unreadable as exc:
        reason = str(exc).removeprefix(f"{path}: ")
        raise PrebuiltError(f"{var}={raw}: {reason} (crate {name!r}); point {var} at a .ptx or "
                            ".cubin file") from None
    if not data:
        raise PrebuiltError(f"{var}={raw}: file is empty; expected PTX text or a cubin")
    try:
        info = read_binary(data, f"{var}={raw}")
    except BinaryFormatError as exc:
        raise PrebuiltError(str(exc)) from None
    _check_binary(crate, info, f"prebuilt {info.kind} {path.name}", PrebuiltError,
                  f" ({var}={path}); rebuild that file from the current sources or unset {var}")
    if info.kind == "cubin" and f"sm_{info.arch}" not in crate.cfg.archs:
        raise PrebuiltError(
            f"{var}={raw}: the cubin is for sm_{info.arch}, but crate {name!r} targets "
            f"{', '.join(crate.cfg.archs)}; build it for one of those, add sm_{info.arch} to 'archs', "
            "or give PTX instead"
        )
    return data, info, path


def _artifact(crate: str, kind: str, arch: str, data: bytes, isa: str | None) -> tuple[Artifact, str]:
    ext = "ptx" if kind == "ptx" else "cubin"
    path = f"{MANIFEST_DIR}/{crate}/{crate}.{arch}.{ext}"
    art = Artifact(kind=kind, arch=arch, path=path, sha256=sha256_bytes(data), size=len(data),  # type: ignore[arg-type]
                   ptx_isa=isa)
    return art, path


def _finish_crate(crate: Compiled[Any, Any], root: Path) -> tuple[Crate, dict[str, bytes], tuple[str, ...]]:
    """The crate's manifest record, its files, and what its language found worth saying."""
    cfg = crate.cfg
    files: dict[str, bytes] = {}
    artifacts: list[Artifact] = []
    prebuilt: Prebuilt | None = None
    probe_info: BinaryInfo | None = None
    if crate.prebuilt_var:
        data, info, path = _read_prebuilt(crate, crate.prebuilt_var, root)
        art, rel = _artifact(cfg.name, info.kind, info.arch_name, data, info.ptx_isa)
        artifacts.append(art)
        files[rel] = data
        prebuilt = Prebuilt(variable=crate.prebuilt_var, kind=info.kind,  # type: ignore[arg-type]
                            file_name=path.name)
        probe_info = info
    else:
        isa = None
        infos: list[tuple[str, bytes, BinaryInfo]] = []
        for target, output in crate.outputs.items():
            data = output.data
            try:
                info = read_binary(data, f"crate {cfg.name} {target}")
            except BinaryFormatError as exc:
                raise KhalBuildError(f"the compiler produced an unreadable binary: {exc}") from None
            _check_binary(crate, info, f"compiled {target}", KhalBuildError)
            if info.kind == "ptx":
                isa = info.ptx_isa
            infos.append((target, data, info))
        for target, data, info in infos:
            kind = "ptx" if target.startswith("compute_") else "cubin"
            # arch-specific code (Triton writes sm_90a for sm_90) is recorded as such: the loader
            # then picks it for its own arch only, never a later one of its major
            if info.arch_specific and not parse_arch(target).suffix:
                target += "a"
            art, rel = _artifact(cfg.name, kind, target, data, info.ptx_isa or isa)
            artifacts.append(art)
            files[rel] = data
            if probe_info is None or info.kind == "ptx":
                probe_info = info
    assert probe_info is not None
    parts = crate.finish(probe_info)
    if sorted((e.name, e.hash) for e in parts.entries) != sorted((e.name, e.hash) for e in crate.entries):
        raise KhalBuildError(f"crate {cfg.name!r}: the {crate.language.name} language made entries "
                             f"{[e.name for e in parts.entries]} for planned {[e.name for e in crate.entries]}")
    artifacts += parts.artifacts
    files.update(parts.files)
    record = Crate(
        name=cfg.name,
        language=crate.language.name,
        package_dir=f"{MANIFEST_DIR}/{cfg.name}",
        sources=tuple(SourceFile(path=f.rel, sha256=sha256_bytes(f.data)) for f in crate.files),
        content_hash=crate.content_hash,
        artifacts=tuple(sorted(artifacts, key=lambda a: (a.kind, a.sm or 0, a.arch or "", a.path))),
        entries=parts.entries,
        prebuilt=prebuilt,
        spirv=crate.spirv,
        globals=parts.globals or None,  # absent when none: manifests without globals read as before
        triton=parts.triton,
    )
    return record, files, parts.warnings


def assemble_packages(
    crates: list[Compiled[Any, Any]],
    root: Path,
    toolchain: Toolchain,
    *,
    editable: bool = False,
) -> tuple[list[PackageOutput], list[str]]:
    """One :class:`PackageOutput` per target package, sorted by package; and the warnings the
    crates' languages gave, in the crates' order (the builder shows them)."""
    records: dict[str, list[Crate]] = {}
    #: crate -> its record's language (the stub asks it for the crate's attributes)
    languages: dict[str, Language[Any, Any]] = {}
    files: dict[str, dict[str, bytes]] = {}
    warnings: list[str] = []
    for crate in crates:
        record, crate_files, crate_warnings = _finish_crate(crate, root)
        languages[crate.cfg.name] = crate.language
        records.setdefault(crate.cfg.package, []).append(record)
        files.setdefault(crate.cfg.package, {}).update(crate_files)
        warnings.extend(crate_warnings)
    out = []
    for package in sorted(records):
        manifest = Manifest(
            schema_version=SCHEMA_VERSION,
            package=package.split("/")[-1],
            toolchain=toolchain,
            crates=tuple(sorted(records[package], key=lambda c: c.name)),
            editable=Editable(project_root=str(root)) if editable else None,
        )
        pkg_files = files[package]
        data = manifest.to_json().encode()
        pkg_files[f"{MANIFEST_DIR}/{MANIFEST_NAME}"] = data
        # what lets the runtime read it without building pydantic's validators (khal_runtime.manifest_load)
        digest = build_digest(data)
        if digest is not None:
            pkg_files[f"{MANIFEST_DIR}/{DIGEST_NAME}"] = (digest + "\n").encode()
        # the typed kernels module: `from ._khal import kernels` (a pure function of the manifest)
        pkg_files.update(stub_files(manifest, languages=languages))
        out.append(PackageOutput(package, manifest, pkg_files))
    return out, warnings

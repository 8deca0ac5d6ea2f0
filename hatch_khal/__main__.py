"""``python -m hatch_khal inspect|verify PATH``: look into a built shader package, no GPU needed;
``python -m hatch_khal triton record -- CMD``: record the Triton launches of a command into the
project's lock file (:mod:`hatch_khal.triton.record`).
``shard`` / ``merge``: a build split across CI jobs (:mod:`hatch_khal.distributed`).

PATH is a wheel (``.whl``), a directory (a package directory holding
``_khal/manifest.json``, or a tree with such packages below it), or the name of
an installed package. A wheel is read in place: its manifests (capped) and, for ``verify``, the
artifacts they list, streamed with the manifest's sizes as caps; nothing else in it is read.

Everything printed is escaped: a control character (or any other unprintable one) from a
manifest, a path or an error appears as ``\x1b``, ``\u202e``..., so a hand-made manifest cannot
send terminal escape sequences.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import zipfile
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Callable, Iterator

from khal_runtime import manifest as _manifest
from khal_runtime.binaries import ptx_driver_note
from khal_runtime.errors import ArtifactError, KhalError, ManifestError
from khal_runtime.manifest import (MANIFEST_DIR, MANIFEST_NAME, Artifact, Manifest,
                                   load_manifest, parse_manifest)

from hatch_khal.__about__ import __version__
from hatch_khal.errors import KhalBuildError

if TYPE_CHECKING:
    from hatch_khal.languages import Language

__all__ = ["main"]

_MANIFEST_SUFFIX = f"{MANIFEST_DIR}/{MANIFEST_NAME}"


class UsageError(Exception):
    pass


@dataclass
class _Package:
    """One package found: its manifest, and where its artifacts are read from (a directory, or
    the members of a wheel, streamed with the manifest's sizes as caps)."""

    where: str
    manifest: Manifest
    directory: Path | None = None
    read: Callable[[Artifact], bytes] | None = None


def _member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, limit: int, what: str) -> bytes:
    """A wheel member's bytes, at most ``limit`` (the archive's declared size is checked first,
    then at most ``limit + 1`` bytes are decompressed)."""
    if info.file_size > limit:
        raise UsageError(f"{what} is {info.file_size} bytes, more than the {limit} allowed")
    with zf.open(info) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise UsageError(f"{what} is more than the {limit} bytes allowed")
    return data


def _wheel(path: Path, zf: zipfile.ZipFile) -> list[_Package]:
    """The packages of a wheel. Only each ``_khal/manifest.json`` (capped) and, on demand, the
    artifacts its manifest lists (capped by their sizes) are read: nothing is extracted."""
    infos = {i.filename: i for i in zf.infolist()}
    names = sorted(n for n in infos if n.endswith(_MANIFEST_SUFFIX))
    if not names:
        raise UsageError(f"{path}: the wheel holds no {_MANIFEST_SUFFIX}; was it built with the khal hook?")
    out = []
    for name in names:
        parts = PurePosixPath(name).parts
        if ".." in parts or name.startswith("/"):
            raise UsageError(f"{path}: member {name!r} leaves the archive")
        prefix = name[: -len(_MANIFEST_SUFFIX)]
        text = _member(zf, infos[name], _manifest.MAX_MANIFEST_BYTES, f"{path}: {name}")
        manifest = parse_manifest(text, f"{path}: {name}")

        def read(art: Artifact, prefix: str = prefix) -> bytes:
            from khal_runtime.verify import read_artifact_stream  # lazy: only the verify command needs it

            info = infos.get(prefix + art.path)
            if info is None:
                raise ArtifactError(f"artifact {art.path!r} is missing from the wheel; rebuild the package")
            try:
                with zf.open(info) as f:
                    return read_artifact_stream(f, art, info.file_size)
            except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, OSError) as exc:
                raise ArtifactError(f"artifact {art.path!r}: damaged wheel member ({exc})") from None

        out.append(_Package(f"{path}!{prefix or '/'}", manifest, read=read))
    return out


def _shadowed(target: str, local: Path) -> Path | None:
    """The installed package ``target`` (a dotted name) holding a manifest, looked up on
    ``sys.path`` without the entries that are the current directory, where ``local``, a folder
    of that name without a manifest (a project's source folder), shadows it; None if none."""
    if not all(p.isidentifier() for p in target.split(".")):
        return None
    here = Path.cwd().resolve()
    search = []
    for entry in sys.path:
        try:
            if Path(entry or ".").resolve() != here:
                search.append(entry)
        except (OSError, RuntimeError):
            continue
    parts = target.split(".")
    for entry in search:
        candidate = Path(entry, *parts)
        try:
            if candidate.resolve() != local.resolve() and (candidate / _MANIFEST_SUFFIX).is_file():
                return candidate
        except (OSError, RuntimeError):
            continue
    return None


@contextmanager
def _packages(target: str) -> Iterator[list[_Package]]:
    """The packages (each with its manifest) that ``target`` names."""
    path = Path(target)
    if path.is_file() and path.suffix == ".whl":
        try:
            with zipfile.ZipFile(path) as zf:
                yield _wheel(path, zf)
        except zipfile.BadZipFile as exc:
            raise UsageError(f"{path}: not a valid wheel ({exc})") from None
        return
    if path.is_dir():
        if (path / _MANIFEST_SUFFIX).is_file():
            found = [path]
        else:
            found = sorted(p.parent.parent for p in path.rglob(_MANIFEST_SUFFIX))
        if not found:
            installed = _shadowed(target, path)
            if installed is None:
                raise UsageError(
                    f"{path}: no {_MANIFEST_SUFFIX} in or below this directory ({path.resolve()})"
                    + (f"; no installed package {target!r} outside it either"
                       if all(p.isidentifier() for p in target.split(".")) else ""))
            _print([f"note: {path.resolve()} (a folder without {_MANIFEST_SUFFIX}, the local source "
                    f"folder) shadows the installed package {target!r} here; using the installed one "
                    f"at {installed}"], err=True)
            found = [installed]
        yield [_Package(str(d), load_manifest(d / _MANIFEST_SUFFIX), directory=d) for d in found]
        return
    if path.exists():
        raise UsageError(f"{path}: expected a .whl file, a directory or an installed package name")
    try:
        spec = importlib.util.find_spec(target)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise UsageError(f"{target!r} is neither a file, a directory nor an installed package")
    dirs = [Path(p) for p in spec.submodule_search_locations if (Path(p) / _MANIFEST_SUFFIX).is_file()]
    if not dirs:
        raise UsageError(f"package {target!r} ({', '.join(spec.submodule_search_locations)}) has no "
                         f"{_MANIFEST_SUFFIX}; was it built with the khal hook?")
    yield [_Package(str(d), load_manifest(d / _MANIFEST_SUFFIX), directory=d) for d in dirs]


def printable(text: str) -> str:
    """``text`` with every unprintable character (C0 / C1 controls, ESC, DEL, bidi overrides,
    line separators, ...) written as a Python escape: safe to print to a terminal."""
    if text.isprintable():
        return text
    out = []
    for c in text:
        if c.isprintable():
            out.append(c)
        else:
            o = ord(c)
            out.append(f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}")
    return "".join(out)


def _print(lines: list[str], *, err: bool = False) -> None:
    """Print ``lines``, each escaped (:func:`printable`: a newline inside one is escaped too)."""
    print("\n".join(printable(line) for line in lines), file=sys.stderr if err else sys.stdout)


def _language_of(name: str) -> Language[Any, Any] | None:
    """The build side of a crate's language, None where it is not installed here (a plugin's)."""
    from hatch_khal.languages import get_language  # lazy: the language's module only when describing its crate

    try:
        return get_language(name, "")
    except KhalBuildError:
        return None


def _describe(manifest: Manifest) -> list[str]:
    tc = manifest.toolchain
    tools = f"NVRTC {tc.nvrtc_version or '-'}" + (f", Slang {tc.slang_version}" if tc.slang_version else "") \
        + (f", Triton {tc.triton_version}" if tc.triton_version else "")
    lines = [
        f"package {manifest.package} (schema {manifest.schema_version}, hatch-khal {tc.hatch_khal_version}, {tools})"
    ]
    if manifest.editable:
        lines.append(f"  editable install of {manifest.editable.project_root}")
    for crate in manifest.crates:
        lang = _language_of(crate.language)
        language = lang.title if lang is not None else crate.language
        origin = (f"prebuilt from {crate.prebuilt.variable} ({crate.prebuilt.file_name})" if crate.prebuilt
                  else lang.compiled_by if lang is not None else f"language {crate.language!r} (not installed here)")
        spirv = crate.spirv.status + (f" ({crate.spirv.reason})" if crate.spirv.reason else "")
        lines.append(f"  crate {crate.name}: {language}, {len(crate.sources)} source file(s), CUDA binaries "
                     f"from {origin}, WGSL/SPIR-V {spirv}")
        for e in crate.entries:
            params = ", ".join(
                f"{p.name}: {p.kind} {p.element_type}[{p.element_size}B]"
                + (f" {p.shape}" if p.shape and p.shape != "slice" else "")
                + (" rw" if p.writable else "")
                for p in e.params
            )
            bx, by, bz = e.block_size
            block = f"{bx}" if by == bz == 1 else f"{bx}x{by}" if bz == 1 else f"{bx}x{by}x{bz}"
            shape = (f" {e.grid_dims}-D" if e.grid_dims > 1 else "") + \
                ("" if e.launch_block_fixed else f" (any block up to {e.max_block_threads})")
            if e.launch is not None and e.launch_dims > e.grid_dims:
                shape += f" (launch() up to {e.launch_dims}-D grids)"
            tmpl = f" = {e.template}<{', '.join(e.template_args or ())}>" if e.template else ""
            # what the entry's language says of it (a Triton variant: its kernel, specialisation, options)
            label, more = lang.inspect_entry(e) if lang is not None else (None, [])
            if label is not None:
                tmpl = f" = {label}"
            lines.append(f"    entry {e.name}{tmpl} hash {e.hash} block {block}{shape}  ({params})")
            lines += more
            if e.attributes is not None and e.attributes.describe():
                lines.append(f"      launch attributes: {e.attributes.describe()}")
            if e.indirect_reason:
                lines.append(f"      no indirect variant: {e.indirect_reason}")
            if e.launch is not None and e.launch.reads:
                lines.append(f"      launch facts ({e.launch.source}): reads {', '.join(e.launch.reads)}")
            for t in e.webgpu or ():
                scalars = f", scalars in {t.scalars.replace('_', ' ')}" if t.scalars else ""
                lines.append(f"      {t.target:5} entry point {t.entry_point}  {len(t.bindings)} binding(s)"
                             f"{scalars}  {t.path}")
        for g in crate.globals or ():
            lines.append(f"    global {g.name}: {g.space} {g.type} x {g.size // g.element_size} ({g.size} B)")
        for a in crate.artifacts:
            isa = f"PTX ISA {a.ptx_isa or '-'}  " if a.kind in ("ptx", "cubin") else ""
            lines.append(f"    {a.kind:5} {a.arch or '-':11} {a.size:>9} B  sha256 {a.sha256[:16]}…  {isa}{a.path}")
            note = ptx_driver_note(a.ptx_isa) if a.kind == "ptx" else ""
            if note:  # a cubin loads on any driver of its CUDA major; PTX only on one that JITs its ISA
                lines.append(f"      the PTX {note} to JIT (cubins are unaffected)")
    return lines


def _inspect(target: str, as_json: bool) -> int:
    with _packages(target) as packages:
        manifests = [p.manifest for p in packages]
    if as_json:
        data = [m.model_dump(mode="json", exclude_none=True) for m in manifests]
        print(json.dumps(data[0] if len(data) == 1 else data, indent=2, sort_keys=True))  # ASCII, escaped
    else:
        _print([line for m in manifests for line in _describe(m)])
    return 0


def _verify(target: str) -> int:
    from khal_runtime.verify import Problem, verify_package  # lazy: only the verify command needs it

    bad = 0
    checked = 0
    with _packages(target) as packages:
        for pkg in packages:
            manifest = pkg.manifest
            if pkg.directory is not None:
                problems = verify_package(pkg.directory, manifest)
            else:
                problems = verify_package(pkg.where, manifest, sources=False, read=pkg.read)
                if manifest.editable is not None:
                    problems.insert(0, Problem("manifest", "", "the manifest of a wheel has an editable-install "
                                               "record (a wheel never has one): it was edited; rebuild the package",
                                               ManifestError))
            checked += sum(len(c.artifacts) for c in manifest.crates)
            for p in problems:
                _print(f"FAIL {manifest.package}: {p}".split("\n"), err=True)
            bad += len(problems)
    if bad:
        print(f"verify: {bad} problem(s) found", file=sys.stderr)
        return 1
    print(f"verify: OK ({checked} artifact(s) in {len(packages)} package(s): sha256 and entry hashes (symbols, "
          "WGSL / SPIR-V entry points), WebGPU bindings and layouts, element sizes match)")
    return 0


def _record(args: argparse.Namespace) -> int:
    from hatch_khal.triton.record import record  # lazy: only this command needs it

    command = list(args.cmd)
    if command[:1] == ["--"]:
        command = command[1:]
    return record(Path(args.project), command, lock=Path(args.lock) if args.lock else None,
                  crate_names=args.crate, replace=args.replace)
def _split(args: argparse.Namespace) -> int:
    """The ``split`` command."""
    from hatch_khal.model import PrintReporter  # lazy: the split command only
    from hatch_khal.split import parse_size, split_wheel  # lazy: as above

    wheel = Path(args.wheel)
    if not wheel.is_file():
        raise UsageError(f"{wheel}: no such wheel")
    out = Path(args.out) if args.out else wheel.parent
    for path in split_wheel(wheel, out, parse_size(args.max_size, "--max-size"), PrintReporter(), force=args.force):
        print(path)
    return 0


def _distributed(args: argparse.Namespace) -> int:
    """The ``shard`` and ``merge`` commands."""
    # lazy: the build core, for these two commands only
    from hatch_khal.distributed import build_shard, merge_shards
    from hatch_khal.model import PrintReporter
    from hatch_khal.shards import SHARD_ENV, parse_shard

    reporter = PrintReporter()
    if args.command == "merge":
        from hatch_khal.split import parse_size, split_wheel  # lazy: the merge command only

        limit = None if args.max_size.strip().lower() == "none" else parse_size(args.max_size, "--max-size")
        wheel = merge_shards([Path(s) for s in args.shards], Path(args.project), Path(args.wheel_dir), reporter)
        for path in split_wheel(wheel, wheel.parent, limit, reporter) if limit is not None else [wheel]:
            print(path)
        return 0
    text = args.shard if args.shard is not None else os.environ.get(SHARD_ENV, "").strip()
    if not text:
        raise UsageError(f"shard: which shard? give --shard I/N (or arch=..., crate=...) or set {SHARD_ENV}")
    spec = parse_shard(text, "--shard" if args.shard is not None else SHARD_ENV)
    out = Path(args.out) if args.out else Path(f"khal-shard-{spec.label.replace('/', '-of-').replace('=', '-')}")
    env_shard = os.environ.pop(SHARD_ENV, None)  # the build below is the shard's own, not a wheel build
    try:
        build_shard(Path(args.project), spec, out, reporter)
    finally:
        if env_shard is not None:
            os.environ[SHARD_ENV] = env_shard
    return 0


_DESCRIPTION = (
    "Look into a built shader package, no GPU needed. PATH is a wheel (.whl), a directory (a "
    "package directory holding _khal/manifest.json, or a tree with such packages below it), or "
    "the name of an installed package. triton record runs a command and records the Triton "
    "variants it launches into the project's lock file; shard, merge and split build at scale "
    "(a build split across CI jobs, wheels within the index's size limit)."
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hatch_khal", description=_DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"hatch-khal {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p_inspect = sub.add_parser("inspect", help="print crates, entries, hashes, parameters and artifacts")
    p_inspect.add_argument("path", help="a wheel, a directory or an installed package name")
    p_inspect.add_argument("--json", action="store_true", help="print the manifest as JSON")
    p_verify = sub.add_parser("verify", help="check every sha256 and every entry hash; non-zero exit on mismatch")
    p_verify.add_argument("path", help="a wheel, a directory or an installed package name")
    p_triton = sub.add_parser("triton", help="Triton crates: record the variants a command launches")
    triton_sub = p_triton.add_subparsers(dest="triton_command", required=True)
    p_record = triton_sub.add_parser(
        "record", help="run a command and record every launch of the project's Triton kernels into the lock file",
        description="Run COMMAND (after `--`) and record the variant Triton's JIT compiles for each launch of the "
                    "project's Triton crates' kernels into the lock file, which the build compiles. With "
                    "TRITON_INTERPRET=1, Triton's interpreter runs the kernels on the CPU and the variants are "
                    "those the JIT would compile on an NVIDIA GPU.")
    p_record.add_argument("--project", metavar="DIR", default=".",
                          help="the project whose pyproject.toml declares the crates (default: the current directory)")
    p_record.add_argument("--lock", metavar="FILE", help="the lock file (default: the hook option 'triton-lock', "
                          "else khal-triton.lock in the project)")
    p_record.add_argument("--crate", metavar="NAME", action="append", default=[],
                          help="record this crate only (repeatable; default: every Triton crate)")
    p_record.add_argument("--replace", action="store_true",
                          help="drop the lock file's entries of the recorded crates (every entry without --crate) "
                               "instead of merging")
    p_record.add_argument("cmd", metavar="command", nargs=argparse.REMAINDER, help="the command to run, after `--`")
    p_shard = sub.add_parser("shard", help="compile one shard of a project's kernels into a partial artifact set "
                             "(a CI job of a split build)")
    p_shard.add_argument("project", nargs="?", default=".", help="the project's folder (default: here)")
    p_shard.add_argument("--shard", default=None, help="I/N (shard I of an N-way split of the compile jobs), "
                         "arch=sm_90[,...] or crate=NAME[,...]; default: $KHAL_SHARD")
    p_shard.add_argument("--out", default=None, help="the folder to write (default: khal-shard-<shard>)")
    p_merge = sub.add_parser("merge", help="build the wheel from the shards' partial artifact sets, compiling nothing")
    p_merge.add_argument("shards", nargs="+", help="the folders `shard --out` wrote, one per shard")
    p_merge.add_argument("--project", default=".", help="the project's folder (default: here)")
    p_merge.add_argument("--wheel-dir", default="dist", help="where the wheel goes (default: dist)")
    p_merge.add_argument("--max-size", default="100MB", help="a wheel above this size is split into companion "
                         "distributions per arch family, as `split` does (default 100MB; none: never)")
    p_split = sub.add_parser("split", help="a wheel above the index's size limit: the main wheel plus one companion "
                             "distribution of cubins per arch family")
    p_split.add_argument("wheel", help="the wheel to split")
    p_split.add_argument("--max-size", default="100MB", help="the index's limit per file (default 100MB)")
    p_split.add_argument("--out", default=None, help="where the wheels go (default: the wheel's folder, replacing it)")
    p_split.add_argument("--force", action="store_true", help="split even when the wheel is within the limit")
    args = parser.parse_args(argv)
    try:
        try:
            if args.command == "triton":
                rc = _record(args)
            elif args.command == "split":
                rc = _split(args)
            elif args.command in ("shard", "merge"):
                rc = _distributed(args)
            else:
                rc = _inspect(args.path, args.json) if args.command == "inspect" else _verify(args.path)
        except (UsageError, KhalError, KhalBuildError) as exc:
            _print(f"error: {exc}".split("\n"), err=True)
            rc = 2
        sys.stdout.flush()
    except BrokenPipeError:
        # the reader went away (``... | head``): stop quietly, as the CPython documentation
        # recommends (signal module, "Note on SIGPIPE"): the rest of the output goes nowhere,
        # so that the interpreter's own flush at exit does not fail again
        devnull = os.open(os.devnull, os.O_WRONLY)
        for stream in (sys.stdout, sys.stderr):
            try:
                os.dup2(devnull, stream.fileno())
            except (OSError, ValueError, AttributeError):
                pass
        return 1
    return rc


if __name__ == "__main__":
    sys.exit(main())

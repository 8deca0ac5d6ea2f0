"""``python -m hatch_khal inspect|verify PATH``: look into a built shader package, no GPU needed.

PATH is a wheel (``.whl``), a directory (a package directory holding
``_khal/manifest.json``, or a tree with such packages below it), or the name of
an installed package.

Everything printed is escaped: a control character (or any other unprintable one) from a
manifest, a path or an error appears as ``\x1b``, ``\u202e``..., so a hand-made manifest cannot
send terminal escape sequences.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import zipfile
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Iterator

from khal_runtime.errors import KhalError
from khal_runtime.manifest import MANIFEST_DIR, MANIFEST_NAME, Manifest, load_manifest

from hatch_khal.__about__ import __version__

__all__ = ["main"]

_MANIFEST_SUFFIX = f"{MANIFEST_DIR}/{MANIFEST_NAME}"


class UsageError(Exception):
    pass


@contextmanager
def _package_dirs(target: str) -> Iterator[list[Path]]:
    """Yield the package directories (holding _khal/manifest.json) that ``target`` names."""
    path = Path(target)
    if path.is_file() and path.suffix == ".whl":
        with tempfile.TemporaryDirectory(prefix="khal-inspect-") as tmp:
            try:
                with zipfile.ZipFile(path) as zf:
                    names = [n for n in zf.namelist() if n.endswith(_MANIFEST_SUFFIX)]
                    for member in zf.namelist():
                        if "/" + MANIFEST_DIR + "/" in "/" + member:
                            # Extract only our own files, confined to the temp dir.
                            parts = PurePosixPath(member).parts
                            if ".." in parts or member.startswith("/"):
                                raise UsageError(f"{path}: member {member!r} leaves the archive")
                            zf.extract(member, tmp)
            except zipfile.BadZipFile as exc:
                raise UsageError(f"{path}: not a valid wheel ({exc})") from None
            if not names:
                raise UsageError(f"{path}: the wheel holds no {_MANIFEST_SUFFIX}; was it built with the khal hook?")
            yield [Path(tmp, n).parent.parent for n in sorted(names)]
        return
    if path.is_dir():
        if (path / _MANIFEST_SUFFIX).is_file():
            yield [path]
            return
        found = sorted(p.parent.parent for p in path.rglob(_MANIFEST_SUFFIX))
        if not found:
            raise UsageError(f"{path}: no {_MANIFEST_SUFFIX} in or below this directory")
        yield found
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
        raise UsageError(f"package {target!r} has no {_MANIFEST_SUFFIX}; was it built with the khal hook?")
    yield dirs


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


def _describe(manifest: Manifest) -> list[str]:
    tc = manifest.toolchain
    tools = f"NVRTC {tc.nvrtc_version or '-'}" + (f", Slang {tc.slang_version}" if tc.slang_version else "")
    lines = [
        f"package {manifest.package} (schema {manifest.schema_version}, hatch-khal {tc.hatch_khal_version}, {tools})"
    ]
    if manifest.editable:
        lines.append(f"  editable install of {manifest.editable.project_root}")
    for crate in manifest.crates:
        language = {"cuda": "CUDA C++", "slang": "Slang"}.get(crate.language, crate.language)
        origin = f"prebuilt from {crate.prebuilt.variable} ({crate.prebuilt.file_name})" if crate.prebuilt else "NVRTC"
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
            lines.append(f"    entry {e.name}{tmpl} hash {e.hash} block {block}{shape}  ({params})")
            if e.indirect_reason:
                lines.append(f"      no indirect variant: {e.indirect_reason}")
            if e.launch is not None and e.launch.reads:
                lines.append(f"      launch facts ({e.launch.source}): reads {', '.join(e.launch.reads)}")
            for t in e.webgpu or ():
                scalars = f", scalars in {t.scalars.replace('_', ' ')}" if t.scalars else ""
                lines.append(f"      {t.target:5} entry point {t.entry_point}  {len(t.bindings)} binding(s)"
                             f"{scalars}  {t.path}")
        for a in crate.artifacts:
            isa = f"PTX ISA {a.ptx_isa or '-'}  " if a.kind in ("ptx", "cubin") else ""
            lines.append(f"    {a.kind:5} {a.arch or '-':11} {a.size:>9} B  sha256 {a.sha256[:16]}…  {isa}{a.path}")
    return lines


def _inspect(target: str, as_json: bool) -> int:
    with _package_dirs(target) as dirs:
        manifests = [load_manifest(d / _MANIFEST_SUFFIX) for d in dirs]
    if as_json:
        data = [m.model_dump(mode="json", exclude_none=True) for m in manifests]
        print(json.dumps(data[0] if len(data) == 1 else data, indent=2, sort_keys=True))  # ASCII, escaped
    else:
        _print([line for m in manifests for line in _describe(m)])
    return 0


def _verify(target: str) -> int:
    from khal_runtime.verify import verify_package  # lazy: only the verify command needs it

    bad = 0
    checked = 0
    with _package_dirs(target) as dirs:
        for d in dirs:
            manifest = load_manifest(d / _MANIFEST_SUFFIX)
            problems = verify_package(d, manifest)
            checked += sum(len(c.artifacts) for c in manifest.crates)
            for p in problems:
                _print(f"FAIL {manifest.package}: {p}".split("\n"), err=True)
            bad += len(problems)
    if bad:
        print(f"verify: {bad} problem(s) found", file=sys.stderr)
        return 1
    print(f"verify: OK ({checked} artifact(s) in {len(dirs)} package(s): sha256 and entry hashes (symbols, "
          "WGSL / SPIR-V entry points) match)")
    return 0


_DESCRIPTION = (
    "Look into a built shader package, no GPU needed. PATH is a wheel (.whl), a directory (a "
    "package directory holding _khal/manifest.json, or a tree with such packages below it), or "
    "the name of an installed package."
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
    args = parser.parse_args(argv)
    try:
        if args.command == "inspect":
            return _inspect(args.path, args.json)
        return _verify(args.path)
    except (UsageError, KhalError) as exc:
        _print(f"error: {exc}".split("\n"), err=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())

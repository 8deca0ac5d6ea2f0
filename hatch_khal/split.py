"""``python -m hatch_khal split WHEEL``: a wheel within the index's size limit, plus companion
distributions that carry its cubins per arch family.

When the wheel is larger than the limit (default 100 MB, PyPI's default per file), each arch
family's cubins (``sm_90`` and ``sm_90a`` make ``sm90``) move into a wheel of their own,
``<name>-kernels-sm90``, of the same version: a module ``<package>_kernels_sm90`` holding them
under the paths the manifest gives, and ``_khal/companion.json`` (the package, the exact version it
requires, the sha256 of the manifest it was split from). It declares itself to the runtime with an
entry point (group ``khal_runtime.companions``, named after the package) and requires the main
distribution at exactly its version. The main wheel keeps the PTX (and WGSL / SPIR-V), its manifest
names each moved artifact's distribution, and its metadata gains one extra per family
(``pip install mypkg[sm90]``) that requires that companion at exactly its version.

The wheels are written here, with :mod:`zipfile` and a RECORD of our own making: the ``wheel``
package says its Python API is not public, and hatchling writes wheels only from a project. Entry
dates and permissions are kept from the wheel split (``SOURCE_DATE_EPOCH`` builds stay
reproducible).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import zipfile
from dataclasses import dataclass, field
from email.parser import Parser
from pathlib import Path

from khal_runtime.abi import parse_arch
from khal_runtime.manifest import MANIFEST_DIR, MANIFEST_NAME, Manifest, parse_manifest

from hatch_khal.errors import ConfigError
from hatch_khal.model import Reporter

__all__ = ["DEFAULT_MAX_WHEEL_BYTES", "GROUP", "parse_size", "split_wheel"]

#: PyPI's default limit per file
DEFAULT_MAX_WHEEL_BYTES = 100 * 1000 * 1000
GROUP = "khal_runtime.companions"  # = khal_runtime.companions.GROUP (the build side does not import it)
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgG]i?[bB]?|[bB]?)\s*")
_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "ki": 1024, "kib": 1024, "mi": 1 << 20, "mib": 1 << 20, "gi": 1 << 30, "gib": 1 << 30}


def parse_size(text: str, where: str) -> int:
    """``100MB``, ``1.5GB``, ``512MiB``, ``20000`` (bytes)."""
    m = _SIZE.fullmatch(text)
    if not m:
        raise ConfigError(f"{where}={text!r}: not a size; write bytes or a number with kB, MB, GB (MiB, GiB), "
                          "e.g. 100MB")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def _hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


@dataclass
class _Wheel:
    """A wheel being written: its members in order, each with the ZipInfo it keeps."""

    files: list[tuple[zipfile.ZipInfo, bytes]] = field(default_factory=list)

    def add(self, like: zipfile.ZipInfo, name: str, data: bytes) -> None:
        info = zipfile.ZipInfo(name, date_time=like.date_time)
        info.external_attr = like.external_attr or (0o644 << 16)
        info.compress_type = zipfile.ZIP_DEFLATED
        self.files.append((info, data))

    def write(self, path: Path, dist_info: str, like: zipfile.ZipInfo) -> None:
        record = "".join(f"{i.filename},{_hash(d)},{len(d)}\n" for i, d in self.files) + f"{dist_info}/RECORD,,\n"
        self.add(like, f"{dist_info}/RECORD", record.encode())
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
            for info, data in self.files:
                zf.writestr(info, data)


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def split_wheel(wheel: Path, out_dir: Path, max_bytes: int, reporter: Reporter, *, force: bool = False) -> list[Path]:
    """The wheels to publish: ``wheel`` itself when within ``max_bytes`` (and not ``force``), else the
    main wheel without its cubins plus one companion per arch family, written to ``out_dir``."""
    size = wheel.stat().st_size
    out_dir.mkdir(parents=True, exist_ok=True)
    if size <= max_bytes and not force:
        reporter.info(f"khal: {wheel.name} is {size / 1e6:.1f} MB, within {max_bytes / 1e6:g} MB: nothing to split")
        return [wheel]
    with zipfile.ZipFile(wheel) as zf:
        infos = zf.infolist()
        members = {i.filename: zf.read(i) for i in infos}
    dist_info = next(n.split("/")[0] for n in members if n.split("/")[0].endswith(".dist-info"))
    meta = Parser().parsestr(members[f"{dist_info}/METADATA"].decode("utf-8"))
    name, version = str(meta["Name"]), str(meta["Version"])
    tag = Parser().parsestr(members[f"{dist_info}/WHEEL"].decode("utf-8"))["Tag"] or "py3-none-any"
    manifests = sorted(n for n in members if n.endswith(f"{MANIFEST_DIR}/{MANIFEST_NAME}"))
    if not manifests:
        raise ConfigError(f"{wheel}: holds no {MANIFEST_DIR}/{MANIFEST_NAME}; was it built with the khal hook?")
    by_info = {i.filename: i for i in infos}
    moved: dict[str, dict[str, tuple[str, bytes]]] = {}  # family -> wheel path in main -> (companion path, bytes)
    replaced: dict[str, bytes] = {}
    companion_of: dict[str, tuple[str, str, str]] = {}  # family -> (distribution, module, package import name)
    for mpath in manifests:
        prefix = mpath[: -len(f"{MANIFEST_DIR}/{MANIFEST_NAME}")]  # "mypkg/" (or "src_layout/pkg/")
        package = prefix.rstrip("/").replace("/", ".")
        manifest = parse_manifest(members[mpath], f"{wheel}!{mpath}")
        crates = []
        for crate in manifest.crates:
            arts = []
            for a in crate.artifacts:
                if a.kind != "cubin" or a.arch is None:
                    arts.append(a)
                    continue
                family = f"sm{parse_arch(a.arch).number}"
                dist = f"{_norm(name)}-kernels-{family}"
                module = f"{package.replace('.', '_')}_kernels_{family}"
                companion_of.setdefault(family, (dist, module, package))
                moved.setdefault(family, {})[prefix + a.path] = (f"{module}/{a.path}", members[prefix + a.path])
                arts.append(a.model_copy(update={"distribution": dist}))
            crates.append(crate.model_copy(update={"artifacts": tuple(arts)}))
        new = manifest.model_copy(update={"crates": tuple(crates)})
        replaced[mpath] = new.to_json().encode()
        replaced.update({prefix + k: v for k, v in _stub_files(new).items()})
    if not moved:
        reporter.warn(f"khal: {wheel.name} is {size / 1e6:.1f} MB and ships no cubin to move: nothing to split")
        return [wheel]
    gone = {p for files in moved.values() for p in files}
    main = _Wheel()
    record_info = by_info[f"{dist_info}/RECORD"]
    for info in infos:
        n = info.filename
        if n in gone or n == f"{dist_info}/RECORD":
            continue
        data = replaced.get(n, members[n])
        if n == f"{dist_info}/METADATA":
            data = _with_extras(data.decode("utf-8"), {f: companion_of[f][0] for f in sorted(moved)}, version).encode()
        main.add(info, n, data)
    out_main = out_dir / wheel.name
    written = [out_main]
    sha = {m: hashlib.sha256(replaced[m]).hexdigest() for m in manifests}
    for family in sorted(moved):
        dist, module, package = companion_of[family]
        fname = dist.replace("-", "_")
        cdist_info = f"{fname}-{version}.dist-info"
        comp = _Wheel()
        like = record_info
        comp.add(like, f"{module}/__init__.py", f'"""{family} cubins of {name} {version} (hatch-khal companion)."""\n'.encode())
        for main_path, (cpath, data) in sorted(moved[family].items()):
            comp.add(by_info[main_path], cpath, data)
        mpath = next(m for m in manifests if m.startswith(package.replace(".", "/") + "/"))
        record = {"package": package, "distribution": dist, "requires": f"{name}=={version}", "family": family,
                  "manifest_sha256": sha[mpath]}
        comp.add(like, f"{module}/{MANIFEST_DIR}/companion.json", (json.dumps(record, indent=1, sort_keys=True) + "\n").encode())
        comp.add(like, f"{cdist_info}/METADATA", (
            f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n"
            f"Summary: The {family} cubins of {name} {version}, installed beside it (hatch-khal companion)\n"
            f"Requires-Dist: {name}=={version}\n").encode())
        comp.add(like, f"{cdist_info}/WHEEL", (f"Wheel-Version: 1.0\nGenerator: hatch-khal split\n"
                                               f"Root-Is-Purelib: true\nTag: {tag}\n").encode())
        comp.add(like, f"{cdist_info}/entry_points.txt", f"[{GROUP}]\n{package} = {module}\n".encode())
        path = out_dir / f"{fname}-{version}-{tag}.whl"
        comp.write(path, cdist_info, like)
        written.append(path)
        csize = path.stat().st_size
        if csize > max_bytes:
            reporter.warn(f"khal: companion {path.name} is {csize / 1e6:.1f} MB, above {max_bytes / 1e6:g} MB itself: "
                          "ask the index for a larger limit, or build fewer crates per package")
    main.write(out_main, dist_info, record_info)
    reporter.info(f"khal: {wheel.name} was {size / 1e6:.1f} MB: {out_main.stat().st_size / 1e6:.1f} MB now, with "
                  + ", ".join(f"{p.name} ({p.stat().st_size / 1e6:.1f} MB)" for p in written[1:]))
    return written


def _stub_files(manifest: Manifest) -> dict[str, bytes]:
    from hatch_khal.stubs import stub_files  # lazy: only when a wheel is split

    return stub_files(manifest)


def _with_extras(metadata: str, extras: dict[str, str], version: str) -> str:
    """METADATA with one extra per family, requiring its companion at exactly ``version``."""
    head, sep, body = metadata.partition("\n\n")
    lines = [head.rstrip("\n")]
    for extra, dist in extras.items():
        lines.append(f"Provides-Extra: {extra}")
        lines.append(f"Requires-Dist: {dist}=={version}; extra == \"{extra}\"")
    return "\n".join(lines) + "\n" + (sep + body if sep else "")

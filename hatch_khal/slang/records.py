"""What the Slang stage hands the builder: :class:`SlangPlan` and :class:`SlangOutput`.

A plan is computed without Slang (sources, imported modules, content hash, cache keys); an output
is everything one crate's Slang compile produced: the CUDA translation unit and NVRTC options for
the existing NVRTC stage, the manifest entries (with their WebGPU targets) and the WGSL / SPIR-V
bytes. An output round-trips through :meth:`SlangOutput.to_bytes` / :meth:`SlangOutput.from_bytes`
so the builder can keep it in its content-addressed cache under :meth:`SlangPlan.cache_key`.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from khal_runtime.abi import canonical
from khal_runtime.manifest import MANIFEST_DIR, Artifact, Entry, SourceFile as ManifestSource

from hatch_khal.__about__ import __version__
from hatch_khal.codegen import probe_names
from hatch_khal.errors import KhalBuildError
from hatch_khal.slang.cuda_abi import CODEGEN_VERSION
from hatch_khal.slang.library import SlangLocation
from hatch_khal.slang.sources import SlangSources

__all__ = ["ALL_TARGETS", "OUTPUT_FORMAT", "SlangOutput", "SlangPlan", "webgpu_path"]

#: What a Slang crate compiles to: CUDA (always) and the two WebGPU languages.
ALL_TARGETS = frozenset({"cuda", "wgsl", "spirv"})
#: Version of :meth:`SlangOutput.to_bytes`' format.
OUTPUT_FORMAT = 1
_EXT = {"wgsl": "wgsl", "spirv": "spv"}


def webgpu_path(crate: str, entry: str, entry_hash: str, target: str) -> str:
    """``_khal/<crate>/<entry>.<hash>.wgsl`` / ``.spv``: the package path of one WebGPU artifact."""
    return f"{MANIFEST_DIR}/{crate}/{entry}.{entry_hash}.{_EXT[target]}"


def normalize_targets(targets: Iterable[str]) -> frozenset[str]:
    t = frozenset(targets) | {"cuda"}
    unknown = t - ALL_TARGETS
    if unknown:
        raise KhalBuildError(f"unknown Slang target(s) {sorted(unknown)}; the targets are {sorted(ALL_TARGETS)}")
    return t


@dataclass(frozen=True)
class SlangPlan:
    """A Slang crate before compiling: computed from files alone, no Slang run."""

    crate: str
    root: Path
    files: SlangSources
    include_dirs: tuple[Path, ...]
    defines: dict[str, str]
    #: NVRTC options of the crate (after the defaults: ``--fmad=true`` overrides ``--fmad=false``)
    options: tuple[str, ...]
    #: options given to Slang (``spProcessCommandLineArguments``)
    slang_options: tuple[str, ...]
    slang: SlangLocation
    #: the crate's content hash: every file (path + bytes), defines, options, Slang version
    content_hash: str

    @property
    def manifest_sources(self) -> tuple[ManifestSource, ...]:
        """The manifest's ``sources`` of this crate: every file with its sha256."""
        return tuple(ManifestSource(path=f.rel, sha256=hashlib.sha256(f.data).hexdigest())
                     for f in self.files.all_files)

    def cache_key(self, targets: Iterable[str] = ALL_TARGETS) -> str:
        """Key of this crate's :class:`SlangOutput` for ``targets``: equal keys, equal outputs (the
        crate's name too: it is in the artifact paths and the CUDA unit)."""
        return hashlib.sha256(canonical({
            "what": "slang-crate-output",
            "format": OUTPUT_FORMAT,
            "crate": self.crate,
            "content": self.content_hash,
            "targets": sorted(normalize_targets(targets)),
            "slang": self.slang.fingerprint,
            "hatch_khal": __version__,
            "codegen": CODEGEN_VERSION,
        })).hexdigest()


@dataclass(frozen=True)
class SlangOutput:
    """One Slang crate, compiled (or read back from the cache)."""

    crate: str
    content_hash: str
    slang_version: str
    targets: frozenset[str]
    #: the CUDA translation unit for NVRTC, its name and the NVRTC options it needs
    cuda_unit: str
    unit_name: str
    nvrtc_options: tuple[str, ...]
    #: manifest entries, sorted by name (``webgpu`` filled when WGSL / SPIR-V were built)
    entries: tuple[Entry, ...]
    #: package path -> bytes of every WGSL / SPIR-V artifact
    webgpu_files: dict[str, bytes] = field(default_factory=dict)
    #: Slang's warnings and the stage's own, one message each, for display
    warnings: tuple[str, ...] = ()
    #: seconds: "session", "cuda", "<entry>.<target>", "worker" (wall time of the whole call)
    timings: dict[str, float] = field(default_factory=dict)
    #: CUDA toolkit headers the unit includes (``cuda_fp16.h`` for ``half``): put the CUDA headers
    #: (:func:`hatch_khal.headers.resolve_headers`) on NVRTC's include path when not empty
    system_includes: tuple[str, ...] = ()

    @property
    def webgpu_built(self) -> bool:
        return bool(self.targets & {"wgsl", "spirv"})

    def webgpu_artifacts(self) -> tuple[Artifact, ...]:
        """The manifest artifacts of the WGSL / SPIR-V files (the builder adds PTX / cubins)."""
        out = []
        for e in self.entries:
            for t in e.webgpu or ():
                data = self.webgpu_files[t.path]
                out.append(Artifact(kind=t.target, entry=e.name, path=t.path,
                                    sha256=hashlib.sha256(data).hexdigest(), size=len(data)))
        return tuple(sorted(out, key=lambda a: a.path))

    def check_probes(self, globals_u64: Mapping[str, int] | Iterable[tuple[str, int]]) -> None:
        """Check reflection's element sizes against NVRTC's (``khal_sizeof_*`` read from the PTX or
        cubin, e.g. :attr:`khal_runtime.binaries.BinaryInfo.globals_u64`)."""
        probes = dict(globals_u64)
        for e in self.entries:
            for i, p in enumerate(e.params):
                size_name, align_name = probe_names(e.name, i)
                if size_name not in probes:
                    raise KhalBuildError(f"crate {self.crate!r}: entry {e.name!r}: the binary lacks the size "
                                         f"probe {size_name}; was it built from this crate's Slang unit?")
                size, align = probes[size_name], probes.get(align_name, p.element_align)
                if (size, align) != (p.element_size, p.element_align):
                    raise KhalBuildError(
                        f"crate {self.crate!r}: entry {e.name!r} parameter {p.name!r}: Slang's reflection says "
                        f"{p.element_type} is {p.element_size} bytes (align {p.element_align}), NVRTC "
                        f"compiled {size} (align {align}); please report this with the sources")

    # -- cache round trip -----------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        return json.dumps({
            "format": OUTPUT_FORMAT,
            "crate": self.crate, "content_hash": self.content_hash, "slang_version": self.slang_version,
            "targets": sorted(self.targets), "cuda_unit": self.cuda_unit, "unit_name": self.unit_name,
            "nvrtc_options": list(self.nvrtc_options),
            "entries": [e.model_dump(mode="json", exclude_none=True) for e in self.entries],
            "webgpu_files": {k: base64.b64encode(v).decode("ascii") for k, v in sorted(self.webgpu_files.items())},
            "warnings": list(self.warnings), "timings": self.timings,
            "system_includes": list(self.system_includes),
        }, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> SlangOutput:
        """Read :meth:`to_bytes` back; KhalBuildError if the bytes are not such an output."""
        try:
            d: dict[str, Any] = json.loads(data)
            if d.get("format") != OUTPUT_FORMAT:
                raise ValueError(f"format {d.get('format')!r}")
            return cls(
                crate=d["crate"], content_hash=d["content_hash"], slang_version=d["slang_version"],
                targets=frozenset(d["targets"]), cuda_unit=d["cuda_unit"], unit_name=d["unit_name"],
                nvrtc_options=tuple(d["nvrtc_options"]),
                entries=tuple(Entry.model_validate(e) for e in d["entries"]),
                webgpu_files={k: base64.b64decode(v) for k, v in d["webgpu_files"].items()},
                warnings=tuple(d["warnings"]), timings=dict(d["timings"]),
                system_includes=tuple(d["system_includes"]),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise KhalBuildError(f"a cached Slang output is unreadable ({exc}); clear the khal cache") from None

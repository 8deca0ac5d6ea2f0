"""Version skew between the two distributions (#38 item 8): which khal-runtime a manifest needs, the
lower bound the build adds to a wheel's requirements, and what a runtime says of a manifest newer
than it reads (same schema number, fields it does not know: "rebuild the package" cannot help)."""

from __future__ import annotations

import json
import typing
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from pydantic import BaseModel

from hatch_khal.__about__ import __version__
from hatch_khal.errors import ConfigError
from hatch_khal.frontend import runtime_bound
from khal_runtime import manifest as M
from khal_runtime.__about__ import __version__ as runtime_version
from khal_runtime.errors import ManifestError
from khal_runtime.manifest import ADDED_IN, FIRST_RUNTIME, SCHEMA_VERSION, parse_manifest, required_runtime

#: Every field of the manifest's models as khal-runtime 0.1.0 read them (schema 4): a field not here
#: is one an 0.1.0 runtime refuses (its models forbid unknown keys), so it must be in ADDED_IN with the
#: release that reads it. Frozen: add a release's list beside it when the next one ships.
FIELDS_0_1_0 = frozenset({
    'Artifact.arch', 'Artifact.entry', 'Artifact.kind', 'Artifact.path', 'Artifact.ptx_isa', 'Artifact.sha256',
    'Artifact.size',
    'Binding.access', 'Binding.binding', 'Binding.group', 'Binding.param',
    'Crate.artifacts', 'Crate.content_hash', 'Crate.entries', 'Crate.globals', 'Crate.language', 'Crate.name',
    'Crate.package_dir', 'Crate.prebuilt', 'Crate.sources', 'Crate.spirv',
    'Editable.project_root',
    'Entry.attributes', 'Entry.block_size', 'Entry.fixed_block', 'Entry.grid_dims', 'Entry.hash',
    'Entry.indirect_reason', 'Entry.indirect_symbol', 'Entry.launch', 'Entry.launch_bounds', 'Entry.name',
    'Entry.params', 'Entry.symbol', 'Entry.template', 'Entry.template_args', 'Entry.triton', 'Entry.webgpu',
    'GlobalVar.element_size', 'GlobalVar.name', 'GlobalVar.size', 'GlobalVar.space', 'GlobalVar.type',
    'LaunchAttributes.cluster_dims', 'LaunchAttributes.cooperative', 'LaunchAttributes.max_dynamic_shared',
    'LaunchAttributes.pdl',
    'LaunchFacts.block_fixed', 'LaunchFacts.grid_axes', 'LaunchFacts.reads', 'LaunchFacts.source',
    'Manifest.crates', 'Manifest.editable', 'Manifest.package', 'Manifest.schema_version', 'Manifest.toolchain',
    'Param.ctype', 'Param.element_align', 'Param.element_size', 'Param.element_type', 'Param.kind', 'Param.layouts',
    'Param.length', 'Param.name', 'Param.shape', 'Param.writable',
    'Prebuilt.file_name', 'Prebuilt.kind', 'Prebuilt.variable',
    'ScalarSlot.offset', 'ScalarSlot.param', 'ScalarSlot.size',
    'SourceFile.path', 'SourceFile.sha256',
    'SpirvStatus.reason', 'SpirvStatus.status',
    'StructField.fields', 'StructField.name', 'StructField.offset', 'StructField.shape', 'StructField.size',
    'StructField.strides', 'StructField.type',
    'StructLayout.fields', 'StructLayout.size',
    'Toolchain.abi_version', 'Toolchain.hatch_khal_version', 'Toolchain.nvrtc_version', 'Toolchain.slang_version',
    'Toolchain.triton_version',
    'TritonFacts.autotune_key', 'TritonFacts.base', 'TritonFacts.cache_key', 'TritonFacts.choose',
    'TritonFacts.config', 'TritonFacts.constexprs', 'TritonFacts.divisible', 'TritonFacts.family',
    'TritonFacts.global_scratch', 'TritonFacts.kernel', 'TritonFacts.names', 'TritonFacts.num_ctas',
    'TritonFacts.num_stages', 'TritonFacts.num_warps', 'TritonFacts.ones', 'TritonFacts.profile_scratch',
    'TritonFacts.shared', 'TritonFacts.triton_version', 'TritonFacts.types', 'TritonFacts.written',
    'TritonScratch.align', 'TritonScratch.size',
    'WebGpuTarget.bindings', 'WebGpuTarget.entry_point', 'WebGpuTarget.path', 'WebGpuTarget.scalar_block_size',
    'WebGpuTarget.scalar_slots', 'WebGpuTarget.scalars', 'WebGpuTarget.target',
})
MODELS_0_1_0 = frozenset(f.split(".")[0] for f in FIELDS_0_1_0)


def _models() -> dict[str, type[BaseModel]]:
    return {n: c for n, c in vars(M).items()
            if isinstance(c, type) and issubclass(c, BaseModel) and c.__module__ == M.__name__ and not n.startswith("_")}


def _release(v: str) -> tuple[int, ...]:
    from packaging.version import Version

    return Version(v).release


def test_every_field_0_1_0_did_not_read_names_the_release_that_reads_it() -> None:
    """A field added to a model 0.1.0 had must be in ADDED_IN (else a wheel using it would claim 0.1.0
    and meet "invalid manifest ... Extra inputs" there); a model 0.1.0 did not have is reached only
    through such a field."""
    fields = {f"{n}.{f}" for n, c in _models().items() for f in c.model_fields}
    missing = sorted(f for f in fields if f.split(".")[0] in MODELS_0_1_0 and f not in FIELDS_0_1_0
                     and f not in ADDED_IN)
    assert not missing, f"add these to khal_runtime.manifest.ADDED_IN with the release that reads them: {missing}"
    assert set(ADDED_IN) <= fields, sorted(set(ADDED_IN) - fields)
    assert not set(ADDED_IN) & FIELDS_0_1_0
    assert all(_release(v) <= _release(runtime_version) for v in ADDED_IN.values())
    # a new model is held by an ADDED_IN field (or by a field of another new model)
    for name, model in _models().items():
        if name in MODELS_0_1_0:
            continue
        holders = [f"{n}.{f}" for n, c in _models().items() for f, info in c.model_fields.items()
                   if name in str(info.annotation)]
        assert holders and all(h in ADDED_IN or h.split(".")[0] not in MODELS_0_1_0 or h == "TritonFacts.constexprs"
                               for h in holders), (name, holders)


def test_the_two_distributions_and_the_runtime_module_share_the_release() -> None:
    assert runtime_version == __version__ == "0.2.0"


def _example_manifest(example_wheel: Path) -> M.Manifest:
    with zipfile.ZipFile(example_wheel) as zf:
        return parse_manifest(zf.read("example_shader_pkg/_khal/manifest.json"))


def test_a_manifest_needs_the_release_of_the_newest_field_it_writes(example_wheel: Path) -> None:
    """The example (Triton entries write their whole signature, a 0.2.0 field) needs 0.2.0; without
    its Triton crate, what 0.1.0 read; a crate-level Triton record alone needs 0.2.0 too."""
    m = _example_manifest(example_wheel)
    assert required_runtime(m) == "0.2.0"
    no_triton = m.model_copy(update={"crates": tuple(c for c in m.crates if c.language != "triton")})
    assert required_runtime(no_triton) == FIRST_RUNTIME[SCHEMA_VERSION] == "0.1.0"
    # nothing 0.1.0 does not read is written: every key of its JSON is a field 0.1.0 had
    assert "triton" not in json.dumps([c.model_dump(mode="json", exclude_none=True) for c in no_triton.crates])
    core = no_triton.crates[0].model_copy(update={"triton": M.TritonCrate(jit_fallback=True)})
    assert required_runtime(no_triton.model_copy(update={"crates": (core, *no_triton.crates[1:])})) == "0.2.0"


@pytest.mark.parametrize("declared, needed, added", [
    (["khal-runtime>=0.1.0"], "0.2.0", "khal-runtime>=0.2.0"),
    (["khal-runtime"], "0.2.0", "khal-runtime>=0.2.0"),
    (["khal-runtime>0.1.0"], "0.2.0", "khal-runtime>=0.2.0"),           # admits 0.1.1
    (["khal-runtime>=0.2; python_version>='3.11'"], "0.2.0", "khal-runtime>=0.2.0"),  # a marker: not always
    (["hatch-khal"], "0.2.0", "khal-runtime>=0.2.0"),
    (["khal-runtime>=0.2"], "0.2.0", None),
    (["khal-runtime~=0.2.0"], "0.2.0", None),
    (["khal-runtime==0.2.*"], "0.2.0", None),
    (["numpy", "khal-runtime[webgpu]>=0.3"], "0.2.0", None),
    (["khal-runtime>=0.1.0"], "0.1.0", None),
    ([], "0.1.0", "khal-runtime>=0.1.0"),
])
def test_the_bound_is_added_only_where_the_declared_requirement_admits_an_older_runtime(
        declared: list[str], needed: str, added: str | None) -> None:
    assert runtime_bound(declared, needed) == added


def test_the_example_wheel_requires_the_runtime_its_manifest_needs(example_wheel: Path) -> None:
    """It declares khal-runtime>=0.1.0 and has Triton crates (0.2.0 fields): the hook added the bound
    (hatchling writes build_data["dependencies"] into the METADATA)."""
    from email.parser import Parser

    with zipfile.ZipFile(example_wheel) as zf:
        (meta,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        reqs = Parser().parsestr(zf.read(meta).decode()).get_all("Requires-Dist") or []
    assert "khal-runtime>=0.1.0" in reqs and "khal-runtime>=0.2.0" in reqs, reqs


def test_setuptools_refuses_a_requirement_it_cannot_raise(example_wheel: Path) -> None:
    """setuptools writes the wheel's requirements before build_khal runs: the bound cannot be added,
    so a declared requirement that admits an older runtime than the manifest needs is refused."""
    from hatch_khal.setuptools_ext import _check_runtime_bound

    result = SimpleNamespace(packages=[SimpleNamespace(manifest=_example_manifest(example_wheel))])
    with pytest.raises(ConfigError, match=r'needs khal-runtime>=0.2.0 .* write "khal-runtime>=0.2.0" in \[project\] '
                                          r"dependencies"):
        _check_runtime_bound(["khal-runtime>=0.1.0"], result)  # type: ignore[arg-type]
    _check_runtime_bound(["khal-runtime>=0.2.0"], result)  # type: ignore[arg-type]


# -- the runtime meeting a newer manifest of the same schema ------------------------------------------------
def _doc(built_by: str, **extra: object) -> str:
    doc: dict[str, typing.Any] = {"schema_version": SCHEMA_VERSION, "package": "p", "crates": [],
                                  "toolchain": {"hatch_khal_version": built_by, "abi_version": 1}}
    doc.update(extra)
    return json.dumps(doc)


@pytest.mark.parametrize("built_by", ["0.3.0", "1.0", "0.2.1", "0.10.0+local"])
def test_a_field_of_a_newer_release_names_the_runtime_to_install(built_by: str) -> None:
    """Same schema number, a field this runtime does not know: the package was built by a newer
    hatch-khal, so the fix is a newer runtime, not a rebuild (the message said "rebuild the package")."""
    with pytest.raises(ManifestError) as exc:
        parse_manifest(_doc(built_by, new_field={"x": 1}), "p/_khal/manifest.json")
    release = built_by.split("+")[0]
    msg = str(exc.value)
    assert msg.startswith(f"p/_khal/manifest.json: the package was built by hatch-khal {release}, newer than this "
                          f"runtime (khal-runtime {runtime_version})"), msg
    assert "the field new_field" in msg and f"install khal-runtime>={release} (pip install 'khal-runtime>={release}')" in msg
    assert "rebuilding the package does not help" in msg


@pytest.mark.parametrize("built_by", [runtime_version, "0.1.0", "test", "0.9; rm -rf /"])
def test_a_broken_manifest_of_this_or_an_older_release_says_rebuild(built_by: str) -> None:
    with pytest.raises(ManifestError) as exc:
        parse_manifest(_doc(built_by, new_field=1), "p/_khal/manifest.json")
    msg = str(exc.value)
    assert "invalid manifest" in msg and msg.endswith("rebuild the package"), msg
    assert "rm -rf" not in msg

"""A manifest the build vouches for is read without pydantic (#38 item 18): the plain classes of
``khal_runtime.manifest_records`` (generated from the models), the digest the build writes beside
the manifest (``khal_runtime.manifest_load``), and what is still checked on that path.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import khal_runtime
from khal_runtime import manifest as models
from khal_runtime import manifest_records as records
from khal_runtime.errors import ArtifactError, ManifestError
from khal_runtime.manifest_load import DIGEST_NAME, build_digest, load_manifest, manifest_digest
from tests.helpers.fakecuda import CONTENT, FakeDriver, fake, fake_kernels, make_entry, storage, write_package  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]


def _run(code: str, *paths: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *map(str, paths), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=120)


def test_the_records_module_is_what_the_generator_writes_from_the_models() -> None:
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_manifest_records.py"), "--check"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 0, r.stderr + r.stdout
    import hashlib

    from khal_runtime import launch_attributes

    # the models' source: manifest.py and the launch attribute rows LaunchAttributes is made from
    schema = Path(models.__file__).read_bytes() + b"\0" + Path(launch_attributes.__file__).read_bytes() + b"\0"
    assert records.SOURCE_DIGEST == hashlib.sha256(schema).hexdigest()


def test_every_model_has_its_record_with_the_same_fields_and_methods() -> None:
    ms = {n: c for n, c in vars(models).items() if isinstance(c, type) and issubclass(c, models._Model)
          and c is not models._Model}
    assert ms and set(ms) <= set(vars(records))
    for name, cls in ms.items():
        rec = getattr(records, name)
        assert rec._FIELDS == tuple(cls.model_fields), name
        mine = {n for n in vars(cls) if not n.startswith("_") and (callable(vars(cls)[n]) or isinstance(vars(cls)[n],
                                                                                                        property))}
        assert mine <= set(dir(rec)), (name, mine - set(dir(rec)))


def _slang_manifest(tmp_path: Path) -> dict[str, Any] | None:
    """The manifest of the example's Slang crate (uniform layouts per target, WebGPU targets,
    bindings, scalar slots, launch facts), or None where it cannot be built here."""
    from tests.helpers.slang import webgpu_package

    try:
        pkg = webgpu_package(tmp_path)
    except Exception:  # noqa: BLE001  (no slangpy and no wheel: the other manifests still run)
        return None
    return json.loads((pkg / "_khal" / "manifest.json").read_text())  # type: ignore[no-any-return]


def _triton_entry() -> models.Entry:
    from khal_runtime import abi

    facts = models.TritonFacts(
        kernel="k", family="k", num_warps=4, num_stages=3, shared=64, names=("x", "n"), types=("*fp32", "i32"),
        divisible=("x",), constexprs={"B": 128, "D": models.TritonDtype(dtype="fp16"), "S": "s", "F": 0.5, "N": None},
        cache_key="ck", triton_version="3.6.0", global_scratch=models.TritonScratch(size=128, align=16),
        params=(models.TritonParam(name="x"), models.TritonParam(name="n", default=3, has_default=True),
                models.TritonParam(name="D", constexpr=True, default=models.TritonDtype(dtype="fp32"),
                                   has_default=True)),
        written=("x",), maxnreg=128, heuristics=("B",), module="m", qualname="k")
    u64 = {"kind": "scalar", "element_type": "uint64", "element_size": 8, "element_align": 8}
    params = (models.Param(name="x", **u64), models.Param(name="n", kind="scalar", element_type="int32",
                                                           element_size=4, element_align=4),
              models.Param(name="khal_global_scratch", **u64), models.Param(name="khal_profile_scratch", **u64))
    sig = abi.entry_signature("k", (128, 1, 1), params, grid_dims=3, triton=facts.record())
    h = abi.entry_hash(CONTENT, sig)
    return models.Entry(name="k", symbol=abi.symbol_for("k", h), hash=h, block_size=(128, 1, 1), params=params,
                        grid_dims=3, triton=facts)


def test_a_record_dumps_and_hashes_as_its_model(tmp_path: Path) -> None:
    """What the entry hash is computed from (``signature()``, a Triton entry's ``record()``) and the
    whole dump are the model's, for every kind of field."""
    pkg = write_package(tmp_path, [make_entry("fill", (storage("out", "float32", 4, writable=True),), block=128),
                                   _triton_entry()], language="triton")
    data = json.loads((pkg / "_khal" / "manifest.json").read_text())
    slang = _slang_manifest(tmp_path / "slang")
    for d in (data, *([slang] if slang is not None else [])):
        m, r = models.Manifest.model_validate(d), records.Manifest(d)
        assert r.model_dump(mode="json") == m.model_dump(mode="json")
        assert r.model_dump(mode="json", exclude_none=True) == m.model_dump(mode="json", exclude_none=True)
        assert r.to_json() == m.to_json()
        for cm, cr in zip(m.crates, r.crates):
            for em, er in zip(cm.entries, cr.entries):
                assert er.signature() == em.signature() and er.signature(layouts=False) == em.signature(layouts=False)
                assert (er.launch_dims, er.launch_block_fixed, er.dynamic_shared, er.max_block_threads) == \
                    (em.launch_dims, em.launch_block_fixed, em.dynamic_shared, em.max_block_threads)
                if em.triton is not None:
                    assert er.triton.record() == em.triton.record() and er.triton.ctas == em.triton.ctas
                    assert type(er.triton.constexprs["D"]) is records.TritonDtype
                for pm, pr in zip(em.params, er.params):
                    assert (pr.describe(True), pr.slots) == (pm.describe(True), pm.slots)
        # (khal_runtime.companions drops the artifacts of a companion not installed)
        cm, cr = m.crates[0].model_copy(update={"artifacts": ()}), r.crates[0].model_copy(update={"artifacts": ()})
        assert type(cr) is records.Crate and cr.model_dump() == cm.model_dump() and cr.artifacts == ()
        assert r.crates[0].artifacts == m.crates[0].artifacts != ()
    with pytest.raises(TypeError, match="frozen"):
        r.package = "other"  # type: ignore[misc]


# ---------------------------------------------------------------------------------------------
# the digest: a manifest the build wrote loads without pydantic
# ---------------------------------------------------------------------------------------------
def _built(tmp_path: Path, name: str = "khal_digest_pkg") -> Path:
    """A package as the build writes it: the manifest and its digest."""
    from tests.helpers.synthetic import build_package

    return build_package(tmp_path, name).package_dir


@pytest.mark.needs_nvrtc
def test_a_package_the_build_wrote_loads_without_pydantic(tmp_path: Path) -> None:
    pkg = _built(tmp_path)
    assert (pkg / "_khal" / DIGEST_NAME).is_file()
    r = _run("""
        import sys
        import khal_digest_pkg as p
        print("PYDANTIC", "pydantic" in sys.modules, type(p.kernels.manifest).__module__, p.kernels.entries)
    """, tmp_path)
    assert r.returncode == 0, r.stderr
    assert "PYDANTIC False khal_runtime.manifest_records ['axpby', 'fill', 'scalars']" in r.stdout


@pytest.mark.needs_nvrtc
def test_a_manifest_edited_after_the_build_is_validated_in_full(tmp_path: Path) -> None:
    pkg = _built(tmp_path)
    path = pkg / "_khal" / "manifest.json"
    data = json.loads(path.read_text())
    data["crates"][0]["entries"][0]["block_size"] = [0, 1, 1]  # what the models refuse
    path.write_text(json.dumps(data))  # (the digest is the build's: no longer these bytes)
    with pytest.raises(ManifestError, match=r"invalid manifest at crates.0.entries.0.block_size"):
        load_manifest(path)
    r = _run("""
        import sys
        try:
            import khal_digest_pkg
        except Exception as exc:
            print("ERR", type(exc).__name__, "pydantic" in sys.modules)
    """, tmp_path)
    assert "ERR ManifestError True" in r.stdout, r.stdout + r.stderr


@pytest.mark.needs_nvrtc
def test_what_the_fast_path_keeps_checking(tmp_path: Path) -> None:
    """A manifest whose digest was recomputed after an edit (nothing the build wrote) is read
    without validation, and still: an entry hash its signature does not give, an artifact path out
    of the package, a changed artifact are refused by name."""
    pkg = _built(tmp_path)
    path = pkg / "_khal" / "manifest.json"
    original = json.loads(path.read_text())

    def forge(edit: Any) -> None:
        data = json.loads(json.dumps(original))
        edit(data)
        raw = json.dumps(data).encode()
        path.write_bytes(raw)
        (pkg / "_khal" / DIGEST_NAME).write_text(manifest_digest(raw) + "\n")

    forge(lambda d: d["crates"][0]["entries"][0]["params"][0].update(element_type="int32"))
    # the entry hashes of a manifest the digest vouches for are recomputed at the crate's first use
    # (an import costs nothing per entry, #36 item 6), before anything of it loads
    ks = khal_runtime.load(pkg)
    crate = ks.manifest.crates[0].name
    with pytest.raises(ManifestError, match=r"the manifest records hash .* but the entry's own signature"):
        ks.crates[crate].module(0)
    forge(lambda d: d["crates"][0]["artifacts"][0].update(path="../../etc/passwd"))
    with pytest.raises(ManifestError, match=r"path '\.\./\.\./etc/passwd' leaves the package"):
        khal_runtime.load(pkg)
    forge(lambda d: None)
    ks = khal_runtime.load(pkg)
    assert type(ks.manifest) is records.Manifest
    art = ks.manifest.crates[0].artifacts[0]
    (pkg / art.path).write_bytes(b"not the artifact")
    from khal_runtime.verify import read_artifact

    with pytest.raises(ArtifactError, match=r"is 16 bytes, the manifest says \d+: the file was changed"):
        read_artifact(pkg, art)


@pytest.mark.needs_nvrtc
@pytest.mark.parametrize("digest", ["none", "other models", "garbage", "a directory"])
def test_without_the_builds_digest_the_manifest_is_validated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               digest: str) -> None:
    pkg = _built(tmp_path)
    d = pkg / "_khal" / DIGEST_NAME
    raw = (pkg / "_khal" / "manifest.json").read_bytes()
    d.unlink()
    if digest == "other models":  # a manifest another khal-runtime's build wrote
        import hashlib

        d.write_text(hashlib.sha256(raw + b"\0" + b"0" * 64).hexdigest() + "\n")
    elif digest == "garbage":
        d.write_bytes(b"\xff" * 100)
    elif digest == "a directory":
        d.mkdir()
    calls = []
    real = models.parse_manifest
    monkeypatch.setattr(models, "parse_manifest", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    m = load_manifest(pkg / "_khal" / "manifest.json")
    assert calls == [1] and type(m) is records.Manifest  # validated, then the same objects as the fast path


def test_the_build_writes_no_digest_for_models_the_records_were_not_made_from(monkeypatch: pytest.MonkeyPatch) -> None:
    assert build_digest(b"{}") == manifest_digest(b"{}")
    monkeypatch.setattr(records, "SOURCE_DIGEST", "0" * 64)
    import khal_runtime.manifest_load as ml

    monkeypatch.setattr(ml, "SOURCE_DIGEST", "0" * 64)
    assert build_digest(b"{}") is None  # (a tree whose manifest.py changed since the generator ran)


def test_the_digest_names_the_launch_attribute_rows_too(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """LaunchAttributes' fields are the rows of launch_attributes.py: rows changed since the records were
    generated (an attribute added) are other models, whose manifests the records would read without it."""
    from khal_runtime import launch_attributes

    assert build_digest(b"{}") == manifest_digest(b"{}")
    changed = tmp_path / "launch_attributes.py"
    changed.write_bytes(Path(launch_attributes.__file__).read_bytes() + b"\n# another row\n")
    monkeypatch.setattr(launch_attributes, "__file__", str(changed))
    assert build_digest(b"{}") is None


def test_launch_attributes_record_as_their_model() -> None:
    """LaunchAttributes is made from the rows at import (create_model); its record subclasses the base's
    record with the rows' fields, and reads, dumps, compares and describes as the model."""
    from khal_runtime.launch_attributes import ATTRIBUTES

    data = {"max_dynamic_shared": 65536, "cluster_dims": [2, 1, 1], "pdl": True, "cluster_scheduling": "spread"}
    m, r = models.LaunchAttributes.model_validate(data), records.LaunchAttributes(data)
    assert records.LaunchAttributes._FIELDS == tuple(row.name for row in ATTRIBUTES)
    assert isinstance(r, records._LaunchAttributes)
    assert r.model_dump(mode="json") == m.model_dump(mode="json") and r == m
    assert (r.describe(), r.cluster_size) == (m.describe(), m.cluster_size) and r.cluster_size == 2
    assert records.LaunchAttributes({}).model_dump() == models.LaunchAttributes().model_dump()


def test_the_runtime_objects_are_records_whatever_the_path(fake: FakeDriver, tmp_path: Path) -> None:
    ks = fake_kernels(fake, tmp_path, [make_entry("fill", (storage("out", "float32", 4, writable=True),), block=128)])
    assert type(ks.manifest) is records.Manifest and type(ks.fill.entry) is records.Entry  # (no digest: validated)


def test_equal_tuple_elements_are_one_record_and_values_keep_their_types() -> None:
    """An entry's parameters and a Triton kernel's signature repeat across a crate's entries: equal
    JSON objects make one (immutable) record, but 1, 1.0 and True (equal and hashing alike in
    Python) stay apart, and a value that is itself an object or a list makes its own record."""
    def tparam(default: Any) -> dict[str, Any]:
        return {"name": "BLOCK", "constexpr": True, "default": default, "has_default": True}

    facts = {"kernel": "k", "family": "k", "num_warps": 4, "num_stages": 3, "shared": 0, "names": ["x"],
             "types": ["*fp32"], "cache_key": "c", "triton_version": "3.6.0"}
    a = records.TritonFacts({**facts, "params": [tparam(1), tparam(True), tparam(1.0), tparam({"dtype": "fp32"})]})
    b = records.TritonFacts({**facts, "params": [tparam(1), tparam(True), tparam(1.0), tparam({"dtype": "fp32"})]})
    assert a.params is b.params  # an equal list again: the same tuple
    # in another order: each plain element the same record, the one holding an object a new one
    c = records.TritonFacts({**facts, "params": [tparam({"dtype": "fp32"}), tparam(1.0), tparam(True), tparam(1)]})
    assert [c.params[3 - i] is a.params[i] for i in range(4)] == [True, True, True, False]
    assert [type(p.default) for p in a.params] == [int, bool, float, records.TritonDtype]
    assert a.params[3] == b.params[3] and a == b
    # each as the pydantic model reads it
    assert a.params == models.TritonFacts.model_validate({**facts, "params": [tparam(1), tparam(True), tparam(1.0),
                                                                             tparam({"dtype": "fp32"})]}).params
    with pytest.raises(TypeError, match="frozen"):
        a.params[0].name = "other"  # type: ignore[misc]


def test_an_equal_list_again_is_the_same_tuple_unless_a_loose_value_changes_type() -> None:
    """Consecutive entries of one kernel carry equal parameter lists: the second is the first's
    tuple; a list equal but for a value's type (``default = 1`` then ``True``) is not."""
    p = [{"name": "x", "kind": "storage", "element_type": "float32", "element_size": 4, "element_align": 4}]
    e = {"name": "e", "symbol": "s", "hash": "0" * 16, "block_size": [64, 1, 1], "params": p}
    assert records.Entry(dict(e, params=[dict(x) for x in p])).params is records.Entry(e).params
    facts = {"kernel": "k", "family": "k", "num_warps": 4, "num_stages": 3, "shared": 0, "names": ["x"],
             "types": ["*fp32"], "cache_key": "c", "triton_version": "3.6.0"}
    one = records.TritonFacts({**facts, "params": [{"name": "B", "constexpr": True, "default": 1}]})
    true = records.TritonFacts({**facts, "params": [{"name": "B", "constexpr": True, "default": True}]})
    assert type(one.params[0].default) is int and type(true.params[0].default) is bool

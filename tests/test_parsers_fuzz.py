"""Property tests: every parser returns a result or one of its documented errors, never another exception."""

from __future__ import annotations

import json
import os
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from khal_runtime.binaries import BinaryFormatError, read_binary, read_cubin, scan_ptx
from khal_runtime.errors import ManifestError
from khal_runtime.manifest import parse_manifest

from ._projects import make_project
from .test_builder import build, manifest_of

_SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_SETTINGS
@given(st.binary(max_size=512))
def test_read_binary_arbitrary_bytes(data: bytes) -> None:
    try:
        read_binary(data)
    except BinaryFormatError:
        pass


@_SETTINGS
@given(st.text(alphabet=st.sampled_from(list(".versiontargetsm_0123456789 \n(){};entryvisibleglobalu64=alignkhal_")), max_size=400))
def test_scan_ptx_arbitrary_text(text: str) -> None:
    try:
        scan_ptx(text)
    except BinaryFormatError:
        pass


def _real_cubin() -> bytes:
    root = make_project(Path(os.environ.get("TMPDIR", "/tmp")) / f"khal-fuzz-{os.getpid()}")
    result, _ = build(root, None)
    m, files = manifest_of(result)
    art = next(a for a in m.crate("alpha").artifacts if a.kind == "cubin")
    return files[art.path]


_CUBIN: list[bytes] = []


def cubin() -> bytes:
    if not _CUBIN:
        _CUBIN.append(_real_cubin())
    return _CUBIN[0]


@_SETTINGS
@given(st.data())
def test_read_cubin_truncated_or_mutated(data: st.DataObject) -> None:
    blob = bytearray(cubin())
    cut = data.draw(st.integers(0, len(blob)))
    blob = blob[:cut]
    for _ in range(data.draw(st.integers(0, 8))):
        if blob:
            i = data.draw(st.integers(0, len(blob) - 1))
            blob[i] = data.draw(st.integers(0, 255))
    try:
        info = read_cubin(bytes(blob))
    except BinaryFormatError:
        return
    assert info.kind == "cubin" and info.arch > 0


def _manifest_dict() -> dict:  # type: ignore[type-arg]
    root = make_project(Path(os.environ.get("TMPDIR", "/tmp")) / f"khal-fuzz-m-{os.getpid()}")
    m, _ = manifest_of(build(root, None)[0])
    return json.loads(m.to_json())


_MANIFEST: list[dict] = []  # type: ignore[type-arg]

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 2**40) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)


@_SETTINGS
@given(st.data())
def test_manifest_with_random_edits(data: st.DataObject) -> None:
    if not _MANIFEST:
        _MANIFEST.append(_manifest_dict())
    doc = json.loads(json.dumps(_MANIFEST[0]))
    # replace a random value somewhere in the tree
    node = doc
    for _ in range(data.draw(st.integers(0, 5))):
        if isinstance(node, dict) and node:
            key = data.draw(st.sampled_from(sorted(node)))
            if isinstance(node[key], (dict, list)) and data.draw(st.booleans()):
                node = node[key]
                continue
            node[key] = data.draw(_JSON)
            break
        if isinstance(node, list) and node:
            i = data.draw(st.integers(0, len(node) - 1))
            if isinstance(node[i], (dict, list)) and data.draw(st.booleans()):
                node = node[i]
                continue
            node[i] = data.draw(_JSON)
            break
    try:
        parse_manifest(json.dumps(doc))
    except ManifestError:
        pass


@_SETTINGS
@given(st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode)))
def test_manifest_arbitrary_bytes(data: bytes) -> None:
    try:
        parse_manifest(data)
    except ManifestError:
        pass

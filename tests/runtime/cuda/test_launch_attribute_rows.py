"""Launch attributes as rows (#40 item 2): one :class:`khal_runtime.launch_attributes.LaunchAttribute`
per attribute, read by every layer (the marker, the manifest model, the hash, the checks, the CUDA
driver mapping, the WebGPU refusal). The proof: the cluster scheduling policy Triton's launcher asks
for every ``num_ctas > 1`` kernel (``CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE`` =
``CU_CLUSTER_SCHEDULING_POLICY_SPREAD``, triton/backends/nvidia/driver.py), added as a row and its
driver mapping, reaches every launch configuration; on the fake driver."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from hatch_khal.entries import scan_source
from hatch_khal.errors import EntryParseError
from khal_runtime import abi
from khal_runtime import launch_attributes as la
from khal_runtime.backends.cuda.attributes import CUDA_ATTRIBUTES
from khal_runtime.errors import LaunchAttributeError
from khal_runtime.manifest import ADDED_IN, LaunchAttributes
from tests.helpers.fakecuda import FakeDriver, fake, fake_kernels, make_entry, scalar, storage  # noqa: F401
from tests.runtime.cuda.test_launch_attributes import _buf

SPREAD = LaunchAttributes(cluster_dims=(2, 1, 1), cluster_scheduling="spread")
SPREAD_ATTR = [("CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE", 1)]  # CU_CLUSTER_SCHEDULING_POLICY_SPREAD
PARAMS = (storage("x", writable=True), scalar("n", "uint32", 4))


def _scan(options: str) -> Any:
    return scan_source(f"KHAL_ENTRY(g, 64, (KHAL_STORAGE(float, x)){options}) {{ }}\n", "k.cu").entries[0]


def test_the_spread_policy_reaches_every_launch_configuration(fake: FakeDriver) -> None:  # noqa: F811
    e = make_entry("k", PARAMS, 128, indirect=False, attributes=SPREAD, indirect_reason="clustered")
    ks = fake_kernels(fake, Path(tempfile.mkdtemp(prefix="khal-rows-")), [e])
    x = _buf(1 << 20)
    for _ in range(12):  # the typed call: full read, memo slots, shared snapshots
        ks.k(4096, x, 7)
    ks.k.launch(4, None, x, 7)  # the explicit launch
    ks.k.bind(x, 7)(1024)  # a bound launch
    st = ks.k.resolve_stream(None)
    st.begin_capture()
    ks.k(4096, x, 7)  # captured
    st.end_capture()
    assert len(fake.launches) == 15 and all(rec["attrs"] == SPREAD_ATTR for rec in fake.launches)
    assert fake.func_attributes == []  # nothing set on the function: a launch attribute only
    with pytest.raises(LaunchAttributeError, match=r"grid \(3, 1, 1\) is not a whole number of its clusters"):
        ks.k.launch(3, None, x, 7)  # the cluster row's check still holds


def test_a_triton_instance_of_several_ctas_asks_for_spread_clusters() -> None:
    from hatch_khal.triton.language import launch_attributes

    md = {"shared": 1024, "num_ctas": 2, "launch_pdl": False, "launch_cooperative_grid": False}
    assert launch_attributes([md]) == SPREAD
    assert launch_attributes([{**md, "num_ctas": 1}]) is None  # one CTA a program: no cluster, no policy


def test_the_marker_is_the_rows() -> None:
    d = _scan(", KHAL_CLUSTER(2), KHAL_CLUSTER_SCHEDULING(spread)")
    assert d.attributes == {"cluster_dims": (2, 1, 1), "cluster_scheduling": "spread"}
    assert _scan(", KHAL_CLUSTER_SCHEDULING(load_balancing), KHAL_CLUSTER(4)").attributes["cluster_scheduling"] == \
        "load_balancing"
    with pytest.raises(EntryParseError, match=r"KHAL_CLUSTER_SCHEDULING needs KHAL_CLUSTER"):
        _scan(", KHAL_CLUSTER_SCHEDULING(spread)")
    with pytest.raises(EntryParseError, match=r"must be KHAL_CLUSTER_SCHEDULING\(spread \| load_balancing\)"):
        _scan(", KHAL_CLUSTER(2), KHAL_CLUSTER_SCHEDULING(wide)")
    with pytest.raises(EntryParseError, match=r"none of KHAL_LAUNCH_BOUNDS\(n \| none\), KHAL_SHARED_MEM\(bytes\), .*"
                                              r"KHAL_CLUSTER_SCHEDULING\(spread \| load_balancing\)"):
        _scan(", KHAL_SPREAD")


def test_it_is_hashed_only_when_set_so_existing_entries_keep_their_hashes() -> None:
    clustered = _scan(", KHAL_CLUSTER(2)").signature()
    spread = _scan(", KHAL_CLUSTER(2), KHAL_CLUSTER_SCHEDULING(spread)").signature()
    assert clustered["attributes"] == {"cluster_dims": [2, 1, 1]}  # as before the row existed
    assert spread["attributes"] == {"cluster_dims": [2, 1, 1], "cluster_scheduling": "spread"}
    assert abi.entry_hash("0" * 64, clustered) != abi.entry_hash("0" * 64, spread)
    assert abi.attributes_signature(LaunchAttributes(cluster_dims=(2, 1, 1))) == {"cluster_dims": [2, 1, 1]}


def test_the_manifest_field_is_the_rows() -> None:
    assert list(LaunchAttributes.model_fields) == [r.name for r in la.ATTRIBUTES]
    assert ADDED_IN["LaunchAttributes.cluster_scheduling"] == "0.2.0"  # an older runtime refuses it, named
    with pytest.raises(ValidationError, match=r"KHAL_CLUSTER_SCHEDULING needs KHAL_CLUSTER"):
        LaunchAttributes(cluster_scheduling="spread")
    with pytest.raises(ValidationError):
        LaunchAttributes.model_validate_json(json.dumps({"cluster_dims": [2, 1, 1], "cluster_scheduling": "wide"}))
    assert LaunchAttributes.model_validate_json('{"cluster_dims": [2, 1, 1]}').describe() == "cluster 2x1x1"
    assert SPREAD.describe() == "cluster 2x1x1, cluster scheduling spread"  # the WebGPU refusal's words
    # a manifest without the field writes and reads as before
    assert "cluster_scheduling" not in LaunchAttributes(cluster_dims=(2, 1, 1)).model_dump(exclude_none=True)


def test_every_row_has_a_cuda_mapping_and_a_missing_one_is_named() -> None:
    assert set(CUDA_ATTRIBUTES.impls) == {r.name for r in la.ATTRIBUTES}
    with pytest.raises(la.AttributeTableError, match=r"a backend: its launch attribute table implements no "
                                                     r"'cluster_scheduling'"):
        la.AttributeTable("a backend", {n: v for n, v in CUDA_ATTRIBUTES.impls.items() if n != "cluster_scheduling"})


def test_each_row_has_a_marker_a_doc_and_a_documented_marker() -> None:
    """docs/guide/writing-kernels.md's table of launch attribute markers names every row's marker."""
    doc = (Path(__file__).resolve().parents[3] / "docs" / "guide" / "writing-kernels.md").read_text("utf-8")
    for row in la.ATTRIBUTES:
        assert row.marker.startswith("KHAL_") and row.doc
        assert f"| `{row.marker}" in doc, row.marker

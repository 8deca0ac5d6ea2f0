"""Issue #26 on a GPU: kernels that use the whole GPU, against NumPy references.

The package is tests/packages/attrs_kernels_pkg: a WMMA GEMM tile with 64 KB of dynamic shared memory
(``KHAL_SHARED_MEM(65536)``: launched with ``launch(..., shared_mem=65536)`` and nothing else), a
cooperative grid-sync reduction (``KHAL_COOPERATIVE``), a cluster kernel reading its partner block's
shared memory (``KHAL_CLUSTER(2, 1, 1)``, distributed shared memory), a ``__constant__`` table and a
``__device__`` counter filled and reset from Python (``crates["whole"].globals``), and a PDL pair
(``KHAL_PDL``, ``griddepcontrol.wait``). Set ``KHAL_TEST_ATTRS_WHEEL=path/to/khal_attrs_kernels-*.whl``
to use a wheel built beforehand; otherwise it is built here with ``pip wheel --no-build-isolation``.
Outputs are poisoned before each launch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tests.helpers.paths import PACKAGES

pytestmark = pytest.mark.gpu

PKG = PACKAGES / "attrs_kernels_pkg"


@pytest.fixture(scope="module")
def rt() -> Any:
    from tests.helpers.gpu import require_gpu

    require_gpu()
    import khal_runtime

    return khal_runtime


@pytest.fixture(scope="module")
def attrs(rt: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``khal_attrs_kernels`` imported from its wheel."""
    from tests.helpers.gpu import import_test_package

    yield from import_test_package(tmp_path_factory, PKG, "khal_attrs_kernels", "KHAL_TEST_ATTRS_WHEEL")


@pytest.fixture
def K(attrs: Any) -> Any:
    return attrs.kernels


def _dev(rt: Any, a: np.ndarray) -> Any:
    return rt.DeviceBuffer.from_numpy(np.ascontiguousarray(a))


def _poisoned(rt: Any, n: int, dtype: Any) -> Any:
    raw = np.full(n * np.dtype(dtype).itemsize, 0xEF, np.uint8)
    return rt.DeviceBuffer.from_numpy(raw.view(dtype))


def _gemm_inputs(m: int, n: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(26)
    a = rng.uniform(-1, 1, (m, k)).astype(np.float16)
    b = rng.uniform(-1, 1, (k, n)).astype(np.float16)
    ref = a.astype(np.float32) @ b.astype(np.float32)
    return a, np.ascontiguousarray(b.T), ref


# -- more than 48 KB of dynamic shared memory ---------------------------------------------------
def test_gemm_tile_with_64_kb_of_shared_memory_launches_as_declared(rt: Any, K: Any) -> None:
    assert K.gemm_tile.entry.attributes.max_dynamic_shared == 65536
    m, n, k = 256, 384, 512
    a, bt, ref = _gemm_inputs(m, n, k)
    da, dbt = _dev(rt, a.reshape(-1)), _dev(rt, bt.reshape(-1))
    c = _poisoned(rt, m * n, np.float32)
    K.gemm_tile.launch((m // 128) * (n // 128), None, da, dbt, c, m, n, k, shared_mem=65536)
    np.testing.assert_allclose(c.to_numpy().reshape(m, n), ref, rtol=2e-3, atol=2e-3)
    # the typed call launches with the declared 64 KB by itself
    c2 = _poisoned(rt, m * n, np.float32)
    K.gemm_tile((m // 128) * (n // 128) * 256, da, dbt, c2, m, n, k)
    np.testing.assert_allclose(c2.to_numpy().reshape(m, n), ref, rtol=2e-3, atol=2e-3)
    # and a bound launch
    c3 = _poisoned(rt, m * n, np.float32)
    K.gemm_tile.bind(da, dbt, c3, m, n, k)((m // 128) * (n // 128) * 256)
    np.testing.assert_allclose(c3.to_numpy().reshape(m, n), ref, rtol=2e-3, atol=2e-3)


def test_shared_memory_beyond_the_declaration_is_refused_before_the_driver(rt: Any, K: Any) -> None:
    x = _dev(rt, np.zeros(1 << 16, np.float16))
    c = _poisoned(rt, 1 << 16, np.float32)
    with pytest.raises(rt.LaunchAttributeError, match="more than the entry declares"):
        K.gemm_tile.launch(1, None, x, x, c, 128, 128, 64, shared_mem=65536 + 1024)
    with pytest.raises(rt.LaunchAttributeError, match=r"declare KHAL_SHARED_MEM\(65536\)"):
        K.reduce_pass2.launch(1, None, c, c, 1, shared_mem=65536)


# -- cooperative --------------------------------------------------------------------------------
def test_cooperative_grid_sync_reduction(rt: Any, K: Any) -> None:
    n = (1 << 22) + 77
    x = np.random.default_rng(7).uniform(-1, 1, n).astype(np.float32)
    dx = _dev(rt, x)
    sms = rt.Device(0).sm_count
    most = K.reduce_coop.max_cooperative_grid()
    assert most >= sms and most % sms == 0
    grid = sms * 2  # 256-thread blocks: at least 2 per SM co-resident on sm_90
    partial = _poisoned(rt, grid, np.float32)
    out = _poisoned(rt, 1, np.float32)
    K.reduce_coop.launch(grid, None, dx, partial, out, n)
    ref = float(x.astype(np.float64).sum())
    assert abs(float(out.to_numpy()[0]) - ref) < 1e-3 * max(1.0, abs(ref)) + 0.05
    # the typed call: as many threads as the co-resident grid holds
    out2 = _poisoned(rt, 1, np.float32)
    K.reduce_coop(grid * 256, dx, partial, out2, n)
    assert abs(float(out2.to_numpy()[0]) - ref) < 1e-3 * max(1.0, abs(ref)) + 0.05
    # bound
    out3 = _poisoned(rt, 1, np.float32)
    K.reduce_coop.bind(dx, partial, out3, n)(grid * 256)
    assert abs(float(out3.to_numpy()[0]) - ref) < 1e-3 * max(1.0, abs(ref)) + 0.05


def test_a_cooperative_grid_too_large_to_be_co_resident_is_refused_with_the_figure(rt: Any, K: Any) -> None:
    sms = rt.Device(0).sm_count
    x = _dev(rt, np.zeros(1024, np.float32))
    partial = _poisoned(rt, sms * 64, np.float32)
    with pytest.raises(rt.LaunchAttributeError, match=rf"cannot be co-resident.*x {sms} SMs"):
        K.reduce_coop.launch(sms * 64, None, x, partial, partial, 1024)  # > 2048 threads per SM
    with pytest.raises(rt.KhalError, match="no indirect .*cooperative"):
        K.reduce_coop.dispatch_indirect(_dev(rt, np.array([4], np.uint32)), x, partial, partial, 1024)


# -- clusters and distributed shared memory -------------------------------------------------------
def test_cluster_kernel_reads_its_partner_blocks_shared_memory(rt: Any, K: Any) -> None:
    pairs = 300
    x = np.random.default_rng(3).uniform(-1, 1, pairs * 2 * 128).astype(np.float32)
    dx = _dev(rt, x)
    out = _poisoned(rt, x.size, np.float32)
    K.cluster_pair_sum.launch(pairs * 2, None, dx, out)
    blocks = x.reshape(pairs, 2, 128)
    ref = (blocks + blocks[:, ::-1, :]).reshape(-1)
    np.testing.assert_array_equal(out.to_numpy(), ref)
    out2 = _poisoned(rt, x.size, np.float32)
    K.cluster_pair_sum(x.size, dx, out2)
    np.testing.assert_array_equal(out2.to_numpy(), ref)
    with pytest.raises(rt.LaunchAttributeError, match="not a whole number of its clusters"):
        K.cluster_pair_sum.launch(3, None, dx, out)


def test_spread_clusters_launch_and_give_the_same_sums(rt: Any, K: Any) -> None:
    """``KHAL_CLUSTER_SCHEDULING(spread)`` (#40 item 2: the policy Triton asks for every num_ctas > 1
    kernel): the driver takes the attribute on every path and the clusters still pair up."""
    assert K.cluster_pair_sum_spread.entry.attributes.cluster_scheduling == "spread"
    pairs = 300
    x = np.random.default_rng(5).uniform(-1, 1, pairs * 2 * 128).astype(np.float32)
    dx = _dev(rt, x)
    blocks = x.reshape(pairs, 2, 128)
    ref = (blocks + blocks[:, ::-1, :]).reshape(-1)
    for run in (lambda out: K.cluster_pair_sum_spread.launch(pairs * 2, None, dx, out),
                lambda out: K.cluster_pair_sum_spread(x.size, dx, out),
                lambda out: K.cluster_pair_sum_spread.bind(dx, out)(x.size)):
        out = _poisoned(rt, x.size, np.float32)
        run(out)
        np.testing.assert_array_equal(out.to_numpy(), ref)


def test_a_cluster_given_at_launch_forms_clusters_of_that_size(rt: Any, K: Any) -> None:
    """A kernel compiled without __cluster_dims__ (no KHAL_CLUSTER), launched with ``cluster=``:
    each block sees its rank and the cluster's size, and the pair sum reads its partner's shared
    memory as the compiled-in one does."""
    for dims, size in ((2, 2), ((4, 1, 1), 4), (8, 8)):
        out = _poisoned(rt, 2 * 64, np.uint32)
        K.cluster_shape.launch(64, None, out, cluster=dims)
        got = out.to_numpy().reshape(64, 2)
        np.testing.assert_array_equal(got[:, 0], np.arange(64) % size)
        np.testing.assert_array_equal(got[:, 1], np.full(64, size))
    out = _poisoned(rt, 2 * 64, np.uint32)
    K.cluster_shape.launch(64, None, out)  # no cluster given: clusters of one block
    np.testing.assert_array_equal(out.to_numpy().reshape(64, 2), np.tile([0, 1], (64, 1)))
    pairs = 300
    x = np.random.default_rng(4).uniform(-1, 1, pairs * 2 * 128).astype(np.float32)
    dx, res = _dev(rt, x), _poisoned(rt, x.size, np.float32)
    K.cluster_pair_sum_at_launch.launch(pairs * 2, None, dx, res, cluster=2)
    blocks = x.reshape(pairs, 2, 128)
    np.testing.assert_array_equal(res.to_numpy(), (blocks + blocks[:, ::-1, :]).reshape(-1))
    with pytest.raises(rt.LaunchAttributeError, match="not a whole number of its clusters"):
        K.cluster_pair_sum_at_launch.launch(3, None, dx, res, cluster=2)
    with pytest.raises(rt.LaunchAttributeError, match="more than the portable 8"):
        K.cluster_shape.launch(64, None, out, cluster=16)
    with pytest.raises(rt.LaunchAttributeError, match="leave cluster= out"):
        K.cluster_pair_sum.launch(8, None, dx, res, cluster=4)


# -- module globals -------------------------------------------------------------------------------
def test_a_constant_table_filled_from_python_and_a_counter_reset(rt: Any, K: Any, attrs: Any) -> None:
    g = K.crates["whole"].globals
    assert sorted(g) == ["hits", "lut"]
    lut = (np.arange(256, dtype=np.float32) * 0.5 - 7.0)
    g["lut"].copy_from_numpy(lut)
    g["hits"].fill_zero()
    n = 100_000
    idx = np.random.default_rng(5).integers(0, 1 << 20, n).astype(np.uint32)
    out = _poisoned(rt, n, np.float32)
    K.table_lookup(n, _dev(rt, idx), out, n)
    np.testing.assert_array_equal(out.to_numpy(), lut[idx & 255])
    assert int(g["hits"].to_numpy()[0]) == int(np.count_nonzero((idx & 255) == 0))
    np.testing.assert_array_equal(g["lut"].to_numpy(np.float32), lut)
    # in a graph: the table refilled from device memory and the counter reset on every replay
    st = rt.default_stream()
    table = rt.DeviceBuffer.from_numpy(lut, st)
    zero = rt.DeviceBuffer.from_numpy(np.zeros(1, np.uint32), st)
    didx = _dev(rt, idx)

    def step() -> None:
        g["lut"].copy_from(table, stream=st)
        g["hits"].copy_from(zero, stream=st)
        K.table_lookup(n, didx, out, n, stream=st)

    step()
    st.synchronize()
    with st.capture() as cap:
        step()
    graph = cap.graph
    lut2 = lut[::-1].copy()
    table.copy_from_numpy(lut2, st)
    graph.launch(st)
    np.testing.assert_array_equal(out.to_numpy(), lut2[idx & 255])
    assert int(g["hits"].to_numpy()[0]) == int(np.count_nonzero((idx & 255) == 0))
    graph.close()


# -- PDL ----------------------------------------------------------------------------------------
def test_a_pdl_pair_gives_the_results_of_the_serial_pair(rt: Any, K: Any) -> None:
    n = (1 << 20) + 3
    x = np.random.default_rng(11).uniform(-1, 1, n).astype(np.float32)
    dx, y, z = _dev(rt, x), _poisoned(rt, n, np.float32), _poisoned(rt, n, np.float32)
    ref_y = x * np.float32(2.0) + np.float32(1.0)
    for _ in range(20):  # back to back: each consumer overlaps its producer's tail
        K.pdl_producer(n, dx, y, n)
        K.pdl_consumer(n, y, z, n)
    np.testing.assert_array_equal(z.to_numpy(), ref_y * ref_y)
    # in a graph (programmatic edges) and bound
    st = rt.default_stream()
    z2 = _poisoned(rt, n, np.float32)
    prod, cons = K.pdl_producer.bind(dx, y, n, stream=st), K.pdl_consumer.bind(y, z2, n, stream=st)
    with st.capture() as cap:
        for _ in range(10):
            prod(n)
            cons(n)
    cap.graph.launch(st)
    np.testing.assert_array_equal(z2.to_numpy(), ref_y * ref_y)
    cap.graph.close()

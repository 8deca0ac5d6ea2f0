"""Issue #30 on a GPU: Triton tutorial kernels (vector add, fused softmax, matmul) built into a package (tests/packages/triton_kernels_pkg),
launched without Triton, against torch and against Triton's own JIT of the same source.

Built here with the build API (Triton 3.6 in this environment; no hatchling needed), twice: with an
sm_90 cubin (what an H200 loads) and with an sm_80 cubin only, so that the H200 JITs the PTX
fallback (PTX ISA 8.0: its CUDA 13.0 driver JITs up to 9.0). Outputs are poisoned before each launch.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.helpers.paths import PACKAGES

pytestmark = pytest.mark.gpu

PKG = PACKAGES / "triton_kernels_pkg"


@pytest.fixture(scope="module", params=["cubin", "ptx"])
def tri(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tests.helpers.gpu import require_gpu

    require_gpu()
    if importlib.util.find_spec("triton") is None or importlib.util.find_spec("torch") is None:
        pytest.skip("needs Triton and torch")
    import tomllib

    import khal_runtime
    from hatch_khal.builder import build_packages, write_package_output
    from hatch_khal.cache import Cache
    from hatch_khal.config import parse_config
    from hatch_khal.model import PrintReporter

    root = tmp_path_factory.mktemp(f"tri-{request.param}") / "pkg"
    shutil.copytree(PKG, root, ignore=shutil.ignore_patterns("_khal", "__pycache__"))
    table = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"]
    hook = dict(table["hooks"]["khal"])
    if request.param == "ptx":
        hook["archs"] = ["sm_80"]  # no cubin for sm_90: the H200 JITs the compute_80 PTX
    _, crates = parse_config(hook, default_package="khal_triton_kernels")
    result = build_packages(root, crates, PrintReporter(), cache=Cache(tmp_path_factory.mktemp("cache"), print))
    for out in result.packages:
        write_package_output(out, root / out.package)
    ks = khal_runtime.load(root / "khal_triton_kernels")
    ks.crates["tutorials"].load()
    return request.param, ks


def _stream() -> Any:
    import torch

    from khal_runtime.device import as_stream

    return as_stream(torch.cuda.current_stream())


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_vector_add_matches_torch_in_every_variant(tri: Any, dtype: str) -> None:
    import torch

    kind, ks = tri
    td = {"fp32": torch.float32, "fp16": torch.float16}[dtype]
    add = getattr(ks, f"add_{dtype}")
    st = _stream()
    for n, offset, want in ((98432, 0, f"add_{dtype}"), (98433, 0, f"add_{dtype}__base"),
                            (98432, 1, f"add_{dtype}__base")):
        base = torch.rand(n + offset, device="cuda", dtype=td)
        x = base[offset:]  # offset 1: a pointer not 16-byte aligned
        y = torch.rand(n, device="cuda", dtype=td)
        out = torch.full((n,), float("nan"), device="cuda", dtype=td)
        assert add.chosen(x, y, out, n) == want
        add[lambda meta: ((n + meta["BLOCK_SIZE"] - 1) // meta["BLOCK_SIZE"],)](x, y, out, n, stream=st)
        torch.cuda.synchronize()
        assert torch.equal(out, x + y), f"{kind} {want} n={n} offset={offset}"


def test_repeated_calls_follow_in_place_writes_moved_tensors_and_frees(tri: Any) -> None:
    """The Triton call's memo on the GPU: the same tensors again launch the block packed the first
    time; an in-place write is seen by the kernel (the same address), a tensor moved by ``set_`` /
    ``.data =`` is read again, a misaligned one switches to the conservative twin, another scalar
    is packed, and a freed DeviceBuffer is refused. Each repeated past ``PROMOTE_AFTER``: the
    family's shared snapshot (a copy of the block) is what launches, with the same checks."""
    import numpy as np
    import torch

    from khal_runtime import DeviceBuffer

    kind, ks = tri
    add = ks.add_fp32
    st = _stream()
    n = 4096
    x, y = torch.rand(n, device="cuda"), torch.rand(n, device="cuda")
    out = torch.full((n,), float("nan"), device="cuda")
    go = add[(n // 1024,)]
    for i in range(12):
        x.add_(1.0)  # written in place between launches
        out.fill_(float("nan"))
        go(x, y, out, n, stream=st)
        torch.cuda.synchronize()
        assert torch.equal(out, x + y), f"{kind}: call {i}"
    x.data = torch.rand(n, device="cuda")  # moved: the memo must read it again
    go(x, y, out, n, stream=st)
    torch.cuda.synchronize()
    assert torch.equal(out, x + y), f"{kind}: after .data ="
    storage = torch.rand(n + 1, device="cuda")
    x.set_(storage[1:])  # one float in: not 16-byte aligned
    assert add.chosen(x, y, out, n) == "add_fp32__base"
    for _ in range(3):
        out.fill_(float("nan"))
        go(x, y, out, n, stream=st)
        torch.cuda.synchronize()
        assert torch.equal(out, x + y), f"{kind}: the conservative twin after set_"
    half = n // 2
    for _ in range(3):
        out.fill_(float("nan"))
        go(x, y, out, half, stream=st)  # a changed scalar: only the first half written
        torch.cuda.synchronize()
        assert torch.equal(out[:half], (x + y)[:half]) and bool(out[half:].isnan().all()), kind
    a, b, c = (DeviceBuffer.from_numpy(np.full(n, v, np.float32)) for v in (1.0, 2.0, 0.0))
    for _ in range(12):
        go(a, b, c, n)
    assert float(c.to_numpy()[-1]) == 3.0
    assert any(snap[0] is a for snap in add._shared)  # (repeated past PROMOTE_AFTER: shared)
    a.free()
    with pytest.raises(ValueError, match="freed"):
        go(a, b, c, n)


def test_a_bound_launch_matches_torch_for_each_grid_and_refuses_a_freed_buffer(tri: Any) -> None:
    """``b = k.bind(...)``; ``b(grid)`` on the GPU: the grid given each call (a tuple again, a
    callable whose result changed, an int), the block packed at bind; a DeviceBuffer freed after
    binding is refused."""
    import numpy as np
    import torch

    from khal_runtime import DeviceBuffer

    kind, ks = tri
    add = ks.add_fp32
    st = _stream()
    n = 4096
    x, y = torch.rand(n, device="cuda"), torch.rand(n, device="cuda")
    out = torch.full((n,), float("nan"), device="cuda")
    b = add.bind(x, y, out, n, stream=st)
    g4, programs = (n // 1024,), [2]
    for grid, written in ((g4, n), (g4, n), (lambda meta: (programs[0],), 2048), (1, 1024)):
        out.fill_(float("nan"))
        for _ in range(3):
            b(grid)
        torch.cuda.synchronize()
        assert torch.equal(out[:written], (x + y)[:written]) and bool(out[written:].isnan().all()), (kind, grid)
    a, c, o = (DeviceBuffer.from_numpy(np.full(n, v, np.float32)) for v in (1.0, 2.0, 0.0))
    bb = add.bind(a, c, o, n)
    bb(g4)
    assert float(o.to_numpy()[-1]) == 3.0
    c.free()
    with pytest.raises(ValueError, match="freed"):
        bb(g4)


def test_fused_softmax_matches_torch(tri: Any) -> None:
    import torch

    kind, ks = tri
    x = torch.randn(1823, 781, device="cuda")
    y = torch.full_like(x, float("nan"))
    rows, cols = x.shape
    ks.softmax_1024[(min(rows, 132 * 4),)](y, x, x.stride(0), y.stride(0), rows, cols, stream=_stream())
    torch.cuda.synchronize()
    assert torch.allclose(y, torch.softmax(x, dim=1), atol=1e-6, rtol=1e-5), kind


def test_matmul_matches_torch(tri: Any) -> None:
    import torch

    kind, ks = tri
    for m, n, k, a_t in ((512, 512, 512, False), (333, 200, 96, False), (256, 256, 256, True)):
        # a_t: A column-major (stride_ak = m, not 1): the conservative twin, which takes every stride
        a = torch.randn(k, m, device="cuda", dtype=torch.float16).t() if a_t else \
            torch.randn(m, k, device="cuda", dtype=torch.float16)
        b = torch.randn(k, n, device="cuda", dtype=torch.float16)
        c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
        grid = ((m + 63) // 64 * ((n + 63) // 64),)
        want = "matmul_fp16" if m % 16 == 0 and n % 16 == 0 and k % 16 == 0 and not a_t else "matmul_fp16__base"
        args = (a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1))
        assert ks.matmul_fp16.chosen(*args) == want
        ks.matmul_fp16[grid](*args, stream=_stream())
        torch.cuda.synchronize()
        assert torch.allclose(c, torch.matmul(a, b), atol=1e-2, rtol=0), f"{kind} {m}x{n}x{k}"


def test_a_matmul_needing_more_than_48_kb_of_shared_memory_runs_opted_in(tri: Any) -> None:
    import torch

    kind, ks = tri
    big = ks.matmul_fp16_big
    assert big.entry.triton.shared > 48 * 1024 and big.entry.attributes.max_dynamic_shared == big.entry.triton.shared
    m, n, k = 512, 384, 256
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(k, n, device="cuda", dtype=torch.float16)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
    big[((m + 127) // 128 * ((n + 127) // 128),)](a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0),
                                                  b.stride(1), c.stride(0), c.stride(1), stream=_stream())
    torch.cuda.synchronize()
    assert torch.allclose(c, torch.matmul(a, b), atol=1e-2, rtol=0), kind


def test_outputs_equal_tritons_jit_of_the_same_source(tri: Any) -> None:
    import torch

    kind, ks = tri
    sys.path.insert(0, str(PKG / "kernels" / "triton"))
    try:
        import tutorials  # the same source, through Triton's JIT
    finally:
        sys.path.pop(0)
    n = 1 << 20
    x, y = torch.rand(n, device="cuda"), torch.rand(n, device="cuda")
    a, b = torch.empty_like(x), torch.empty_like(x)
    tutorials.add_kernel[(n // 1024,)](x, y, a, n, BLOCK_SIZE=1024)
    ks.add_fp32[(n // 1024,)](x, y, b, n, stream=_stream())
    torch.cuda.synchronize()
    assert torch.equal(a, b), kind


# -- autotuned kernels (tests/packages/triton_kernels_pkg/kernels/autotuned) ------------------------

TUNED = PACKAGES / "triton_kernels_pkg" / "kernels" / "autotuned" / "autotuned.py"


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The autotuned kernels built for sm_90 (timed per key on the H200), a rule-chosen one, and the
    same kernel with the instance's own constexpr."""
    from tests.helpers.gpu import require_gpu

    require_gpu()
    if importlib.util.find_spec("triton") is None or importlib.util.find_spec("torch") is None:
        pytest.skip("needs Triton and torch")
    import khal_runtime
    from hatch_khal.builder import build_packages, write_package_output
    from hatch_khal.cache import Cache
    from hatch_khal.config import parse_config
    from hatch_khal.model import PrintReporter

    root = tmp_path_factory.mktemp("tuned") / "p"
    (root / "k").mkdir(parents=True)
    (root / "pkg").mkdir()
    shutil.copy(TUNED, root / "k" / "autotuned.py")
    sig = {"x_ptr": "*fp32:16", "y_ptr": "*fp32:16", "out_ptr": "*fp32:16", "n_elements": "i32:16", "alpha": "fp32"}
    _, crates = parse_config({"archs": ["sm_90"], "ptx-arch": "none", "crates": [{"name": "tuned", "sources": [
        "k/*.py"], "instances": [
        {"kernel": "scaled_add", "signature": sig, "autotune": True},
        {"kernel": "scaled_add", "name": "scaled_add_plain", "signature": {**sig, "BLOCK_SIZE": 256}},
        {"kernel": "copy_even", "signature": {"x_ptr": "*fp32", "out_ptr": "*fp32", "n_elements": "i32",
                                              "EVEN": False}, "autotune": True},
        {"kernel": "accumulate", "signature": {"x_ptr": "*fp32", "out_ptr": "*fp32", "n_elements": "i32"},
         "autotune": True, "choose": 1}]}]}, default_package="pkg")
    result = build_packages(root, crates, PrintReporter(), cache=Cache(tmp_path_factory.mktemp("cache"), print))
    for out in result.packages:
        write_package_output(out, root / out.package)
    return khal_runtime.load(root / "pkg")


def _meta_grid(n: int) -> Any:
    return lambda meta: ((n + meta["BLOCK_SIZE"] - 1) // meta["BLOCK_SIZE"],)


def test_an_autotuned_kernel_matches_torch_with_a_config_chosen_per_key(tuned: Any) -> None:
    import torch

    k = tuned.scaled_add
    assert k.tuned and sorted(k.configs) == [0, 1]
    st = _stream()
    for n, offset in ((98432, 0), (4096, 0), (98433, 0), (98432, 1), (1 << 20, 0)):
        x = torch.rand(n + offset, device="cuda")[offset:]
        y = torch.rand(n, device="cuda")
        for alpha in (2.0, -0.5):  # the first call of a key times the configs, the second reuses the choice
            out = torch.full((n,), float("nan"), device="cuda")
            k[_meta_grid(n)](x, y, out, n, alpha, stream=st)
            torch.cuda.synchronize()
            assert torch.allclose(out, x * alpha + y, rtol=1e-6, atol=1e-6), f"n={n} offset={offset} alpha={alpha}"
        assert k.choices[(n,)] in (0, 1)
        want = "scaled_add__c" if n % 16 == 0 and offset == 0 else "scaled_add__base__c"
        assert k.chosen(x, y, out, n, 1.0) == f"{want}{k.choices[(n,)]}"
    assert set(k.choices) == {(98432,), (4096,), (98433,), (1 << 20,)}
    plain = tuned.scaled_add_plain  # the instance's own BLOCK_SIZE: no autotuning
    x, y = torch.rand(4096, device="cuda"), torch.rand(4096, device="cuda")
    out = torch.full_like(x, float("nan"))
    plain[_meta_grid(4096)](x, y, out, 4096, 3.0, stream=st)
    torch.cuda.synchronize()
    assert not plain.tuned and torch.allclose(out, x * 3.0 + y, rtol=1e-6, atol=1e-6)


def test_an_autotuned_kernel_in_a_captured_graph_uses_the_choice_made_before(tuned: Any) -> None:
    import torch

    from khal_runtime.device import default_stream
    from khal_runtime.errors import CaptureError

    k = tuned.scaled_add
    st = default_stream()  # khal's own stream (a capture cannot be on the legacy default stream)
    n = 65536
    x, y = torch.rand(n, device="cuda"), torch.rand(n, device="cuda")
    out = torch.full_like(x, float("nan"))
    with st.capture():
        with pytest.raises(CaptureError, match="before capturing"):
            k[_meta_grid(n)](x, y, out, n, 2.0, stream=st)
    torch.cuda.synchronize()
    k[_meta_grid(n)](x, y, out, n, 2.0, stream=st)  # the warm-up: timed here
    with st.capture() as cap:
        k[_meta_grid(n)](x, y, out, n, 2.0, stream=st)
    st.synchronize()
    out.fill_(float("nan"))
    torch.cuda.synchronize()
    cap.graph.launch(st)
    st.synchronize()
    torch.cuda.synchronize()
    assert torch.allclose(out, x * 2.0 + y, rtol=1e-6, atol=1e-6)


def test_a_heuristic_given_by_the_instance_and_a_rule_chosen_config_match_torch(tuned: Any) -> None:
    import torch

    st = _stream()
    n = 10000
    x = torch.rand(n, device="cuda")
    out = torch.full_like(x, float("nan"))
    tuned.copy_even[_meta_grid(n)](x, out, n, stream=st)
    torch.cuda.synchronize()
    assert torch.equal(out, x)
    acc = torch.zeros_like(x)
    tuned.accumulate[_meta_grid(n)](x, acc, n, stream=st)  # choose = 1: no timing on acc (atomics)
    torch.cuda.synchronize()
    assert torch.equal(acc, x) and tuned.accumulate.choices == {}


# -- the hopper crate (sm_90 cubin only): scratch memory and clusters ---------------------------------

def test_a_tensor_descriptor_kernel_gets_its_scratch_memory_and_matches_torch(tri: Any) -> None:
    """``tl.make_tensor_descriptor`` on sm_90 builds TMA descriptors in global scratch memory (384
    bytes per program): the runtime passes the stream's scratch buffer, grown when a grid needs
    more, on the checked, generated, remembered and bound paths, and in a captured graph."""
    import torch

    from khal_runtime import scratch
    from khal_runtime.device import default_stream

    kind, ks = tri
    desc = ks.desc_add_fp32
    assert desc.entry.triton.global_scratch.size > 0
    st = _stream()

    def grid(m: int, n: int) -> tuple[int, int]:
        return ((m + 31) // 32, (n + 31) // 32)

    for m, n in ((200, 176), (64, 64), (1000, 1008), (200, 176)):  # 1000 x 1008: 32 x 32 programs, grown
        x, y = torch.rand(m, n, device="cuda"), torch.rand(m, n, device="cuda")
        out = torch.full((m, n), float("nan"), device="cuda")
        for _ in range(3):  # checked / generated / remembered
            out.fill_(float("nan"))
            desc[grid(m, n)](x, y, out, m, n, stream=st)
            torch.cuda.synchronize()
            assert torch.equal(out, x + y), f"{kind} {m}x{n}"
    assert scratch.held()["pools"] >= 32 * 32 * 384
    m, n = 512, 256
    x, y = torch.rand(m, n, device="cuda"), torch.rand(m, n, device="cuda")
    out = torch.full((m, n), float("nan"), device="cuda")
    b = desc.bind(x, y, out, m, n, stream=st)
    b(grid(m, n))
    torch.cuda.synchronize()
    assert torch.equal(out, x + y), f"{kind} bound"
    own = default_stream()  # a capture on khal's stream: warm-up, capture, replay
    torch.cuda.synchronize()
    desc[grid(m, n)](x, y, out, m, n, stream=own)
    own.synchronize()
    with own.capture() as cap:
        desc[grid(m, n)](x, y, out, m, n, stream=own)
    assert cap.graph.scratch_bytes >= grid(m, n)[0] * grid(m, n)[1] * 384
    x.copy_(torch.rand(m, n, device="cuda"))
    out.fill_(float("nan"))
    torch.cuda.synchronize()
    cap.graph.launch(own)
    own.synchronize()
    assert torch.equal(out, x + y), f"{kind} graph replay"


def test_per_thread_streams_get_their_own_scratch_and_match_torch(tri: Any) -> None:
    """#38 item 2: two threads launching the tensor-descriptor kernel on ``CU_STREAM_PER_THREAD``
    (handle 2: a stream of each thread's own, running concurrently) each get their own scratch
    buffer (they shared one), and each thread's results are right."""
    import threading

    import torch

    from khal_runtime import scratch
    from khal_runtime.device import as_stream

    kind, ks = tri
    desc = ks.desc_add_fp32
    m, n = 1000, 1008
    grid = ((m + 31) // 32, (n + 31) // 32)
    errors: list[str] = []
    keys: list[Any] = []

    def work(seed: int) -> None:
        try:
            torch.cuda.set_device(0)
            st = as_stream(2)
            keys.append(scratch.stream_key(st))
            g = torch.Generator(device="cuda").manual_seed(seed)
            for _ in range(20):
                x = torch.rand(m, n, device="cuda", generator=g)
                y = torch.rand(m, n, device="cuda", generator=g)
                out = torch.full((m, n), float("nan"), device="cuda")
                desc[grid](x, y, out, m, n, stream=st)
                st.synchronize()
                if not torch.equal(out, x + y):
                    errors.append(f"{kind} thread {seed}: wrong result")
        except Exception as exc:  # noqa: BLE001  (reported below, with the thread)
            errors.append(f"{kind} thread {seed}: {exc!r}")

    threads = [threading.Thread(target=work, args=(s,)) for s in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(set(keys)) == 2  # one scratch buffer per thread


def test_a_num_ctas_2_kernel_launches_two_ctas_per_program_and_matches_torch(tri: Any) -> None:
    """Triton's vector add built with num_ctas = 2: each program a cluster of two CTAs (compiled
    in); launching one CTA per program would leave half of each block unwritten."""
    import torch

    kind, ks = tri
    add = ks.add_cluster_fp32
    assert add.entry.triton.num_ctas == 2 and add.entry.attributes.cluster_dims == (2, 1, 1)
    st = _stream()
    for n in (98432, 98433, 1 << 20):
        x, y = torch.rand(n, device="cuda"), torch.rand(n, device="cuda")
        for _ in range(3):
            out = torch.full((n,), float("nan"), device="cuda")
            add[lambda meta: ((n + meta["BLOCK_SIZE"] - 1) // meta["BLOCK_SIZE"],)](x, y, out, n, stream=st)
            torch.cuda.synchronize()
            assert torch.equal(out, x + y), f"{kind} n={n}"
    out = torch.full((n,), float("nan"), device="cuda")
    add.bind(x, y, out, n, stream=st)((n + 1023) // 1024)
    torch.cuda.synchronize()
    assert torch.equal(out, x + y), f"{kind} bound"

"""The example Slang kernels run on WebGPU (wgpu-py on Mesa's lavapipe, a CPU Vulkan) from the WGSL
and the SPIR-V the example wheel ships, driven only by what its manifest says (bindings, scalar
blocks, struct layouts per target), against the NumPy references. Skipped where wgpu-py or an
adapter is missing.

The tiny dispatcher here is a test harness, not the WebGPU backend: it packs uniforms and scalars
from ``Param.layouts`` / ``WebGpuTarget.scalar_slots`` and binds exactly ``WebGpuTarget.bindings``,
which is what that backend must do too."""

from __future__ import annotations

import importlib.util
import struct
import sys
import types
from typing import Any

import numpy as np
import pytest

from khal_runtime import abi
from khal_runtime.manifest import Entry, StructLayout

from tests.helpers.slang import EXAMPLE, needs_slang_or_wheel

pytestmark = [needs_slang_or_wheel, pytest.mark.skipif(importlib.util.find_spec("wgpu") is None,
                                              reason="wgpu-py is not installed")]


def _refs():  # type: ignore[no-untyped-def]
    """example_shader_pkg's reference modules without importing the package (it loads kernels)."""
    if "example_shader_pkg" not in sys.modules:
        pkg = types.ModuleType("example_shader_pkg")
        pkg.__path__ = [str(EXAMPLE / "example_shader_pkg")]  # type: ignore[attr-defined]
        sys.modules["example_shader_pkg"] = pkg
    from example_shader_pkg import reference, slang_reference, structs

    return reference, slang_reference, structs


@pytest.fixture(scope="module")
def device():  # type: ignore[no-untyped-def]
    import wgpu

    try:
        adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    except Exception as exc:  # noqa: BLE001 - no Vulkan driver at all
        pytest.skip(f"no WebGPU adapter: {exc}")
    if adapter is None:
        pytest.skip("no WebGPU adapter")
    features = [f for f in ("immediates", "shader-f16") if f in adapter.features]
    limits = {"max-immediate-size": adapter.limits.get("max-immediate-size", 0)} if "immediates" in features else {}
    return adapter.request_device_sync(required_features=features, required_limits=limits)


def pack(layout: StructLayout, values: dict[str, Any]) -> bytes:
    out = bytearray(layout.size)
    for f in layout.fields:
        code = "<" + abi.SCALARS[f.type].code
        flat = np.asarray(values[f.name]).reshape(-1) if f.shape else [values[f.name]]
        for i, v in enumerate(flat):
            off = f.offset + (i * f.strides[-1] if f.shape else 0)
            if len(f.shape) == 2:
                off = f.offset + (i // f.shape[1]) * f.strides[0] + (i % f.shape[1]) * f.strides[1]
            struct.pack_into(code, out, off, v.item() if hasattr(v, "item") else v)
    return bytes(out)


def run(device, crate, name: str, target: str, args: dict[str, Any], groups: int) -> dict[str, np.ndarray]:  # type: ignore[no-untyped-def]
    import wgpu

    entry: Entry = next(e for e in crate.entries if e.name == name)
    t = entry.target(target)
    assert t is not None
    code = crate.webgpu_files[t.path]
    module = device.create_shader_module(code=code.decode() if target == "wgsl" else code)
    params = {p.name: p for p in entry.params}
    block = bytearray(t.scalar_block_size)
    for s in t.scalar_slots:
        struct.pack_into("<" + abi.SCALARS[params[s.param].element_type].code, block, s.offset, args[s.param])
    layout_entries, group_entries, storage = [], [], {}
    for b in t.bindings:
        if b.param is None:
            data, kind = bytes(block), "uniform"
        elif params[b.param].kind == "uniform":
            data, kind = pack(params[b.param].layouts[target], args[b.param]), "uniform"
        else:
            data = np.ascontiguousarray(args[b.param]).tobytes()
            kind = "storage" if b.access == "read_write" else "read-only-storage"
        usage = (wgpu.BufferUsage.UNIFORM if kind == "uniform" else wgpu.BufferUsage.STORAGE) | \
            wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
        buf = device.create_buffer_with_data(data=data, usage=usage)
        if b.param is not None and kind == "storage":
            storage[b.param] = buf
        layout_entries.append({"binding": b.binding, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": kind}})
        group_entries.append({"binding": b.binding, "resource": {"buffer": buf, "offset": 0, "size": buf.size}})
    bgl = device.create_bind_group_layout(entries=layout_entries)
    push = t.scalars == "push_constants"
    pl = device.create_pipeline_layout(bind_group_layouts=[bgl], **({"immediate_size": t.scalar_block_size} if push else {}))
    pipeline = device.create_compute_pipeline(layout=pl, compute={"module": module, "entry_point": t.entry_point})
    bg = device.create_bind_group(layout=bgl, entries=group_entries)
    enc = device.create_command_encoder()
    cpass = enc.begin_compute_pass()
    cpass.set_pipeline(pipeline)
    cpass.set_bind_group(0, bg)
    if push:
        cpass.set_immediates(0, bytes(block), 0, t.scalar_block_size)
    cpass.dispatch_workgroups(groups, 1, 1)
    cpass.end()
    device.queue.submit([enc.finish()])
    return {k: np.frombuffer(device.queue.read_buffer(buf), dtype=np.asarray(args[k]).dtype).copy()
            for k, buf in storage.items()}


TARGETS = ["wgsl", "spirv"]


@pytest.mark.parametrize("target", TARGETS)
def test_saxpy_shared(device, example_slang, target: str) -> None:  # type: ignore[no-untyped-def]
    _, ref, _ = _refs()
    rng = np.random.default_rng(1)
    x = rng.standard_normal(1000).astype(np.float32)
    y = rng.standard_normal(1000).astype(np.float32)
    got = run(device, example_slang, "saxpy_shared", target, {"x": x, "y": y, "a": 1.7}, groups=4)
    assert ref.matches(got["y"], ref.saxpy_shared(x, y, 1.7), ulps=ref.WEBGPU_ULPS)


@pytest.mark.parametrize("target", TARGETS)
def test_atomic_reductions(device, example_slang, target: str) -> None:  # type: ignore[no-untyped-def]
    _, ref, _ = _refs()
    keys = np.random.default_rng(2).integers(0, 2**32, size=3000, dtype=np.uint32)
    got = run(device, example_slang, "sum_u32", target, {"values": keys, "total": np.array([7], np.uint32)}, groups=12)
    assert int(got["total"][0]) == ref.sum_u32(keys, 7)
    got = run(device, example_slang, "histogram256", target,
              {"keys": keys, "bins": np.zeros(256, np.uint32), "shift": 8}, groups=12)
    assert np.array_equal(got["bins"], ref.histogram256(keys, 8))


@pytest.mark.parametrize("target", TARGETS)
def test_affine_uniform_struct_and_scalars(device, example_slang, target: str) -> None:  # type: ignore[no-untyped-def]
    _, ref, _ = _refs()
    x = np.random.default_rng(3).standard_normal(200).astype(np.float32)
    values = {"scale": [1.5, -2.0, 0.25, 3.0], "shift": [0.5, -0.25, 0.125], "bias": 0.75, "step": 3,
              "mask": 0x3FF, "taps": [0.1, -0.2]}
    p = ref.Affine(tuple(values["scale"]), tuple(values["shift"]), values["bias"], values["step"], values["mask"],
                   tuple(values["taps"]))
    args = {"x": x, "y": np.zeros(200, np.float32), "k": np.zeros(200, np.int32), "p": values,
            "gain": 1.25, "base": -40, "count": 150}
    got = run(device, example_slang, "affine", target, args, groups=4)
    y, k = ref.affine(x, p, 1.25, -40, 150)
    assert np.array_equal(got["k"], k)
    assert ref.matches(got["y"], y, ulps=ref.WEBGPU_ULPS)  # lavapipe does not fuse a*b+c; NVIDIA's driver does
    assert np.all(got["y"][150:] == 0)


@pytest.mark.parametrize("target", TARGETS)
def test_particle_step(device, example_slang, target: str) -> None:  # type: ignore[no-untyped-def]
    reference, ref, structs = _refs()
    parts = reference.make_particles(1000, seed=4)
    sim = structs.SimParams(0.01, -9.81, 0.5, 900)
    sim_values = {"dt": sim.dt, "gravity": sim.gravity, "restitution": sim.restitution, "n": sim.n}
    crate = example_slang
    got = run(device, crate, "slang_integrate", target, {"particles": parts, "params": sim_values}, groups=8)
    stepped = ref.integrate(parts, sim)
    assert ref.matches(got["particles"].view(np.float32), stepped.view(np.float32), ulps=ref.WEBGPU_ULPS)
    got = run(device, crate, "slang_collide_ground", target, {"particles": stepped, "params": sim_values}, groups=8)
    bounced = ref.collide_ground(stepped, sim)
    assert ref.matches(got["particles"].view(np.float32), bounced.view(np.float32), ulps=ref.WEBGPU_ULPS)
    got = run(device, crate, "slang_count_active", target,
              {"particles": bounced, "params": sim_values, "count": np.zeros(1, np.uint32)}, groups=8)
    assert int(got["count"][0]) == ref.count_active(bounced, sim)
    got = run(device, crate, "slang_compact_alive", target,
              {"particles": bounced, "params": sim_values, "alive_indices": np.zeros(1000, np.uint32),
               "alive_count": np.zeros(1, np.uint32)}, groups=8)
    alive = ref.compact_alive(bounced, sim)
    n = int(got["alive_count"][0])
    assert n == alive.size and np.array_equal(np.sort(got["alive_indices"][:n]), alive)
    groups = -(-n // ref.PARTICLE_GROUP)
    got = run(device, crate, "slang_kinetic_energy", target,
              {"particles": bounced, "alive_indices": alive, "alive_count": np.array([n], np.uint32),
               "partials": np.zeros(groups, np.float32)}, groups=groups)
    np.testing.assert_allclose(got["partials"], ref.kinetic_energy_partials(bounced, alive), rtol=1e-5)

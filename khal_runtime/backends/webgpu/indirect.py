"""Indirect dispatch on WebGPU, natively: ``dispatch_workgroups_indirect``.

The user's count is a device array whose first u32 is the number of workgroups (``threads=True``:
of threads, rounded up to whole groups of the entry's block size, as ``k(n, ...)`` does). WebGPU
reads indirect arguments as three u32 ``(x, y, z)`` from a buffer with INDIRECT usage, so a
one-thread conversion kernel (hand-written WGSL below: there is no Slang source for it, it is the
runtime's own) writes ``(groups, 1, 1)`` into a per-device scratch buffer in the same command
stream, and the entry's indirect dispatch reads it. No host synchronisation; capturable into a
recording (both dispatches are recorded).

Counts above the device's ``max_compute_workgroups_per_dimension`` are clamped to it by the
conversion kernel (WebGPU would otherwise drop the dispatch): an entry without a group offset
cannot be split, as with a direct launch (which raises instead; the count is not known on the
host here).
"""

from __future__ import annotations

import hashlib
import struct
from typing import TYPE_CHECKING, Any, cast
from khal_runtime.backends.webgpu.bindings import Bound, Immediates
from khal_runtime.backends.webgpu.device import WebGpuDevice
from khal_runtime.backends.webgpu.launch import Launcher
from khal_runtime.backends.webgpu.memory import Allocation, View, alloc
from khal_runtime.backends.webgpu.pipeline import get_pipeline
from khal_runtime.manifest_records import Binding, Entry, Param, WebGpuTarget

if TYPE_CHECKING:
    from khal_runtime import manifest

__all__ = ["CONVERT_WGSL", "IndirectHelper", "dispatch_indirect", "indirect_helper"]

_NAME = "khal_indirect_args"

#: groups = count[0] (threads != 0: ceil(count[0] / block)), clamped to the device limit
CONVERT_WGSL_TEMPLATE = """// khal_runtime: indirect-dispatch arguments (hand-written WGSL, one thread)
struct KhalIndirectParams {
    block: u32,
    limit: u32,
    threads: u32,
    pad: u32,
}
@group(0) @binding(0) var<storage, read> khal_count: array<u32>;
@group(0) @binding(1) var<storage, read_write> khal_args: array<u32>;
@group(0) @binding(2) var<uniform> khal_p: KhalIndirectParams;

@compute @workgroup_size(1)
fn SYMBOL() {
    let n = khal_count[0];
    var g = n;
    if (khal_p.threads != 0u) {
        g = n / khal_p.block + select(0u, 1u, n % khal_p.block != 0u);
    }
    khal_args[0] = min(g, khal_p.limit);
    khal_args[1] = 1u;
    khal_args[2] = 1u;
}
"""
_HASH = hashlib.sha256(CONVERT_WGSL_TEMPLATE.encode()).hexdigest()[:16]
_SYMBOL = f"{_NAME}_khal_{_HASH}"
CONVERT_WGSL = CONVERT_WGSL_TEMPLATE.replace("SYMBOL", _SYMBOL)


def _entry() -> manifest.Entry:
    # (manifest records, as a loaded package's entries are: khal_runtime.manifest_load)
    return cast("manifest.Entry", Entry.construct(
        name=_NAME, symbol=_SYMBOL, hash=_HASH, block_size=(1, 1, 1),
        params=(Param.construct(name="khal_count", kind="storage", element_type="uint32", element_size=4,
                                element_align=4, shape="slice"),
                Param.construct(name="khal_args", kind="storage", element_type="uint32", element_size=4,
                                element_align=4, shape="slice", writable=True),
                Param.construct(name="khal_p", kind="uniform", element_type="KhalIndirectParams", element_size=16,
                                element_align=4)),
        webgpu=(WebGpuTarget.construct(target="wgsl", path="khal_runtime/indirect.wgsl", entry_point=_SYMBOL,
                                       bindings=(Binding.construct(param="khal_count", group=0, binding=0, access="read"),
                                                 Binding.construct(param="khal_args", group=0, binding=1,
                                                                   access="read_write"),
                                                 Binding.construct(param="khal_p", group=0, binding=2,
                                                                   access="uniform"))),),
    ))


class IndirectHelper:
    """Per device: the conversion pipeline and the scratch indirect-arguments buffer (one slot
    suffices: dispatches on a device run in order, each after the previous one's writes)."""

    def __init__(self, device: WebGpuDevice) -> None:
        entry = _entry()
        target = entry.webgpu[0]  # type: ignore[index]
        self.pipeline = get_pipeline(device, entry, target, CONVERT_WGSL, "khal_runtime")
        self.launcher = Launcher(self.pipeline)
        # made on the device's first indirect dispatch, which may be inside a capture (issue: the
        # first capture of an indirect dispatch was refused for an allocation the user never made)
        self.scratch: Allocation = alloc(device, 16, indirect=True, label="khal indirect args", device_lifetime=True)
        self.scratch_res = self.scratch.resource(0, 16)
        self.device = device

    def args_groups(self, count: View, threads: bool, block: int) -> tuple[Any, ...]:
        region = self.launcher.pool.region(struct.pack("<4I", block, self.device.max_groups, int(threads), 0))
        g, _ = self.launcher.plan[0]
        return (self.launcher.bind_group(g, [count.alloc.resource(count.offset, 4), self.scratch_res, region]),)


def indirect_helper(device: WebGpuDevice) -> IndirectHelper:
    return device.cache("indirect", IndirectHelper)  # type: ignore[no-any-return]


def dispatch_indirect(launcher: Launcher, count: View, threads: bool, block_x: int,
                      bgs: tuple[Bound, ...], imm: Immediates | None) -> None:
    """Record the conversion of ``count`` (a checked, bindable 4-byte view) and the indirect
    dispatch of ``launcher``'s pipeline with bind groups ``bgs`` and push constants ``imm``."""
    dev = launcher.device
    h = indirect_helper(dev)
    st = dev.stream
    hgroups = h.args_groups(count, threads, block_x)
    with st.lock:
        st.record(h.pipeline, hgroups, 1, 1, 1, None)
        st.record_indirect(launcher.pipeline, bgs, h.scratch.buffer, 0, imm)

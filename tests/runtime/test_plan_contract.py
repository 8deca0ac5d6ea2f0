"""The LaunchPlan contract (issue #25): what a backend's plan offers the generic layer, written as a
Protocol in khal_runtime.backends and checked when a backend's first plan is made."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from khal_runtime import backends
from khal_runtime.backends import LaunchPlan, check_plan

from tests.helpers.fakecuda import FakeDriver, fake, fake_kernels, make_entry, scalar, storage  # noqa: F401


def test_the_checked_members_are_the_protocols() -> None:
    annotated = set(LaunchPlan.__annotations__)
    methods = {n for n, v in vars(LaunchPlan).items()
               if (callable(v) or isinstance(v, property)) and not n.startswith("_")}
    assert set(backends._PLAN_MEMBERS) == annotated | methods


def test_the_cuda_plan_implements_it(fake: FakeDriver, tmp_path: Path) -> None:  # noqa: F811
    e = make_entry("k", (storage("x", writable=True), scalar("n", "uint32", 4)), 128)
    ks = fake_kernels(fake, tmp_path, [e])
    plan = ks.k.plan(0)
    assert check_plan(plan, "cuda") is plan
    assert plan.entry.name == "k" and plan.device_id == 0 and callable(plan.run)


class _Incomplete:
    def __init__(self) -> None:
        self.entry: Any = None
        self.crate = "c"
        self.device_id = 0
        self.run = 7  # not callable

    def regenerate_code(self) -> None:
        pass

    def clustered_run(self, cluster: Any) -> Any:
        pass

    def cooperative_limit(self, threads: int, shared: int) -> int:
        return 0

    def direct(self) -> None:
        pass

    @property
    def call(self) -> Any:
        raise AssertionError("check_plan must not read call: reading it makes the code")


def test_a_plan_missing_members_is_refused_at_once_naming_them() -> None:
    with pytest.raises(TypeError, match=r"the test backend's plan _Incomplete does not implement LaunchPlan: "
                                        r"missing learn; not callable: run"):
        check_plan(_Incomplete(), "test")
    assert _Incomplete not in backends._checked_plans  # checked again next time, not remembered as good


def test_the_kernel_reads_its_plans_call_and_hands_the_plan_nothing(fake: FakeDriver,  # noqa: F811
                                                                    tmp_path: Path) -> None:
    """One way down (#25): the kernel's call is the plan's ``call``, read by the kernel; no function
    of the generic layer above the backends (``kernels``) is held by the plan to call back."""
    import types

    e = make_entry("k", (storage("x", writable=True), scalar("n", "uint32", 4)), 128)
    k = fake_kernels(fake, tmp_path, [e]).k
    plan = k.plan(0)
    assert k.func is plan.call and plan.kernel is k
    held: list[Any] = []
    for v in vars(plan).values():
        held += v if isinstance(v, list) else [v]
    callbacks = [v for v in held if isinstance(v, (types.FunctionType, types.MethodType))
                 and getattr(v, "__module__", None) == "khal_runtime.kernels"]
    assert callbacks == []


def test_a_plan_is_asked_nothing_past_the_contract() -> None:
    """#40 item 3: the generic layers probe no plan member (``hasattr(plan, "clustered_run")``,
    ``getattr(plan, "fattrs")`` were): what they ask is in the Protocol, which both backends'
    plans implement (mypy holds them to it, ``khal_runtime/backends/*/backend.py``)."""
    import ast

    root = Path(__file__).resolve().parents[2]
    probes = []
    for name in ("kernels.py", "calls.py", "tracing.py", "graphs.py"):
        for n in ast.walk(ast.parse((root / "khal_runtime" / name).read_text("utf-8"))):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("hasattr", "getattr") \
                    and n.args and isinstance(n.args[0], ast.Name) and n.args[0].id in ("plan", "bk", "backend"):
                probes.append(f"{name}:{n.lineno}: {ast.unparse(n)}")
    assert probes == []


def test_the_kernel_is_what_the_backends_and_the_call_path_ask_of_it(fake: FakeDriver,  # noqa: F811
                                                                    tmp_path: Path) -> None:
    """``backends.KernelHandle``: the kernel's public members the backends and ``calls`` read."""
    from khal_runtime.backends import KernelHandle

    e = make_entry("k", (storage("x", writable=True), scalar("n", "uint32", 4)), 128)
    k = fake_kernels(fake, tmp_path, [e]).k
    members = {n for n in vars(KernelHandle) if not n.startswith("_")} | set(KernelHandle.__annotations__)
    assert members >= {"entry", "block_size", "grid_dims", "dynamic_shared", "ready_plan", "resolve_stream", "adopt"}
    missing = [n for n in sorted(members) if not hasattr(k, n)]
    assert missing == []
    assert k.block_size == (128, 1, 1) and k.grid_dims == 1 and k.dynamic_shared == 0
    assert k.ready_plan(0) is k.plan(0)

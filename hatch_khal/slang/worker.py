"""The Slang worker process: ``python -m hatch_khal.slang.worker`` (used by the Slang stage only).

Slang runs only here: ``spCompile`` has crashed the whole process on some inputs, and a crash must
become a build error, never a dead pip. One worker serves one crate (creating a Slang session costs
about a second), over a line-based JSON protocol on stdin / stdout:

1. the parent sends the crate (sources as text, search paths, defines, Slang options); the worker
   compiles the whole module to CUDA source and answers with the code, the reflection of every
   entry point and the files Slang read;
2. the parent, having hashed the entries, sends the (entry, symbol) pairs to compile for WebGPU
   (possibly none); the worker compiles each entry alone per target (WGSL, SPIR-V) and answers with
   the code and that compile's reflection; then it exits.

A request with ``"list_stages": true`` is answered with every entry point and its stage (a compile to
HLSL, which takes all stages) instead: the stage asks it after a failed or crashed CUDA compile.

The worker exits when its parent dies: it blocks on stdin between messages (EOF ends it) and on
Linux asks the kernel to kill it with its parent (``PR_SET_PDEATHSIG``). Anything native code
prints on stdout is diverted to stderr, so that stdout carries the protocol only.
"""

from __future__ import annotations

import base64
import ctypes
import json
import os
import signal
import sys
import time
from typing import IO, Any

#: Test hook: "cuda" or "webgpu" makes the worker abort (as a crashing spCompile would) there.
CRASH_ENV = "_HATCH_KHAL_SLANG_SIMULATE_CRASH"
PARENT_ENV = "_HATCH_KHAL_SLANG_PARENT"

#: SlangCompileTarget values (slang.h)
TARGET_CODES = {"cuda": 17, "spirv": 6, "wgsl": 28, "hlsl": 5}
_STAGE_COMPUTE = 6
_LANG_SLANG = 1
_LANG_CUDA = 6
_FLAG_WHOLE_PROGRAM = 1 << 8
#: Options every compile gets: no warnings about entry-point scalars moving to their own block
#: (E31106/E31107: that is how WGSL / SPIR-V must hold them, and the manifest records where).
BASE_OPTIONS = ["-warnings-disable", "31106,31107"]


def _die_with_parent() -> None:
    parent = os.environ.get(PARENT_ENV)
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):  # pragma: no cover - prctl is always there on Linux
            pass
    if parent and os.getppid() != int(parent):  # the parent died before prctl took effect
        os._exit(1)


def _protocol_stdout() -> IO[str]:
    """A private copy of stdout for the protocol; fd 1 then points at stderr."""
    fd = os.dup(1)
    os.dup2(2, 1)
    return os.fdopen(fd, "w", encoding="utf-8")


def _maybe_crash(stage: str) -> None:
    if os.environ.get(CRASH_ENV) == stage:
        os.abort()


class _Compiler:
    def __init__(self, request: dict[str, Any]) -> None:
        # lazy: the Slang library only in the worker process
        from hatch_khal.slang.library import load_slang

        self.lib = load_slang()
        self.req = request
        t0 = time.perf_counter()
        self.session = self.lib.spCreateSession(None)
        self.session_seconds = time.perf_counter() - t0

    def _request(self, target: str, extra: list[str], entry: str | None) -> int:
        lib, req = self.lib, self.req
        r = lib.spCreateCompileRequest(self.session)
        lib.spSetCodeGenTarget(r, TARGET_CODES[target])
        if entry is None:
            lib.spSetTargetFlags(r, 0, _FLAG_WHOLE_PROGRAM)
        for d in req["search_paths"]:
            lib.spAddSearchPath(r, d.encode())
        for k, v in req["defines"].items():
            lib.spAddPreprocessorDefine(r, k.encode(), v.encode())
        args = BASE_OPTIONS + list(req["slang_options"]) + extra
        argv = (ctypes.c_char_p * len(args))(*[a.encode() for a in args])
        if lib.spProcessCommandLineArguments(r, argv, len(args)) < 0:
            diag = (lib.spGetDiagnosticOutput(r) or b"").decode("utf-8", "replace")
            lib.spDestroyCompileRequest(r)
            raise _OptionError(f"Slang rejected the options {args}: {diag.strip() or 'invalid option'}")
        tu = lib.spAddTranslationUnit(r, _LANG_SLANG, req["crate"].encode())
        for src in req["sources"]:
            lib.spAddTranslationUnitSourceString(r, tu, src["rel"].encode(), src["text"].encode())
        if entry is not None:
            lib.spAddEntryPoint(r, tu, entry.encode(), _STAGE_COMPUTE)
        return int(r)

    def _compile(self, r: int) -> tuple[bool, str, float]:
        t0 = time.perf_counter()
        rc = self.lib.spCompile(r)
        secs = time.perf_counter() - t0
        diag = (self.lib.spGetDiagnosticOutput(r) or b"").decode("utf-8", "replace")
        return rc >= 0, diag, secs

    def cuda(self) -> dict[str, Any]:
        # lazy: the reflection module only in the worker, when asked
        from hatch_khal.slang.reflect import read_entries, read_global_params

        lib = self.lib
        r = self._request("cuda", [], None)
        try:
            _maybe_crash("cuda")
            ok, diag, secs = self._compile(r)
            out: dict[str, Any] = {"ok": ok, "stage": "cuda", "diagnostics": diag, "seconds": secs,
                                   "session_seconds": self.session_seconds, "version": self.lib.build_tag}
            if not ok:
                return out
            blob = ctypes.c_void_p()
            if lib.spGetTargetCodeBlob(r, 0, ctypes.byref(blob)) < 0 or not blob.value:
                return {**out, "ok": False, "diagnostics": diag + "\nSlang produced no CUDA code"}
            code = lib.blob_bytes(blob.value).decode("utf-8")
            prelude = lib.language_prelude(self.session, _LANG_CUDA)
            out.update(
                code=code,
                prelude_chars=len(prelude) if prelude and code.startswith(prelude) else -1,
                entries=read_entries(lib, r),
                globals=read_global_params(lib, r),
                dependencies=[(lib.spGetDependencyFilePath(r, i) or b"").decode("utf-8", "replace")
                              for i in range(lib.spGetDependencyFileCount(r))],
            )
            return out
        finally:
            lib.spDestroyCompileRequest(r)

    def stages(self) -> dict[str, Any]:
        """Every entry point of the module with its stage: a whole-module compile to HLSL, which takes
        every stage (the CUDA target takes compute entries only: others fail it, or crash Slang)."""
        lib = self.lib
        r = self._request("hlsl", [], None)
        try:
            ok, diag, _ = self._compile(r)
            refl = lib.spGetReflection(r) if ok else None
            if not refl:
                return {"ok": False, "stage": "stages", "diagnostics": diag}
            stages = []
            for i in range(lib.spReflection_getEntryPointCount(refl)):
                ep = lib.spReflection_getEntryPointByIndex(refl, i)
                name = (lib.spReflectionEntryPoint_getName(ep) or b"").decode("utf-8", "replace")
                stages.append([name, int(lib.spReflectionEntryPoint_getStage(ep))])
            return {"ok": True, "stages": stages}
        finally:
            lib.spDestroyCompileRequest(r)

    def webgpu(self, entry: str, symbol: str, target: str) -> dict[str, Any]:
        # lazy: the reflection module only in the worker, when asked
        from hatch_khal.slang.reflect import read_entries

        lib = self.lib
        r = self._request(target, ["-D", f"{entry}={symbol}", "-fvk-use-entrypoint-name"], symbol)
        try:
            _maybe_crash("webgpu")
            ok, diag, secs = self._compile(r)
            out: dict[str, Any] = {"ok": ok, "entry": entry, "target": target, "diagnostics": diag, "seconds": secs}
            if not ok:
                return out
            size = ctypes.c_size_t()
            ptr = lib.spGetEntryPointCode(r, 0, ctypes.byref(size))
            if not ptr or not size.value:
                return {**out, "ok": False, "diagnostics": diag + f"\nSlang produced no {target} code"}
            out["code"] = base64.b64encode(ctypes.string_at(ptr, size.value)).decode("ascii")
            out["entries"] = read_entries(lib, r)
            return out
        finally:
            lib.spDestroyCompileRequest(r)


class _OptionError(Exception):
    pass


def _send(out: IO[str], message: dict[str, Any]) -> None:
    out.write(json.dumps(message) + "\n")
    out.flush()


def main() -> int:
    _die_with_parent()
    out = _protocol_stdout()
    line = sys.stdin.readline()
    if not line:
        return 1
    request = json.loads(line)
    os.chdir(request["root"])
    try:
        compiler = _Compiler(request)
        if request.get("list_stages"):  # after a failed (or crashed) CUDA compile: why it failed
            _send(out, compiler.stages())
            return 0
        result = compiler.cuda()
    except _OptionError as exc:
        _send(out, {"ok": False, "stage": "options", "diagnostics": str(exc)})
        return 0
    except Exception as exc:  # noqa: BLE001 - a missing library etc.: reported, not a traceback
        _send(out, {"ok": False, "stage": "setup", "error": type(exc).__name__, "diagnostics": str(exc)})
        return 0
    _send(out, result)
    if not result["ok"]:
        return 0
    line = sys.stdin.readline()
    if not line:
        return 0
    jobs = json.loads(line).get("webgpu", [])
    results = []
    for job in jobs:
        for target in job["targets"]:
            res = compiler.webgpu(job["entry"], job["symbol"], target)
            results.append(res)
            if not res["ok"]:
                break
        if results and not results[-1]["ok"]:
            break
    _send(out, {"ok": all(r["ok"] for r in results), "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())

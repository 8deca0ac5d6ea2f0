"""The Slang compiler library of the ``slangpy`` wheel, through ctypes.

slangpy ships Slang as a shared library (``slangpy/libslang-compiler.so.0.<version>``) with its
headers. Its own Python API cannot compile without a GPU device, but the plain C functions of
``slang-deprecated.h`` can: this module declares their prototypes (copied from
``slangpy/include/slang-deprecated.h`` of slangpy 0.43.1) and nothing else. The folder is found
with :func:`importlib.util.find_spec`, **without importing slangpy** (its import loads the GPU
runtime). Only :mod:`hatch_khal.slang.worker` loads the library: ``spCompile`` crashes the
process on some inputs.
"""

from __future__ import annotations

import ctypes
import importlib.util
import re
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from hatch_khal.errors import KhalBuildError

__all__ = [
    "SLANGPY_REQUIREMENT",
    "SlangLibrary",
    "SlangLocation",
    "SlangNotFound",
    "find_slang",
    "load_slang",
]

#: What the build environment needs (the hatch hook adds it to the build requirements itself).
SLANGPY_REQUIREMENT = "slangpy==0.43.1"

_LIB_GLOBS = ("libslang-compiler.so*", "libslang-compiler*.dylib", "slang-compiler*.dll",
              "libslang.so*", "slang.dll")


class SlangNotFound(KhalBuildError):
    """No Slang compiler: slangpy is missing, or its wheel lacks the library."""


@dataclass(frozen=True)
class SlangLocation:
    library: Path  # the shared library
    version: str  # Slang's version ("2026.12"), from the file name
    slangpy_version: str  # the wheel's version ("0.43.1"), or "unknown"

    @property
    def fingerprint(self) -> dict[str, Any]:
        """What a cache key needs to know of the compiler (no paths: they differ per machine)."""
        try:
            size = self.library.stat().st_size
        except OSError:
            size = -1
        return {"slang": self.version, "slangpy": self.slangpy_version, "library_size": size}


def _missing(why: str) -> SlangNotFound:
    return SlangNotFound(
        f"the Slang compiler is not available ({why}). Slang crates are compiled with the Slang "
        f"library of the 'slangpy' wheel: add '{SLANGPY_REQUIREMENT}' to [build-system] requires "
        "(the hatchling hook adds it itself for isolated builds; for --no-build-isolation builds run: "
        f"pip install '{SLANGPY_REQUIREMENT}'). slangpy {SLANGPY_REQUIREMENT.split('==')[1]} needs "
        "glibc >= 2.34 on Linux."
    )


def _version_of(lib: Path) -> str:
    m = re.search(r"(\d{4}\.\d+(?:\.\d+)?)", lib.name)
    return m.group(1) if m else "unknown"


def find_slang(finder: Callable[[str], Any] | None = None) -> SlangLocation:
    """Locate the Slang library in the installed slangpy wheel, without importing slangpy.

    ``finder`` defaults to :func:`importlib.util.find_spec` (tests point it at nothing). Raises
    :class:`SlangNotFound` saying what to install."""
    try:
        spec = (finder or importlib.util.find_spec)("slangpy")
    except (ImportError, ValueError) as exc:
        raise _missing(f"looking up slangpy failed: {exc}") from None
    if spec is None:
        raise _missing("the 'slangpy' package is not installed")
    folders = list(spec.submodule_search_locations or [])
    if not folders and spec.origin:
        folders = [str(Path(spec.origin).parent)]
    for folder in folders:
        for pattern in _LIB_GLOBS:
            found = sorted(p for p in Path(folder).glob(pattern) if p.is_file())
            if found:
                lib = found[-1]
                return SlangLocation(lib, _version_of(lib), _slangpy_version())
    raise _missing(f"slangpy is installed in {', '.join(folders) or '?'} but holds no libslang-compiler")


def _slangpy_version() -> str:
    # lazy: metadata only when the version is asked for
    from importlib import metadata

    try:
        return metadata.version("slangpy")
    except metadata.PackageNotFoundError:
        return "unknown"


# ---------------------------------------------------------------------------------------------
# prototypes
# ---------------------------------------------------------------------------------------------
_P = ctypes.c_void_p
_S = ctypes.c_char_p
_I = ctypes.c_int
_U = ctypes.c_uint
_SZ = ctypes.c_size_t
_I64 = ctypes.c_int64
_U64 = ctypes.c_uint64

#: name -> (restype, argtypes), exactly as declared in slang-deprecated.h / slang.h.
PROTOTYPES: dict[str, tuple[Any, list[Any]]] = {
    "spGetBuildTagString": (_S, []),
    "spCreateSession": (_P, [_S]),
    "spDestroySession": (None, [_P]),
    "spCreateCompileRequest": (_P, [_P]),
    "spDestroyCompileRequest": (None, [_P]),
    "spSetCodeGenTarget": (None, [_P, _I]),
    "spSetTargetFlags": (None, [_P, _I, _U]),
    "spSetLineDirectiveMode": (None, [_P, _U]),
    "spProcessCommandLineArguments": (_I, [_P, ctypes.POINTER(_S), _I]),
    "spAddSearchPath": (None, [_P, _S]),
    "spAddPreprocessorDefine": (None, [_P, _S, _S]),
    "spAddTranslationUnit": (_I, [_P, _I, _S]),
    "spAddTranslationUnitSourceFile": (None, [_P, _I, _S]),
    "spAddTranslationUnitSourceString": (None, [_P, _I, _S, _S]),
    "spAddEntryPoint": (_I, [_P, _I, _S, _U]),
    "spCompile": (_I, [_P]),
    "spGetDiagnosticOutput": (_S, [_P]),
    "spGetDependencyFileCount": (_I, [_P]),
    "spGetDependencyFilePath": (_S, [_P, _I]),
    "spGetEntryPointCode": (_P, [_P, _I, ctypes.POINTER(_SZ)]),
    "spGetTargetCodeBlob": (_I, [_P, _I, ctypes.POINTER(_P)]),
    "spGetReflection": (_P, [_P]),
    "spIsParameterLocationUsed": (_I, [_P, _I64, _I64, _U, _U64, _U64, ctypes.POINTER(ctypes.c_bool)]),
    "spReflection_GetParameterCount": (_U, [_P]),
    "spReflection_GetParameterByIndex": (_P, [_P, _U]),
    "spReflection_ToJson": (_I, [_P, _P, ctypes.POINTER(_P)]),
    "spReflection_getEntryPointCount": (_U64, [_P]),
    "spReflection_getEntryPointByIndex": (_P, [_P, _U64]),
    "spReflectionEntryPoint_getName": (_S, [_P]),
    "spReflectionEntryPoint_getNameOverride": (_S, [_P]),
    "spReflectionEntryPoint_getStage": (_U, [_P]),
    "spReflectionEntryPoint_getParameterCount": (_U, [_P]),
    "spReflectionEntryPoint_getParameterByIndex": (_P, [_P, _U]),
    "spReflectionEntryPoint_getComputeThreadGroupSize": (None, [_P, _U64, ctypes.POINTER(_U64)]),
    "spReflectionEntryPoint_getVarLayout": (_P, [_P]),
    "spReflectionEntryPoint_hasDefaultConstantBuffer": (_I, [_P]),
    "spReflectionVariableLayout_GetVariable": (_P, [_P]),
    "spReflectionVariableLayout_GetTypeLayout": (_P, [_P]),
    "spReflectionVariableLayout_GetOffset": (_SZ, [_P, _U]),
    "spReflectionVariableLayout_GetSpace": (_SZ, [_P, _U]),
    "spReflectionVariableLayout_GetSemanticName": (_S, [_P]),
    "spReflectionVariable_GetName": (_S, [_P]),
    "spReflectionVariable_GetType": (_P, [_P]),
    "spReflectionType_GetKind": (_U, [_P]),
    "spReflectionType_GetName": (_S, [_P]),
    "spReflectionType_GetElementCount": (_SZ, [_P]),
    "spReflectionType_GetElementType": (_P, [_P]),
    "spReflectionType_GetScalarType": (_U, [_P]),
    "spReflectionType_GetRowCount": (_U, [_P]),
    "spReflectionType_GetColumnCount": (_U, [_P]),
    "spReflectionType_GetResourceShape": (_U, [_P]),
    "spReflectionType_GetResourceAccess": (_U, [_P]),
    "spReflectionType_GetResourceResultType": (_P, [_P]),
    "spReflectionTypeLayout_GetType": (_P, [_P]),
    "spReflectionTypeLayout_getKind": (_U, [_P]),
    "spReflectionTypeLayout_GetSize": (_SZ, [_P, _U]),
    "spReflectionTypeLayout_GetStride": (_SZ, [_P, _U]),
    "spReflectionTypeLayout_getAlignment": (ctypes.c_int32, [_P, _U]),
    "spReflectionTypeLayout_GetFieldCount": (ctypes.c_uint32, [_P]),
    "spReflectionTypeLayout_GetFieldByIndex": (_P, [_P, _U]),
    "spReflectionTypeLayout_GetElementStride": (_SZ, [_P, _U]),
    "spReflectionTypeLayout_GetElementTypeLayout": (_P, [_P]),
    "spReflectionTypeLayout_GetElementVarLayout": (_P, [_P]),
    "spReflectionTypeLayout_getContainerVarLayout": (_P, [_P]),
    "spReflectionTypeLayout_GetParameterCategory": (_U, [_P]),
    "spReflectionTypeLayout_GetCategoryCount": (_U, [_P]),
    "spReflectionTypeLayout_GetCategoryByIndex": (_U, [_P, _U]),
}

# IGlobalSession vtable slots (slang.h, struct IGlobalSession after ISlangUnknown's three).
_SLOT_GET_BUILD_TAG = 8
_SLOT_GET_LANGUAGE_PRELUDE = 12
# ISlangBlob vtable slots (after ISlangUnknown's queryInterface, addRef, release).
_SLOT_RELEASE = 2
_SLOT_BLOB_POINTER = 3
_SLOT_BLOB_SIZE = 4


class SlangLibrary:
    """The loaded library with its prototypes declared: ``lib.spCompile(req)`` etc."""

    def __init__(self, location: SlangLocation) -> None:
        self.location = location
        mode = getattr(ctypes, "RTLD_GLOBAL", 0)
        if sys.platform == "win32":  # pragma: no cover - Linux is what the project builds on
            mode = 0
        try:
            self._lib = ctypes.CDLL(str(location.library), mode=mode)
        except OSError as exc:
            raise _missing(f"{location.library.name} could not be loaded: {exc}") from None
        for name, (restype, argtypes) in PROTOTYPES.items():
            fn = getattr(self._lib, name)
            fn.restype = restype
            fn.argtypes = argtypes
            setattr(self, name, fn)

    def __getattr__(self, name: str) -> Any:  # only reached for names not in PROTOTYPES
        raise AttributeError(f"{name} is not a declared Slang function")

    @property
    def build_tag(self) -> str:
        return (self.spGetBuildTagString() or b"unknown").decode()

    # COM helpers --------------------------------------------------------------------------
    @staticmethod
    def _vtable_fn(obj: int, slot: int, restype: Any, *argtypes: Any) -> Any:
        vtable = ctypes.cast(ctypes.c_void_p(obj), ctypes.POINTER(ctypes.POINTER(ctypes.c_void_p)))[0]
        return ctypes.CFUNCTYPE(restype, ctypes.c_void_p, *argtypes)(vtable[slot])

    @classmethod
    def blob_bytes(cls, blob: int) -> bytes:
        """The contents of an ``ISlangBlob*``, which is released."""
        try:
            ptr = cls._vtable_fn(blob, _SLOT_BLOB_POINTER, ctypes.c_void_p)(blob)
            size = cls._vtable_fn(blob, _SLOT_BLOB_SIZE, ctypes.c_size_t)(blob)
            return ctypes.string_at(ptr, size) if size else b""
        finally:
            cls._vtable_fn(blob, _SLOT_RELEASE, ctypes.c_uint32)(blob)

    def language_prelude(self, session: int, language: int) -> str:
        """``IGlobalSession::getLanguagePrelude`` (6: CUDA), through the session's vtable.

        The slot is checked first: the slot of ``getBuildTagString`` must return the string the
        C function returns, else the vtable is not the one this module was written against."""
        tag = self._vtable_fn(session, _SLOT_GET_BUILD_TAG, ctypes.c_char_p)(session)
        if tag != self.spGetBuildTagString():
            raise KhalBuildError(
                f"Slang {self.build_tag}: the IGlobalSession vtable differs from the one hatch-khal "
                f"knows; use {SLANGPY_REQUIREMENT}"
            )
        out = ctypes.c_void_p()
        self._vtable_fn(session, _SLOT_GET_LANGUAGE_PRELUDE, None, ctypes.c_int,
                        ctypes.POINTER(ctypes.c_void_p))(session, language, ctypes.byref(out))
        return self.blob_bytes(out.value).decode("utf-8") if out.value else ""


@lru_cache(maxsize=1)
def load_slang() -> SlangLibrary:
    """Find and load the library (once per process). Only the worker process calls this."""
    return SlangLibrary(find_slang())

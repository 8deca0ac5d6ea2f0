"""Launch attributes: what an entry needs of its launch beyond grid and block, one row each.

An attribute is part of its entry (DESIGN.md, Kernel ABI): recorded in the manifest, hashed, set
once per function at load and carried by every launch. Each :class:`LaunchAttribute` row says
everything every layer knows of it, and every layer reads the rows:

- the manifest field and its type (:class:`khal_runtime.manifest.LaunchAttributes` is made from the
  rows), the value that means "none" (an attribute at its default is not hashed, so entries
  without it keep their hashes) and the release of khal-runtime that first reads the field;
- its marker in CUDA C++ sources (a ``KHAL_ENTRY`` option, :func:`hatch_khal.entries.scan_source`:
  :func:`parse_marker`), with the values it takes; a language without markers sets the field on
  the entries its front-end makes;
- the checks of a value and of the combinations (:func:`problems`: what it needs, what it cannot
  be combined with), the same at the marker and in the manifest;
- whether an entry with it can have an indirect (persistent-grid) variant;
- the words an inspect line, a trace and the WebGPU backend's refusal use (:func:`describe`).

What an attribute is on a device is its backend's: the CUDA backend maps each row to its checks
at load, what it sets on the function and the ``CUlaunchAttribute`` every launch carries
(``backends/cuda/attributes.py``, a table checked against these rows when it is imported);
WebGPU has no launch attributes and refuses an entry with any, naming them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Iterator, Literal, Mapping, Optional, TypeVar

__all__ = ["ATTRIBUTES", "CLUSTER_DIMS", "CLUSTER_SCHEDULING", "COOPERATIVE", "DEFAULT_DYNAMIC_SHARED",
           "LaunchAttribute", "MAX_DYNAMIC_SHARED", "MAX_PORTABLE_CLUSTER", "PDL", "AttributeTable",
           "AttributeTableError", "describe", "indirect_blocker", "parse_marker", "problems", "signature",
           "value_of", "values"]

_T = TypeVar("_T")

#: dynamic shared memory a function may use without opting in
DEFAULT_DYNAMIC_SHARED = 48 * 1024
#: blocks in a cluster every sm_90 device supports (more needs a non-portable opt-in)
MAX_PORTABLE_CLUSTER = 8
#: the most dynamic shared memory a marker may ask for (the device's opt-in maximum is checked at
#: load: 227 KB on sm_90), and the most a manifest may record
_MAX_MARKER_SHARED = 1 << 20
_MAX_SHARED = 1 << 24
_INT_RE = re.compile(r"0|[1-9][0-9]*")  # fullmatch: a C integer literal without leading zeros


@dataclass(frozen=True)
class LaunchAttribute(Generic[_T]):
    """One launch attribute, as every layer sees it (the module's docstring)."""

    #: the manifest field (``LaunchAttributes.<name>``), also its key in the entry hash
    name: str
    #: its CUDA C++ marker, a ``KHAL_ENTRY`` option
    marker: str
    #: the marker's arguments as the grammar spells them: "" for a flag (``KHAL_PDL``)
    arguments: str
    #: the manifest field's type (pydantic validates it) and its default: no attribute
    annotation: Any
    default: _T
    #: the first release of khal-runtime that reads the field (None: every release)
    since: Optional[str]
    #: what it asks of the launch, for the docs and the model's field description
    doc: str
    #: the marker's arguments (their texts, ``[]`` for a flag) -> the value; ValueError says what is
    #: wrong after "<file>:<line>: entry '<name>': "
    parse: Callable[[list[str], str], _T]
    #: a value's problem, or None (the marker's value passed it already; a manifest's is checked)
    check: Callable[[_T], Optional[str]] = field(default=lambda v: None)
    #: "dynamic shared 65536 B", "cluster 2x1x1": the words for a value that is not the default
    words: Callable[[_T], str] = field(default=lambda v: "")
    #: why an entry with it has no indirect (persistent-grid) variant ("" when it may have one)
    no_indirect: str = ""
    #: (attribute, why) it needs, and (attribute, why) its marker cannot be combined with
    requires: tuple[tuple[str, str], ...] = ()
    excludes: tuple[tuple[str, str], ...] = ()

    def of(self, attributes: Any) -> _T:
        """Its value in ``attributes`` (a manifest ``LaunchAttributes``, a mapping of fields, or None)."""
        v = value_of(attributes, self.name)
        return self.default if v is None else v


def _is_set(row: LaunchAttribute[Any], v: Any) -> bool:
    return v is not None and v != row.default and v is not False


def _flag(args: list[str], option: str) -> bool:
    return True


def _shared(args: list[str], option: str) -> int:
    if len(args) != 1 or not _INT_RE.fullmatch(args[0]) or not 1 <= int(args[0]) <= _MAX_MARKER_SHARED:
        raise ValueError(f"{option!r} must be KHAL_SHARED_MEM(bytes) with 1 <= bytes <= {_MAX_MARKER_SHARED}")
    return int(args[0])


def _cluster_problem(v: tuple[int, int, int]) -> Optional[str]:
    if any(d < 1 for d in v) or v[0] * v[1] * v[2] > 32:
        return f"cluster dims {tuple(v)} must be positive with at most 32 blocks in all ({MAX_PORTABLE_CLUSTER} portable)"
    return None


def _cluster(args: list[str], option: str) -> tuple[int, int, int]:
    if not 1 <= len(args) <= 3 or not all(_INT_RE.fullmatch(x) for x in args):
        raise ValueError(f"{option!r} must be KHAL_CLUSTER(x[, y[, z]])")
    dims = [int(x) for x in args] + [1] * (3 - len(args))
    v = (dims[0], dims[1], dims[2])
    problem = _cluster_problem(v)
    if problem is not None:
        raise ValueError(problem)
    return v


#: the cluster scheduling policies a launch may prefer (``CUclusterSchedulingPolicy``)
SCHEDULING_POLICIES = ("spread", "load_balancing")


def _scheduling(args: list[str], option: str) -> Optional[str]:
    if len(args) != 1 or args[0] not in SCHEDULING_POLICIES:
        raise ValueError(f"{option!r} must be KHAL_CLUSTER_SCHEDULING({' | '.join(SCHEDULING_POLICIES)})")
    return args[0]


MAX_DYNAMIC_SHARED: LaunchAttribute[Optional[int]] = LaunchAttribute(
    name="max_dynamic_shared", marker="KHAL_SHARED_MEM", arguments="(bytes)", annotation=Optional[int],
    default=None, since=None,
    doc="bytes of dynamic shared memory the entry needs at most: the typed call's dynamic shared memory; "
        "above 48 KB the function is opted in once at load (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES), "
        "checked against the device's opt-in maximum",
    parse=_shared,
    check=lambda v: None if v is None or 0 <= v <= _MAX_SHARED else f"max_dynamic_shared {v} is not in 0..{_MAX_SHARED}",
    words=lambda v: f"dynamic shared {v} B" if v else "")
COOPERATIVE: LaunchAttribute[bool] = LaunchAttribute(
    name="cooperative", marker="KHAL_COOPERATIVE", arguments="", annotation=bool, default=False, since=None,
    doc="a cooperative grid (grid.sync(), CU_LAUNCH_ATTRIBUTE_COOPERATIVE): a grid larger than can be "
        "co-resident is refused",
    parse=_flag, words=lambda v: "cooperative",
    no_indirect="cooperative (KHAL_COOPERATIVE)",
    excludes=(("cluster_dims", "the driver launches a cooperative grid without clusters"),))
CLUSTER_DIMS: LaunchAttribute[Optional[tuple[int, int, int]]] = LaunchAttribute(
    name="cluster_dims", marker="KHAL_CLUSTER", arguments="(x[, y[, z]])", annotation=Optional[tuple[int, int, int]],
    default=None, since=None,
    doc="thread-block cluster dims, compiled in (__cluster_dims__, .reqnctapercluster; sm_90+): the "
        "grid must be a whole number of clusters",
    parse=_cluster, check=lambda v: None if v is None else _cluster_problem(v),
    words=lambda v: "cluster " + "x".join(str(d) for d in v) if v else "",
    no_indirect="clustered (KHAL_CLUSTER)")
PDL: LaunchAttribute[bool] = LaunchAttribute(
    name="pdl", marker="KHAL_PDL", arguments="", annotation=bool, default=False, since=None,
    doc="programmatic dependent launch (CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION): the "
        "launch may start before the previous kernel on the stream ends (it waits in "
        "cudaGridDependencySynchronize)",
    parse=_flag, words=lambda v: "PDL")
CLUSTER_SCHEDULING: LaunchAttribute[Optional[str]] = LaunchAttribute(
    name="cluster_scheduling", marker="KHAL_CLUSTER_SCHEDULING", arguments="(spread | load_balancing)",
    annotation=Optional[Literal["spread", "load_balancing"]], default=None, since="0.2.0",
    doc="how the clusters of a clustered entry are placed on the GPU's processor clusters "
        "(CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE): spread them out, or balance the load; "
        "Triton's launcher asks for spread for every num_ctas > 1 kernel",
    parse=_scheduling,
    check=lambda v: None if v is None or v in SCHEDULING_POLICIES else
    f"cluster_scheduling {v!r} is none of {', '.join(SCHEDULING_POLICIES)}",
    words=lambda v: f"cluster scheduling {v}",
    requires=(("cluster_dims", "a scheduling policy places a clustered entry's clusters"),))

#: every launch attribute, in manifest and hash order
ATTRIBUTES: tuple[LaunchAttribute[Any], ...] = (MAX_DYNAMIC_SHARED, COOPERATIVE, CLUSTER_DIMS, PDL, CLUSTER_SCHEDULING)
_BY_FIELD = {r.name: r for r in ATTRIBUTES}
_BY_MARKER = {r.marker: r for r in ATTRIBUTES}


def value_of(attributes: Any, name: str) -> Any:
    """Field ``name`` of ``attributes`` (a model, a mapping of fields, or None), None when absent."""
    if attributes is None:
        return None
    return attributes.get(name) if isinstance(attributes, Mapping) else getattr(attributes, name, None)


def values(attributes: Any) -> Iterator[tuple[LaunchAttribute[Any], Any]]:
    """(row, value) of every attribute of ``attributes`` that is not at its default, in row order."""
    for row in ATTRIBUTES:
        v = value_of(attributes, row.name)
        if _is_set(row, v):
            yield row, v


def _json(v: Any) -> Any:
    if isinstance(v, bool) or isinstance(v, str):
        return v
    if isinstance(v, (tuple, list)):
        return [int(x) for x in v]
    return int(v)


def signature(attributes: Any) -> dict[str, Any]:
    """The attributes that differ from their defaults, as the entry hash sees them (empty: hashed
    as no attributes at all, so an entry without them keeps the hash it had before they existed)."""
    return {row.name: _json(v) for row, v in values(attributes)}


def describe(attributes: Any) -> str:
    """``dynamic shared 65536 B, cooperative, cluster 2x1x1, PDL`` (empty: none)."""
    return ", ".join(filter(None, (row.words(v) for row, v in values(attributes))))


def problems(attributes: Any, *, marker: bool = False) -> list[str]:
    """What is wrong with ``attributes``: a value a row refuses, an attribute without one it needs
    and, for markers (``marker``), two the marker grammar does not combine (named by their markers;
    a manifest is not refused for those: Triton's compile may ask for both)."""
    out = []
    given = {row.name: v for row, v in values(attributes)}
    for row in ATTRIBUTES:
        v = value_of(attributes, row.name)
        problem = row.check(v) if v is not None else None
        if problem is not None:
            out.append(problem)
    for name in given:
        row = _BY_FIELD[name]
        for other, why in row.requires:
            if other not in given:
                out.append(f"{row.marker} needs {_BY_FIELD[other].marker} ({why})")
        for other, why in row.excludes if marker else ():
            if other in given:
                out.append(f"{row.marker} and {_BY_FIELD[other].marker} cannot be combined ({why})")
    return out


def indirect_blocker(attributes: Any) -> Optional[str]:
    """Why an entry with ``attributes`` has no indirect variant (``"cooperative (KHAL_COOPERATIVE)"``),
    None when it may have one."""
    return next((row.no_indirect for row, _ in values(attributes) if row.no_indirect), None)


def parse_marker(option: str) -> Optional[tuple[LaunchAttribute[Any], Any]]:
    """(row, value) of a ``KHAL_ENTRY`` option that is a launch attribute's marker (``KHAL_PDL``,
    ``KHAL_CLUSTER(2, 1)``), None when it is none; ValueError says what is wrong with one that is."""
    m = re.fullmatch(r"\s*(\w+)\s*(?:\((.*)\))?\s*", option, re.S)
    row = _BY_MARKER.get(m.group(1)) if m else None
    if row is None or m is None:
        return None
    if not row.arguments:
        if m.group(2) is not None:
            raise ValueError(f"{row.marker} takes no arguments, got {option!r}")
        return row, row.parse([], option)
    if m.group(2) is None:
        raise ValueError(f"{option.strip()!r} must be {row.marker}{row.arguments}")
    return row, row.parse([x.strip() for x in m.group(2).split(",")], option.strip())


def markers() -> str:
    """The markers as an error lists them: ``KHAL_SHARED_MEM(bytes), KHAL_COOPERATIVE, ...``."""
    return ", ".join(r.marker + r.arguments for r in ATTRIBUTES)


class AttributeTableError(ValueError):
    """A backend's :class:`AttributeTable` does not map exactly the declared :data:`ATTRIBUTES`:
    raised where the table is made (the import of its module), never at a launch."""


class AttributeTable(Generic[_T]):
    """A backend's implementation of each launch attribute (field -> what it does on that
    backend), checked when it is made against :data:`ATTRIBUTES`, as :class:`khal_runtime.abi.ReaderTable`
    is against the readers: an attribute declared without an implementation here is an
    :class:`AttributeTableError` naming the backend and the attribute."""

    def __init__(self, where: str, impls: Mapping[str, _T]) -> None:
        missing = [r.name for r in ATTRIBUTES if r.name not in impls]
        extra = [n for n in impls if n not in _BY_FIELD]
        if missing or extra:
            raise AttributeTableError(
                f"{where}: its launch attribute table " + "; ".join(
                    ([f"implements no {', '.join(map(repr, missing))}"] if missing else [])
                    + ([f"implements {', '.join(map(repr, extra))}, which launch_attributes.ATTRIBUTES does not "
                        "declare"] if extra else []))
                + f" (ATTRIBUTES declares {', '.join(_BY_FIELD)})")
        self.where = where
        self.impls: dict[str, _T] = dict(impls)

    def __getitem__(self, name: str) -> _T:
        return self.impls[name]

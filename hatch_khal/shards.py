"""Builds split across machines: what a shard is, the record it leaves, and the merge's checks.

A shard compiles part of a build's compile jobs (``python -m hatch_khal shard``, :mod:`hatch_khal.distributed`):

* ``I/N`` (``KHAL_SHARD=2/8``): the N-way split: the jobs in (target, crate) order, every N-th one
  from the I-th;
* ``arch=sm_90,sm_100``: the jobs of those targets (PTX targets by their ``compute_`` name);
* ``crate=core,fast``: the jobs of those crates.

Its partial artifact set is a folder holding a cache (``cache/``, the local cache's layout: every
compile output of its jobs, and what the languages' front stages used) and :data:`RECORD_NAME`: the
shard, the toolchain, each crate's content hash, every job of the whole build (crate, target, key)
and those this shard built. The merge reads the records, checks that the shards agree with each
other and cover every job once (:func:`merge_plan`), then builds the wheel with their outputs as its
cache and ``KHAL_MERGE`` set: the build checks its own plan against the shards' (:func:`check_merge`)
and compiles nothing, so the merged wheel is the one a single machine builds, byte for byte.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hatch_khal.errors import ConfigError, MergeError

if TYPE_CHECKING:
    from hatch_khal.builder import JobPlan
    from hatch_khal.cache import Cache
    from hatch_khal.model import CompileJob

__all__ = ["MERGE_ENV", "RECORD_NAME", "SHARD_ENV", "ShardSpec", "check_merge", "merge_plan", "merge_record",
           "parse_shard", "refuse_shard_variable", "shard_record"]

SHARD_ENV = "KHAL_SHARD"
#: set by ``python -m hatch_khal merge`` for the wheel build it runs: the merged record's path
MERGE_ENV = "KHAL_MERGE"
RECORD_NAME = "khal-shard.json"
_FORMAT = 1
_SPLIT = re.compile(r"\s*(\d+)\s*/\s*(\d+)\s*")


@dataclass(frozen=True)
class ShardSpec:
    """One shard: ``kind`` "split" (``index`` of ``count``), "arch" or "crate" (``values``)."""

    kind: str
    index: int = 0
    count: int = 0
    values: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return f"{self.index}/{self.count}" if self.kind == "split" else f"{self.kind}={','.join(self.values)}"

    def select(self, jobs: list[CompileJob]) -> list[CompileJob]:
        """This shard's jobs among every job of the build."""
        if self.kind == "split":
            # target-major: each shard gets a share of every target's crates (a crate's targets cost alike)
            ordered = sorted(jobs, key=lambda j: (j.target, j.crate))
            return [j for i, j in enumerate(ordered) if i % self.count == self.index - 1]
        field = "target" if self.kind == "arch" else "crate"
        return [j for j in jobs if getattr(j, field) in self.values]


def parse_shard(text: str, where: str = SHARD_ENV) -> ShardSpec:
    """``I/N``, ``arch=...`` or ``crate=...``; ConfigError naming ``where`` otherwise."""
    m = _SPLIT.fullmatch(text)
    if m:
        index, count = int(m.group(1)), int(m.group(2))
        if not 1 <= index <= count:
            raise ConfigError(f"{where}={text!r}: shard {index} of {count} does not exist; shards are numbered "
                              f"1 to {count} (I/N with 1 <= I <= N)")
        return ShardSpec("split", index, count)
    kind, _, rest = text.partition("=")
    values = tuple(sorted({v.strip() for v in rest.split(",") if v.strip()}))
    if kind.strip() in ("arch", "crate") and values:
        return ShardSpec(kind.strip(), values=values)
    raise ConfigError(f"{where}={text!r}: not a shard; write I/N (shard I of an N-way split of the compile jobs, "
                      "e.g. 2/8), arch=sm_90[,sm_100] or crate=NAME[,NAME]")


def refuse_shard_variable() -> None:
    """A wheel build with ``KHAL_SHARD`` set: a shard makes a partial artifact set, not a wheel."""
    raw = os.environ.get(SHARD_ENV, "").strip()
    if raw:
        raise ConfigError(f"{SHARD_ENV}={raw!r} is set, and this is a wheel build: a shard compiles part of the "
                          "kernels into a partial artifact set, not a wheel. Run `python -m hatch_khal shard` in the "
                          "shard jobs and `python -m hatch_khal merge` to make the wheel; unset "
                          f"{SHARD_ENV} for a whole build")


def _jobs(jobs: list[CompileJob]) -> list[dict[str, str]]:
    return [{"crate": j.crate, "target": j.target, "key": j.key} for j in sorted(jobs, key=lambda j: (j.crate, j.target))]


def shard_record(spec: ShardSpec, plan: JobPlan, built: list[CompileJob], version: str) -> dict[str, Any]:
    """What a shard's folder says about it (:data:`RECORD_NAME`)."""
    return {
        "format": _FORMAT,
        "hatch_khal": version,
        "shard": {"kind": spec.kind, "index": spec.index, "count": spec.count, "values": list(spec.values)},
        "toolchain": dict(sorted(plan.versions().items())),
        "crates": {p.cfg.name: p.content_hash for p in sorted(plan.prepared, key=lambda p: p.cfg.name)},
        "jobs": _jobs(plan.all_jobs),
        "built": sorted(j.key for j in built),
    }


@dataclass(frozen=True)
class Shard:
    """A shard's folder as the merge reads it."""

    path: Path
    record: dict[str, Any]

    @property
    def spec(self) -> ShardSpec:
        s = self.record["shard"]
        return ShardSpec(s["kind"], s["index"], s["count"], tuple(s["values"]))

    @property
    def name(self) -> str:
        return f"shard {self.spec.label} ({self.path})"


def read_shard(path: Path) -> Shard:
    record_path = path / RECORD_NAME
    try:
        record = json.loads(record_path.read_text("utf-8"))
    except FileNotFoundError:
        raise MergeError(f"{path}: not a shard's folder (no {RECORD_NAME}); give the folders "
                         "`python -m hatch_khal shard --out` wrote") from None
    except (OSError, ValueError) as exc:
        raise MergeError(f"{record_path}: unreadable ({exc})") from None
    if not isinstance(record, dict) or record.get("format") != _FORMAT:
        raise MergeError(f"{record_path}: a shard record of another format ({record.get('format') if isinstance(record, dict) else '?'}"
                         f", this hatch-khal reads {_FORMAT}); build every shard with one hatch-khal version")
    return Shard(path, record)


def _describe(job: dict[str, str]) -> str:
    return f"crate {job['crate']!r} for {job['target']}"


def merge_plan(shards: list[Shard]) -> dict[str, Any]:
    """The merged record of ``shards``; MergeError naming the shard at fault when one is missing, given
    twice, or differs from the others (sources, options, toolchain, hatch-khal)."""
    if not shards:
        raise MergeError("no shard to merge: give the folders of every shard")
    first = shards[0]
    for other in shards[1:]:
        a, b = first.record, other.record
        if a["hatch_khal"] != b["hatch_khal"]:
            raise MergeError(f"{other.name} was built by hatch-khal {b['hatch_khal']}, {first.name} by "
                             f"{a['hatch_khal']}: build every shard with one version")
        for tool in sorted(set(a["toolchain"]) | set(b["toolchain"])):
            if a["toolchain"].get(tool) != b["toolchain"].get(tool):
                raise MergeError(f"{other.name} was built with {tool} {b['toolchain'].get(tool) or '(none)'}, "
                                 f"{first.name} with {a['toolchain'].get(tool) or '(none)'}: another toolchain; "
                                 "install the same build requirements in every shard job")
        for crate in sorted(set(a["crates"]) | set(b["crates"])):
            if a["crates"].get(crate) != b["crates"].get(crate):
                raise MergeError(f"crate {crate!r}: {other.name} was built from other sources or options than "
                                 f"{first.name} (content hash {b['crates'].get(crate)} vs {a['crates'].get(crate)}); "
                                 "build every shard from one commit with one configuration")
        if a["jobs"] != b["jobs"]:
            only = [j for j in b["jobs"] if j not in a["jobs"]] or [j for j in a["jobs"] if j not in b["jobs"]]
            raise MergeError(f"{other.name} and {first.name} plan other compile jobs ({_describe(only[0])} is in "
                             "one only): other options (archs, ptx-arch, KHAL_CUDA_ARCHS, defines); give every "
                             "shard job the same configuration and environment")
    specs = [s.spec for s in shards]
    seen: dict[ShardSpec, Shard] = {}
    for shard in shards:
        if shard.spec in seen:
            raise MergeError(f"shard {shard.spec.label} is given twice: {seen[shard.spec].path} and {shard.path}")
        seen[shard.spec] = shard
    splits = {s.count for s in specs if s.kind == "split"}
    if len(splits) > 1:
        raise MergeError(f"the shards split the build in different ways ({', '.join(s.label for s in specs)}): "
                         "give every shard job the same N")
    if splits:
        count = splits.pop()
        missing = sorted(set(range(1, count + 1)) - {s.index for s in specs if s.kind == "split"})
        if missing:
            raise MergeError(f"shard{'s' if len(missing) > 1 else ''} {', '.join(f'{i}/{count}' for i in missing)} "
                             f"{'are' if len(missing) > 1 else 'is'} missing (given: "
                             f"{', '.join(s.label for s in sorted(specs, key=lambda s: s.index))})")
    by_key: dict[str, Shard] = {}
    for shard in shards:
        for key in shard.record["built"]:
            if key in by_key:
                job = next(j for j in first.record["jobs"] if j["key"] == key)
                raise MergeError(f"{_describe(job)} was built by two shards: {by_key[key].name} and {shard.name}; "
                                 "give each shard its own part of the work")
            by_key[key] = shard
    left = [j for j in first.record["jobs"] if j["key"] not in by_key]
    if left:
        raise MergeError(f"no shard built {_describe(left[0])}" + (f" (and {len(left) - 1} more job(s))" if len(left) > 1
                                                                   else "") + ": a shard is missing")
    return {"format": _FORMAT, "hatch_khal": first.record["hatch_khal"], "toolchain": first.record["toolchain"],
            "crates": first.record["crates"], "jobs": first.record["jobs"],
            "shards": {key: shard.spec.label for key, shard in by_key.items()}}


def merge_record() -> dict[str, Any] | None:
    """The merged record while ``python -m hatch_khal merge`` builds the wheel (``KHAL_MERGE``), else None."""
    path = os.environ.get(MERGE_ENV, "").strip()
    if not path:
        return None
    try:
        record = json.loads(Path(path).read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise MergeError(f"{MERGE_ENV}={path}: unreadable ({exc}); it is set by `python -m hatch_khal merge` "
                         "for the wheel build it runs, and by nothing else") from None
    return record if isinstance(record, dict) else None


def check_merge(record: dict[str, Any], plan: JobPlan, cache: Cache) -> None:
    """This build (the merge's wheel build) is the shards' build: the same toolchain, crates and jobs,
    and every output in the cache the merge made of them. MergeError naming what differs."""
    versions = plan.versions()
    for tool in sorted(set(versions) | set(record["toolchain"])):
        if versions.get(tool) != record["toolchain"].get(tool):
            raise MergeError(f"the shards were built with {tool} {record['toolchain'].get(tool) or '(none)'}, this "
                             f"merge builds with {versions.get(tool) or '(none)'}: install the shard jobs' build "
                             "requirements in the merge job")
    for p in plan.prepared:
        want = record["crates"].get(p.cfg.name)
        if want != p.content_hash:
            raise MergeError(f"crate {p.cfg.name!r}: the shards were built from other sources or options (content "
                             f"hash {want}), this checkout gives {p.content_hash}: merge in the commit the shards "
                             "built, with their configuration")
    mine = _jobs(plan.all_jobs)
    if mine != record["jobs"]:
        only = [j for j in mine if j not in record["jobs"]] or [j for j in record["jobs"] if j not in mine]
        raise MergeError(f"this merge and the shards plan other compile jobs ({_describe(only[0])} is in one "
                         "only): other options (archs, ptx-arch, KHAL_CUDA_ARCHS, defines) in the merge job")
    for job in mine:
        if cache.lookup(job["key"]) is None:
            raise MergeError(f"{_describe(job)}: shard {record['shards'].get(job['key'], '?')} built it, and its "
                             "output is not among the merged artifacts (a damaged shard folder?); build that shard "
                             "again")

"""``python -m hatch_khal shard`` and ``merge``: a build split across CI jobs, merged into one wheel.

A shard job plans the whole build (every crate's front stage runs, through the caches), compiles its
part of the compile jobs (:class:`hatch_khal.shards.ShardSpec`) and writes a partial artifact set:
a cache folder with every output it compiled or took from a cache, and the shard's record. The
merge job checks the shards against each other, seeds a cache with their outputs, and runs the
project's own PEP 517 backend (``build_wheel``, through pyproject-hooks, in this environment: the
shard jobs' toolchain) with ``KHAL_MERGE`` set: the build checks it is the shards' build and
compiles nothing. The wheel is the one a single machine builds (byte for byte with
``SOURCE_DATE_EPOCH``).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Mapping, Sequence

from hatch_khal.__about__ import __version__
from hatch_khal.cache import Cache, CachedArtifact, default_cache_dir
from hatch_khal.config import HookConfig, ResolvedCrate, parse_config
from hatch_khal.errors import ConfigError, MergeError
from hatch_khal.frontend import check_packages, default_package
from hatch_khal.model import Reporter
from hatch_khal.remote import remote_cache
from hatch_khal.shards import MERGE_ENV, RECORD_NAME, SHARD_ENV, ShardSpec, merge_plan, read_shard, shard_record

__all__ = ["build_shard", "merge_shards", "project_config"]


class _Recording(Cache):
    """A cache that copies every entry this build used (hit or stored) into ``partial``."""

    def __init__(self, base: Cache, partial: Cache) -> None:
        super().__init__(None, base.warn, remote=None)
        self.base, self.partial = base, partial
        self.root, self.remote = base.root, base.remote

    def lookup(self, key: str) -> CachedArtifact | None:
        hit = self.base.lookup(key)
        if hit is not None:
            self.partial.store(key, hit.data, hit.log, hit.locations)
        return hit

    def store(self, key: str, data: bytes, log: str, locations: tuple[str, ...] = ()) -> None:
        self.base.store(key, data, log, locations)
        self.partial.store(key, data, log, locations)

    def drop(self, key: str, why: str) -> None:
        self.base.drop(key, why)
        self.partial.drop(key, why)


def _read_pyproject(root: Path) -> dict[str, Any]:
    path = root / "pyproject.toml"
    try:
        text = path.read_text("utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it ({exc.strerror or exc}); run in the project or give its folder") from None
    if sys.version_info >= (3, 11):
        import tomllib  # lazy: the CLI's shard and merge commands only
    else:  # pragma: no cover
        import tomli as tomllib  # lazy: as above
    try:
        data: dict[str, Any] = tomllib.loads(text)
        return data
    except ValueError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from None


def project_config(root: Path) -> tuple[HookConfig, list[ResolvedCrate]]:
    """The project's hook table (hatchling's, else ``[tool.khal]``), resolved as its build resolves it."""
    data = _read_pyproject(root)
    tool = data.get("tool", {})
    table = tool.get("hatch", {}).get("build", {}).get("targets", {}).get("wheel", {}).get("hooks", {}).get("khal")
    where = "[tool.hatch.build.targets.wheel.hooks.khal]"
    if table is None:
        table, where = tool.get("khal"), "[tool.khal]"
    if not isinstance(table, dict):
        raise ConfigError(f"{root / 'pyproject.toml'}: no khal table ([tool.hatch.build.targets.wheel.hooks.khal] "
                          "or [tool.khal]): not a project hatch-khal builds")
    name = str(data.get("project", {}).get("name", ""))
    hook, crates = parse_config(table, default_package=default_package(root, name), where=where)
    check_packages(root, crates, where)
    return hook, crates


def build_shard(root: Path, spec: ShardSpec, out: Path, reporter: Reporter, *, cache: Cache | None = None,
                jobs: int | None = None) -> dict[str, Any]:
    """Compile shard ``spec`` of the project at ``root`` into the folder ``out``; its record."""
    # lazy: the build core (pydantic, NVRTC) only for the shard command
    from hatch_khal.builder import plan_jobs
    from hatch_khal.compile_stage import compile_jobs
    from hatch_khal.nvrtc import requirement

    root = root.resolve()
    hook, crates = project_config(root)
    if out.exists():
        if not (out / RECORD_NAME).is_file() and any(out.iterdir()):
            raise ConfigError(f"--out {out}: the folder exists and is not a shard's: give an empty or new folder")
        shutil.rmtree(out)
    out.mkdir(parents=True)
    if cache is None:
        cache = Cache(default_cache_dir(), reporter.warn, remote=remote_cache(hook.cache_url, reporter.warn))
    recording = _Recording(cache, Cache(out / "cache", reporter.warn))
    with requirement(hook.nvrtc_requirement):
        plan = plan_jobs(root, crates, reporter, recording, jobs=jobs)
        mine = spec.select(plan.all_jobs)
        if spec.kind != "split" and not mine:
            known = sorted({j.target if spec.kind == "arch" else j.crate for j in plan.all_jobs})
            raise ConfigError(f"shard {spec.label}: no compile job of this build is for {', '.join(spec.values)}; "
                              f"its {'targets' if spec.kind == 'arch' else 'crates'} are {', '.join(known)}")
        _, compiled = compile_jobs(mine, recording, reporter, jobs=jobs, explain=plan.explain)
        record = shard_record(spec, plan, mine, __version__)
    (out / RECORD_NAME).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n", "utf-8")
    if cache.remote is not None:
        reporter.info(cache.remote.summary())
    front = sum(p.compiled_units for p in plan.prepared)
    reporter.info(f"khal: shard {spec.label}: {len(mine)} of {len(plan.all_jobs)} compile job(s), {compiled} "
                  f"compiled, {len(mine) - compiled} from the cache"
                  + (f" (and {front} unit(s) compiled by the crates' front stages, which every shard runs)" if front
                     else "") + f"; written to {out}")
    return record


def _build_wheel(project: Path, wheel_dir: Path, env: dict[str, str]) -> Path:
    """The project's PEP 517 ``build_wheel`` in this environment (no isolation: the shard jobs'
    toolchain), through pyproject-hooks; the wheel's path."""
    try:
        from pyproject_hooks import BuildBackendHookCaller, default_subprocess_runner  # lazy: merge only
    except ImportError:
        raise ConfigError("`merge` runs the project's build backend through pyproject-hooks, which is not "
                          "installed: pip install 'hatch-khal[cache]'") from None
    build_system = _read_pyproject(project).get("build-system", {})
    backend = build_system.get("build-backend", "setuptools.build_meta:__legacy__")

    def runner(cmd: Sequence[str], cwd: str | None = None, extra_environ: Mapping[str, str] | None = None) -> None:
        default_subprocess_runner(cmd, cwd=cwd, extra_environ={**(extra_environ or {}), **env})

    caller = BuildBackendHookCaller(str(project), backend, backend_path=build_system.get("backend-path"),
                                    runner=runner, python_executable=sys.executable)
    wheel_dir.mkdir(parents=True, exist_ok=True)
    return wheel_dir / caller.build_wheel(str(wheel_dir.resolve()))


def merge_shards(folders: list[Path], project: Path, wheel_dir: Path, reporter: Reporter) -> Path:
    """Check the shards in ``folders`` and build the project's wheel from their outputs; its path."""
    shards = [read_shard(f) for f in folders]
    merged = merge_plan(shards)
    if os.environ.get(SHARD_ENV, "").strip():
        raise ConfigError(f"{SHARD_ENV} is set in the merge job: unset it (the merge builds the whole wheel)")
    with tempfile.TemporaryDirectory(prefix="khal-merge-") as tmp:
        seed = Cache(Path(tmp) / "cache", reporter.warn)
        if seed.root is None:
            raise MergeError(f"cannot write the merge's cache in {tmp}")
        for shard in shards:
            src = Cache(shard.path / "cache", reporter.warn)
            if src.root is None:
                raise MergeError(f"{shard.name}: its cache folder is unreadable")
            for entry in sorted(p for p in src.root.glob("*/*") if p.is_dir() and not p.name.startswith(".")):
                hit = src.lookup(entry.name)  # verified: a damaged file is dropped (and said)
                if hit is not None:
                    seed.store(entry.name, hit.data, hit.log, hit.locations)
        record = Path(tmp) / "merge.json"
        record.write_text(json.dumps(merged, sort_keys=True), "utf-8")
        env = {"KHAL_CACHE_DIR": str(Path(tmp) / "cache"), "KHAL_CACHE_URL": "none", MERGE_ENV: str(record),
               "KHAL_NO_CACHE": "0"}
        reporter.info(f"khal: merging {len(shards)} shard(s), {len(merged['jobs'])} compile job(s): building the "
                      f"wheel of {project}")
        try:
            wheel = _build_wheel(project, wheel_dir, env)
        except Exception as exc:  # noqa: BLE001 - the backend's failure, told with what it printed
            raise MergeError(f"the wheel build failed: {exc}") from None
    reporter.info(f"khal: merged wheel {wheel}")
    return wheel

"""``python -m hatch_khal triton record [--project DIR] [--lock FILE] [--crate NAME] [--replace] -- CMD...``

Runs ``CMD`` (the package's tests, a warm-up script) and records every launch of the project's
Triton crates' kernels into the lock file (:mod:`hatch_khal.triton.lock`), which the build
compiles beside the crates' hand-written instances.

How: a temporary folder holding a ``sitecustomize.py`` (which chains to the one it shadows) and
the recorder (:mod:`hatch_khal.triton.record_child`) goes first on the command's ``PYTHONPATH``,
so every Python process the command starts records its launches into a folder of this run (one
file per process). When the command ends (whatever its exit status), the variants seen are merged
into the lock file (never dropping one unless ``--replace``), the launches counted are written
beside it (``<lock>.launches.json``) and a table (kernel, variants, launches) is printed. The exit
status is the command's; 1 when it succeeded but launched no kernel of the crates.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence, TextIO

from hatch_khal.errors import ConfigError, KhalBuildError
from hatch_khal.triton import lock as _lock
from hatch_khal.triton import record_child
from hatch_khal.triton.lock import LockVariant

__all__ = ["Recording", "RecordCrate", "project_crates", "record"]

#: the recorder's module name in the child (a copy of record_child.py in the bootstrap folder)
CHILD_MODULE = "_khal_triton_record"

SITECUSTOMIZE = f'''"""Bootstrap of `python -m hatch_khal triton record` (a temporary folder first on PYTHONPATH):
starts the recorder, then runs the sitecustomize module this one shadows, if there is one."""


def _khal_start():
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    try:
        import {CHILD_MODULE}

        {CHILD_MODULE}.install()
    except Exception as exc:  # the program runs as it would have; the parent says nothing was recorded
        sys.stderr.write("hatch-khal triton record: the recorder did not start in %s: %r\\n" % (sys.executable, exc))
    import importlib.machinery
    import importlib.util

    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)


_khal_start()
'''


class UsageError(KhalBuildError):
    """A bad command line or project (the CLI prints it and exits 2)."""


@dataclass(frozen=True)
class RecordCrate:
    """A Triton crate of the project: its source files (``sources`` globs) or its modules (a
    companion crate's ``modules``)."""

    name: str
    files: tuple[Path, ...] = ()
    modules: tuple[str, ...] = ()


def _toml_load(path: Path) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib  # lazy: only this command reads a pyproject here
    else:  # pragma: no cover - exercised on 3.10 only
        import tomli as tomllib  # lazy, as above
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))  # type: ignore[no-any-return]
    except FileNotFoundError:
        raise UsageError(f"{path.parent}: no pyproject.toml; --project DIR names the project whose Triton crates "
                         "to record") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"{path}: cannot be read ({exc})") from None


def _hook_table(data: dict[str, Any], path: Path) -> tuple[dict[str, Any], str]:
    """The khal table of the pyproject: hatchling's hook table or setuptools' ``[tool.khal]``."""
    tool = data.get("tool", {})
    hatch = tool.get("hatch", {}).get("build", {}).get("targets", {}).get("wheel", {}).get("hooks", {}).get("khal")
    plain = tool.get("khal")
    backend = str(data.get("build-system", {}).get("build-backend", ""))
    tables = [(t, n) for t, n in ((hatch, "[tool.hatch.build.targets.wheel.hooks.khal]"), (plain, "[tool.khal]"))
              if isinstance(t, dict)]
    if not tables:
        raise UsageError(f"{path}: no khal table ([tool.hatch.build.targets.wheel.hooks.khal] or [tool.khal]): "
                         "the project declares no crates to record")
    if len(tables) == 2 and not backend.startswith("hatchling"):
        tables.reverse()  # a setuptools build reads [tool.khal]
    return tables[0]


def _strings(where: str, key: str, raw: Any) -> list[str]:
    if raw is None:
        return []
    if not isinstance(raw, list) or not all(isinstance(s, str) for s in raw):
        raise ConfigError(f"{where}: option {key!r} must be a list of strings (got {raw!r})")
    return list(raw)


def project_crates(project: Path) -> tuple[list[RecordCrate], Path]:
    """The project's Triton crates and its lock file's path (hook option ``triton-lock``, else
    ``khal-triton.lock`` in the project root)."""
    pyproject = project / "pyproject.toml"
    table, name = _hook_table(_toml_load(pyproject), pyproject)
    lock_option = table.get("triton-lock", _lock.DEFAULT_LOCK)
    if not isinstance(lock_option, str) or not lock_option or Path(lock_option).is_absolute():
        raise ConfigError(f"{pyproject}: {name} option 'triton-lock' must be a path relative to the project root "
                          f"(got {lock_option!r})")
    crates = []
    raw_crates = table.get("crates")
    for i, c in enumerate(raw_crates if isinstance(raw_crates, list) else []):
        if not isinstance(c, dict) or not isinstance(c.get("name"), str):
            continue  # the build names what is wrong with it
        where = f"{pyproject}: {name} crates[{i}] {c['name']!r}"
        sources = _strings(where, "sources", c.get("sources"))
        modules = _strings(where, "modules", c.get("modules"))
        py = [s for s in sources if s.endswith(".py")]
        if not py and not modules:
            continue  # CUDA C++ or Slang
        files: dict[str, Path] = {}
        for pattern in py:
            if Path(pattern).is_absolute():
                raise ConfigError(f"{where}: source pattern {pattern!r} must be relative to the project root")
            found = [Path(p) for p in glob.glob(str(project / pattern), recursive=True) if Path(p).is_file()]
            if not found:
                raise ConfigError(f"{where}: source pattern {pattern!r} matches no file under {project}")
            for p in found:
                files[os.path.realpath(p)] = Path(os.path.realpath(p))
        crates.append(RecordCrate(c["name"], tuple(files[k] for k in sorted(files)), tuple(modules)))
    return crates, project / lock_option


@dataclass
class Recording:
    """What the processes of one run recorded."""

    processes: int = 0
    variants: list[LockVariant] = field(default_factory=list)
    launches: dict[LockVariant, int] = field(default_factory=dict)
    others: dict[tuple[str, str, str], int] = field(default_factory=dict)
    problems: dict[str, int] = field(default_factory=dict)


def _gather(out: Path) -> Recording:
    rec = Recording()
    seen: set[LockVariant] = set()

    def variant(raw: Any) -> Optional[LockVariant]:
        try:
            return LockVariant.from_json(raw, "a recorded launch")
        except ConfigError as exc:  # a launch the lock cannot hold: said, not fatal
            rec.problems[str(exc)] = rec.problems.get(str(exc), 0) + 1
            return None

    for path in sorted(out.glob("*.jsonl")):  # one file per process; ids are the process's own
        ids: dict[int, Optional[LockVariant]] = {}
        other_ids: dict[int, tuple[str, str, str]] = {}
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                obj = json.loads(line)
                if "l" in obj:
                    v = ids[obj["l"]]
                    if v is not None:
                        rec.launches[v] = rec.launches.get(v, 0) + 1
                elif "o" in obj:
                    key = other_ids[obj["o"]]
                    rec.others[key] = rec.others.get(key, 0) + 1
                elif "variant" in obj:
                    v = ids[int(obj["id"])] = variant(obj["variant"])
                    if v is not None and v not in seen:
                        seen.add(v)
                        rec.variants.append(v)
                elif "other" in obj:
                    m, q, f = obj["other"]
                    other_ids[int(obj["other_id"])] = (str(m), str(q), str(f))
                elif "problem" in obj:
                    rec.problems[str(obj["problem"])] = rec.problems.get(str(obj["problem"]), 0) + 1
                elif "started" in obj:
                    rec.processes += 1
            except (ValueError, KeyError, TypeError):
                continue  # a line cut short by a process killed while writing it
    return rec


def _bootstrap(folder: Path, crates: list[RecordCrate]) -> Path:
    """Write the bootstrap (sitecustomize, the recorder) and the recording's configuration."""
    (folder / "out").mkdir()
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
    shutil.copyfile(record_child.__file__, folder / f"{CHILD_MODULE}.py")
    config = {"out": str(folder / "out"), "crates": [
        {"name": c.name, "modules": list(c.modules),
         "files": [{"path": str(f), "sha256": hashlib.sha256(f.read_bytes()).hexdigest()} for f in c.files]}
        for c in crates]}
    path = folder / "recording.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


def _run(command: list[str], env: dict[str, str]) -> int:
    try:
        proc = subprocess.Popen(command, env=env)
    except OSError as exc:
        raise UsageError(f"cannot run {command[0]!r}: {exc}") from None
    try:
        rc = proc.wait()
    except KeyboardInterrupt:  # the command got the interrupt too: let it end, then keep what it recorded
        rc = proc.wait()
    return 128 - rc if rc < 0 else rc  # killed by signal N: 128 + N, as a shell says


def _write_launches(path: Path, command: list[str], rc: int, rec: Recording) -> None:
    data = {
        "command": command, "returncode": rc, "processes": rec.processes,
        "interpreted": os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"),
        "variants": [{"crate": v.crate, "kernel": v.kernel, **({"module": v.module} if v.module else {}),
                      "digest": v.digest(), "variant": v.to_json(), "launches": rec.launches.get(v, 0)}
                     for v in _lock.merge([], rec.variants)],
        "others": [{"module": m, "kernel": q, "file": f, "launches": n} for (m, q, f), n in sorted(rec.others.items())],
        "problems": [{"problem": p, "count": n} for p, n in sorted(rec.problems.items())],
    }
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
            for r in rows]


def record(project: Path, command: list[str], *, lock: Optional[Path] = None, crate_names: Sequence[str] = (),
           replace: bool = False, out: TextIO = sys.stdout) -> int:
    """Run ``command`` recording the launches of ``project``'s Triton crates (those named, or every
    one), merge them into the lock file, write the launch counts, print the summary; the exit status."""
    if not command:
        raise UsageError("no command to run: give it after `--` (python -m hatch_khal triton record -- pytest tests)")
    crates, default_lock = project_crates(project)
    if not crates:
        raise UsageError(f"{project / 'pyproject.toml'}: the project has no Triton crate (a crate whose sources are "
                         "'.py' files, or a companion crate's 'modules')")
    if crate_names:
        known = {c.name for c in crates}
        unknown = [n for n in crate_names if n not in known]
        if unknown:
            raise UsageError(f"--crate {unknown[0]}: no Triton crate of that name in {project / 'pyproject.toml'} "
                             f"(its Triton crates: {', '.join(sorted(known))})")
        crates = [c for c in crates if c.name in crate_names]
    lock_path = lock if lock is not None else default_lock
    if lock_path.exists() and not (replace and not crate_names):
        _lock.read(lock_path)  # a lock file that does not read fails now, not after the command ran
    folder = Path(tempfile.mkdtemp(prefix="khal-triton-record-"))
    try:
        config = _bootstrap(folder, crates)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(folder)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        env[record_child.ENV] = str(config)
        rc = _run(command, env)
        rec = _gather(folder / "out")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return _finish(command, rc, rec, crates, lock_path, replace and not crate_names, replace and bool(crate_names),
                   out)


def _finish(command: list[str], rc: int, rec: Recording, crates: list[RecordCrate], lock_path: Path,
            replace_all: bool, replace_crates: bool, out: TextIO) -> int:
    """Merge what was recorded into the lock file (``replace_all``: drop every old entry;
    ``replace_crates``: those of the recorded crates), write the launches, print the summary."""
    names = sorted(c.name for c in crates)
    lines: list[str] = []
    for p, n in sorted(rec.problems.items()):
        lines.append(f"triton record: {p}" + (f" (in {n} processes)" if n > 1 else ""))
    if not rec.variants:
        lines.append(f"triton record: no launch of a kernel of the Triton crate(s) {', '.join(names)} was seen")
        if rec.processes == 0:
            lines.append("  no Python process of the command started the recorder: the command ran no Python, or ran "
                         "it with -I, -E or -S (which ignore PYTHONPATH or sitecustomize)")
        elif rec.others:
            lines.append("  Triton kernels launched that are no crate's (their files are not the crates' sources, "
                         "nor copies of them; their modules are not a crate's modules):")
            for (m, q, f), n in sorted(rec.others.items())[:10]:
                lines.append(f"    {m}.{q} ({f}): {n} launch(es)")
        else:
            lines.append(f"  {rec.processes} Python process(es) ran and launched no Triton kernel (with TRITON_INTERPRET=1 "
                         "Triton's interpreter runs them on the CPU; see docs/guide/triton.md, 'Recording instances')")
        if rc != 0:
            lines.append(f"triton record: the command exited with status {rc}")
        print("\n".join(lines), file=out)
        return rc or 1
    import filelock  # lazy: only a recording that found something writes the lock file

    lock_path.parent.mkdir(parents=True, exist_ok=True)
    guard = Path(tempfile.gettempdir()) / f"khal-triton-lock-{hashlib.sha256(str(lock_path.resolve()).encode()).hexdigest()[:16]}.lock"
    with filelock.FileLock(str(guard)):
        old: list[LockVariant] = []
        if lock_path.exists():
            try:
                old = _lock.read(lock_path)
            except ConfigError:
                if not replace_all:
                    raise
        kept = [] if replace_all else [v for v in old if v.crate not in names] if replace_crates else old
        before = set(old)
        merged = _lock.merge(kept, rec.variants)
        _lock.write(lock_path, merged)
    launches_path = lock_path.with_name(lock_path.name + ".launches.json")
    _write_launches(launches_path, command, rc, rec)
    rows = [["crate", "kernel", "variants", "new", "launches"]]
    by_kernel: dict[tuple[str, str], list[int]] = {}
    for v in rec.variants:
        key = (v.crate, v.kernel + (f" ({v.module})" if v.module else ""))
        row = by_kernel.setdefault(key, [0, 0, 0])
        row[0] += 1
        row[1] += v not in before
        row[2] += rec.launches.get(v, 0)
    for (c, k), (n, new, launched) in sorted(by_kernel.items()):
        rows.append([c, k, str(n), str(new), str(launched)])
    dropped = len(set(old) - set(merged))
    total_new = sum(r[1] for r in by_kernel.values())
    lines += _table(rows)
    lines.append(f"triton record: {len(rec.variants)} variant(s) of {len(by_kernel)} kernel(s) seen in "
                 f"{sum(rec.launches.values())} launch(es), {total_new} new; {lock_path} has {len(merged)}"
                 + (f" ({dropped} dropped: --replace)" if dropped else "") + f"; launches in {launches_path.name}")
    others = sum(rec.others.values())
    if others:
        lines.append(f"triton record: {others} launch(es) of {len(rec.others)} other Triton kernel(s), no crate's, "
                     "not recorded")
    if rc != 0:
        lines.append(f"triton record: the command exited with status {rc}; what it launched before is recorded")
    print("\n".join(lines), file=out)
    return rc

"""``python -m hatch_khal inspect|verify`` against hostile or awkward inputs (issue #29 items 8
and 15): a wheel holding a zip bomb under ``_khal/``, a reader that goes away (``| head``), a
project's source folder named like the installed package."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from hatch_khal.__main__ import main
from tests.helpers.fakecuda import make_entry, storage, write_package

ROOT = Path(__file__).resolve().parents[2]
BOMB = 20 << 20  # zeros: about 20 KB deflated


def _package(root: Path, name: str = "bombpkg") -> Path:
    return write_package(root, [make_entry("k", (storage("x"),))], package=name)


def _wheel(pkg: Path, out: Path, extra: dict[str, bytes] | None = None, *,
           replace: dict[str, bytes] | None = None) -> Path:
    """A wheel of ``pkg`` (members under ``<pkg name>/``), plus ``extra`` members."""
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for f in sorted(pkg.rglob("*")):
            if f.is_file():
                name = f"{pkg.name}/{f.relative_to(pkg).as_posix()}"
                zf.writestr(name, (replace or {}).get(name, f.read_bytes()))
        for name, data in (extra or {}).items():
            zf.writestr(name, data)
    return out


class _Counting:
    """Counts the bytes every member of every wheel yields when read (``ZipFile.open``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.read: dict[str, int] = {}
        real_open = zipfile.ZipFile.open
        counter = self

        def counted_open(zf: zipfile.ZipFile, name: Any, mode: Any = "r", *a: Any, **kw: Any) -> Any:
            f = real_open(zf, name, mode, *a, **kw)
            member = name.filename if isinstance(name, zipfile.ZipInfo) else name
            real_read = f.read

            def read(n: int = -1) -> bytes:
                data = real_read(n)
                counter.read[member] = counter.read.get(member, 0) + len(data)
                return data

            f.read = read  # type: ignore[method-assign]
            return f

        monkeypatch.setattr(zipfile.ZipFile, "open", counted_open)
        monkeypatch.setattr(zipfile.ZipFile, "extract", _no_extract)
        monkeypatch.setattr(zipfile.ZipFile, "extractall", _no_extract)


def _no_extract(*a: Any, **kw: Any) -> None:
    raise AssertionError("nothing is extracted from a wheel")


def _listed(pkg: Path) -> dict[str, int]:
    """Member name -> the size the manifest gives it (the manifest: its own file's size)."""
    m = json.loads((pkg / "_khal" / "manifest.json").read_text())
    sizes = {f"{pkg.name}/_khal/manifest.json": (pkg / "_khal" / "manifest.json").stat().st_size}
    sizes.update({f"{pkg.name}/{a['path']}": a["size"] for c in m["crates"] for a in c["artifacts"]})
    return sizes


# -- (8) only what the manifest lists is read, streamed, capped by the manifest's sizes ------------
@pytest.mark.parametrize("command", ["inspect", "verify"])
def test_a_zip_bomb_beside_the_manifest_is_never_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str], command: str) -> None:
    pkg = _package(tmp_path / "src")
    wheel = _wheel(pkg, tmp_path / "bombpkg-0.1-py3-none-any.whl",
                   {"bombpkg/_khal/c/zeros.bin": bytes(BOMB), "bombpkg/_khal/zeros.ptx": bytes(BOMB)})
    assert wheel.stat().st_size < BOMB // 100
    counting = _Counting(monkeypatch)
    assert main([command, str(wheel)]) == 0, capsys.readouterr()
    listed = _listed(pkg)
    assert set(counting.read) <= set(listed), counting.read  # never the unlisted members
    for member, n in counting.read.items():
        assert n <= listed[member], (member, n)
    if command == "inspect":
        assert set(counting.read) == {"bombpkg/_khal/manifest.json"}  # inspect reads the manifest only
    else:
        assert "verify: OK (1 artifact(s) in 1 package(s)" in capsys.readouterr().out


def test_a_listed_member_larger_than_the_manifest_says_is_read_no_further(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The artifact's member is a 20 MiB bomb where the manifest says 100-odd bytes: refused from
    the archive's declared size, unread; a member whose header lies about its size is read to
    the manifest's size plus one byte at most."""
    pkg = _package(tmp_path / "src")
    (art,) = [n for n in _listed(pkg) if n.endswith(".ptx")]
    size = _listed(pkg)[art]
    wheel = _wheel(pkg, tmp_path / "big.whl", replace={art: bytes(BOMB)})
    counting = _Counting(monkeypatch)
    assert main(["verify", str(wheel)]) == 1
    err = capsys.readouterr().err
    assert f"is {BOMB} bytes, the manifest says {size}" in err, err
    assert counting.read.get(art, 0) == 0
    # the header says the manifest's size, the data is the bomb: zipfile stops at the declared
    # size (then fails its CRC); never more than size + 1 bytes come out
    lying = tmp_path / "lying.whl"
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(lying, "w") as dst:
        for info in src.infolist():
            dst.writestr(info, src.read(info))
    data = bytearray(lying.read_bytes())
    with zipfile.ZipFile(lying) as zf:
        info = zf.getinfo(art)
    for at in (info.header_offset + 22, data.rindex(art.encode()) - 46 + 24):  # local and central sizes
        data[at:at + 4] = size.to_bytes(4, "little")
    lying.write_bytes(bytes(data))
    counting.read.clear()
    assert main(["verify", str(lying)]) == 1
    err = capsys.readouterr().err
    assert f"crate 'c': artifact {art.split('/', 1)[1]!r}" in err, err
    assert counting.read.get(art, 0) <= size + 1


def test_a_manifest_member_over_the_cap_is_refused_unread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    from khal_runtime import manifest

    pkg = _package(tmp_path / "src")
    name = "bombpkg/_khal/manifest.json"
    wheel = _wheel(pkg, tmp_path / "m.whl", replace={name: b" " * BOMB})
    monkeypatch.setattr(manifest, "MAX_MANIFEST_BYTES", 1 << 20)
    counting = _Counting(monkeypatch)
    assert main(["inspect", str(wheel)]) == 2
    assert f"is {BOMB} bytes, more than the {1 << 20} allowed" in capsys.readouterr().err
    assert counting.read.get(name, 0) == 0


# -- (15) a closed pipe; a source folder shadowing the installed package ---------------------------
def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, **extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), extra.get("PYTHONPATH", "")) if p)
    return env


@pytest.mark.parametrize("command", ["inspect", "verify"])
def test_a_reader_that_goes_away_ends_quietly(tmp_path: Path, command: str) -> None:
    """``python -m hatch_khal inspect ... | head``: the pipe's reader is gone before anything is
    written; the command stops quietly (no BrokenPipeError traceback, no "Exception ignored")."""
    pkg = _package(tmp_path)
    r, w = os.pipe()
    os.close(r)
    try:
        proc = subprocess.run([sys.executable, "-m", "hatch_khal", command, str(pkg)], stdout=w,
                              stderr=subprocess.PIPE, text=True, env=_env(), cwd=tmp_path, timeout=120)
    finally:
        os.close(w)
    assert proc.stderr == "" and proc.returncode == 1, proc.stderr


def test_verify_by_name_from_the_project_root_uses_the_installed_package(tmp_path: Path) -> None:
    """Run from a project's root, ``verify my_pkg`` finds ``./my_pkg`` (the sources, no manifest)
    first: it says so and verifies the installed package instead; with none installed, the error
    names the folder it looked at."""
    site = tmp_path / "site"
    _package(site, "my_pkg")
    project = tmp_path / "project"
    (project / "my_pkg").mkdir(parents=True)
    (project / "my_pkg" / "__init__.py").write_text("")
    cmd = [sys.executable, "-m", "hatch_khal", "verify", "my_pkg"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=project, env=_env(PYTHONPATH=str(site)),
                          timeout=120)
    assert proc.returncode == 0 and "verify: OK (1 artifact(s) in 1 package(s)" in proc.stdout, proc.stderr
    assert f"{project / 'my_pkg'}" in proc.stderr and "shadows the installed package 'my_pkg'" in proc.stderr
    assert f"using the installed one at {site / 'my_pkg'}" in proc.stderr
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=project, env=_env(), timeout=120)
    assert proc.returncode == 2
    assert f"my_pkg: no _khal/manifest.json in or below this directory ({project / 'my_pkg'}); no installed " \
           "package 'my_pkg' outside it either" in proc.stderr, proc.stderr


def test_a_wheel_missing_a_listed_member_or_carrying_an_editable_record_fails_verify(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Read in place, a wheel still gets every check a folder gets: a listed artifact absent
    from the archive, and an editable-install record (which no wheel has), are problems."""
    pkg = _package(tmp_path / "src")
    (art,) = [n for n in _listed(pkg) if n.endswith(".ptx")]
    good = _wheel(pkg, tmp_path / "good.whl")
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(tmp_path / "gone.whl", "w") as dst:
        for info in src.infolist():
            if info.filename != art:
                dst.writestr(info, src.read(info))
    assert main(["verify", str(tmp_path / "gone.whl")]) == 1
    assert f"artifact {art.split('/', 1)[1]!r} is missing from the wheel" in capsys.readouterr().err
    doc = json.loads((pkg / "_khal" / "manifest.json").read_text())
    doc["editable"] = {"project_root": str(tmp_path)}
    edited = _wheel(pkg, tmp_path / "edited.whl", replace={"bombpkg/_khal/manifest.json": json.dumps(doc).encode()})
    assert main(["verify", str(edited)]) == 1
    assert "the manifest of a wheel has an editable-install record" in capsys.readouterr().err


def test_a_listed_member_over_the_artifact_cap_is_refused_unread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A manifest may list a huge artifact honestly (its size matches the archive's): past the
    artifact cap it is refused before anything is decompressed, as a file on disk is."""
    from khal_runtime import verify

    pkg = _package(tmp_path / "src")
    (art,) = [n for n in _listed(pkg) if n.endswith(".ptx")]
    monkeypatch.setattr(verify, "MAX_ARTIFACT_BYTES", 64)
    counting = _Counting(monkeypatch)
    assert main(["verify", str(_wheel(pkg, tmp_path / "w.whl"))]) == 1
    assert f"is {_listed(pkg)[art]} bytes, more than the 64 allowed" in capsys.readouterr().err
    assert counting.read.get(art, 0) == 0

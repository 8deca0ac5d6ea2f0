"""Issue #39, measured (CPU, no GPU needed): a synthetic library (benchmarks/scale_library.py) built
whole, in 4 shards one after another plus the merge, and warm from a shared store (rclone's S3 server
on the loopback address) after a one-file change; the wheel's size and its split by arch family; and
an extrapolation to 1,000 instantiations x 5 archs.

    python benchmarks/bench_scale.py [--templates 3 --dtypes 4 --tiles 4 --archs sm_80,sm_90]

Prints a table; times are wall seconds on this machine (say which, and what else ran on it).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

from scale_library import write_library  # noqa: E402

from hatch_khal.builder import build_packages  # noqa: E402
from hatch_khal.cache import Cache  # noqa: E402
from hatch_khal.distributed import build_shard, merge_shards, project_config  # noqa: E402
from hatch_khal.model import PrintReporter  # noqa: E402
from hatch_khal.remote import remote_cache  # noqa: E402
from hatch_khal.shards import parse_shard  # noqa: E402
from hatch_khal.split import split_wheel  # noqa: E402


class Quiet(PrintReporter):
    def info(self, message: str) -> None:
        pass

    def warn(self, message: str) -> None:
        print(f"  warning: {message}")


def _build(root: Path, local: Path, remote: bool = False) -> tuple[float, int]:
    rep = Quiet()
    cache = Cache(local, rep.warn, remote=remote_cache(None, rep.warn) if remote else None)
    start = time.perf_counter()
    result = build_packages(root, project_config(root)[1], rep, cache=cache)
    return time.perf_counter() - start, result.compiled


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--templates", type=int, default=3)
    ap.add_argument("--dtypes", type=int, default=4)
    ap.add_argument("--tiles", type=int, default=4)
    ap.add_argument("--archs", default="sm_80,sm_90")
    ap.add_argument("--shards", type=int, default=4)
    args = ap.parse_args()
    archs = args.archs.split(",")
    tmp = Path(tempfile.mkdtemp(prefix="khal-scale-"))
    rows: list[tuple[str, str]] = []
    try:
        root = tmp / "lib"
        n = write_library(root, templates=args.templates, dtypes=args.dtypes, tiles=args.tiles, archs=archs)
        jobs = args.templates * args.dtypes * len(archs)
        print(f"library: {n} instantiations in {args.templates * args.dtypes} crates x {len(archs)} archs "
              f"= {jobs} compile jobs; {os.cpu_count()} CPUs")
        os.environ.pop("KHAL_CACHE_URL", None)
        cold, compiled = _build(root, tmp / "cold")
        rows.append(("cold single build", f"{cold:.1f} s ({compiled} compiled)"))
        print(rows[-1])

        shard_times = []
        for i in range(1, args.shards + 1):
            start = time.perf_counter()
            build_shard(root, parse_shard(f"{i}/{args.shards}"), tmp / f"s{i}", Quiet(), cache=Cache(tmp / f"c{i}"))
            shard_times.append(time.perf_counter() - start)
        rows.append((f"{args.shards} shards, one after another", " + ".join(f"{t:.1f}" for t in shard_times)
                     + f" = {sum(shard_times):.1f} s (slowest {max(shard_times):.1f} s)"))
        print(rows[-1])
        os.environ["SOURCE_DATE_EPOCH"] = "1700000000"
        start = time.perf_counter()
        wheel = merge_shards([tmp / f"s{i}" for i in range(1, args.shards + 1)], root, tmp / "dist", Quiet())
        merge = time.perf_counter() - start
        rows.append(("merge (checks + the wheel build, nothing compiled)", f"{merge:.1f} s"))
        rows.append(("CI wall time with the shards in parallel", f"{max(shard_times) + merge:.1f} s "
                     f"({cold / (max(shard_times) + merge):.2f}x faster than one machine)"))
        print(rows[-2:])

        from tests.helpers.stores import Server  # lazy: rclone, for this part only

        server = Server("s3", tmp / "store").start()
        try:
            os.environ.update(server.env())
            fill, _ = _build(root, tmp / "fill", remote=True)
            warm, warm_compiled = _build(root, tmp / "warm", remote=True)
            src = next((root / "kernels").glob("gemm_f32/*.cu"))
            src.write_text(src.read_text() + "\n// a one-line change\n")
            edit, edit_compiled = _build(root, tmp / "edit", remote=True)
        finally:
            server.stop()
            for k in server.env():
                os.environ.pop(k, None)
        rows.append(("cold build filling the shared store (S3, loopback)", f"{fill:.1f} s"))
        rows.append(("clean machine, warm shared store, no change", f"{warm:.1f} s ({warm_compiled} compiled)"))
        rows.append(("clean machine, warm shared store, one file changed", f"{edit:.1f} s ({edit_compiled} compiled)"))
        print(rows[-3:])

        size = wheel.stat().st_size
        parts = split_wheel(wheel, tmp / "split", 100 * 10**6, Quiet(), force=True)
        rows.append(("wheel", f"{size / 1e6:.2f} MB; split by family: "
                     + ", ".join(f"{p.name.split('-')[0]} {p.stat().st_size / 1e6:.2f} MB" for p in parts)))
        per_job = cold / jobs  # wall seconds per (crate x arch) job with every CPU busy
        per_inst_arch = size / (n * len(archs))
        big_jobs = 1000 * 5 / (n / (args.templates * args.dtypes))  # crates of the same size, 5 archs
        one = per_job * big_jobs
        rows.append(("extrapolated: 1,000 instantiations x 5 archs, one such machine",
                     f"{one / 60:.0f} min ({big_jobs:.0f} jobs x {per_job:.2f} s)"))
        for s in (8, 32):
            rows.append((f"extrapolated: the same in {s} shards (CI jobs of this size) + merge",
                         f"{(one / s + merge) / 60:.1f} min"))
        rows.append(("extrapolated: wheel of 1,000 x 5", f"{per_inst_arch * 5000 / 1e6:.0f} MB "
                     f"({per_inst_arch / 1e3:.1f} kB per instantiation and arch); per-family companions "
                     f"{per_inst_arch * 1000 / 1e6:.0f} MB each"))
        print("\n| what | figure |\n|---|---|")
        for what, fig in rows:
            print(f"| {what} | {fig} |")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

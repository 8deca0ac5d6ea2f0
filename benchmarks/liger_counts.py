"""Sum the companion run's KHAL_TRITON_STATS counts (one JSON per pytest process) and compare them
with the launches Triton's JIT made in the recording run (``khal-triton.lock.launches.json``).

    python benchmarks/liger_counts.py STATS_DIR LAUNCHES_JSON
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> int:
    stats_dir, launches = Path(sys.argv[1]), Path(sys.argv[2])
    ours: dict[str, list[int]] = {}
    for f in sorted(stats_dir.glob("stats-*.json")):
        for kernel, v in json.loads(f.read_text()).items():
            row = ours.setdefault(kernel.split(".", 1)[-1], [0, 0, 0])
            row[0] += v["exact"]
            row[1] += v["other"]
            row[2] += v["jit"]
    jit: dict[str, int] = {}
    data = json.loads(launches.read_text())
    for row in data["variants"]:  # hatch_khal.triton.record's launch counts, per variant
        name = str(row["kernel"]).rsplit(".", 1)[-1]
        jit[name] = jit.get(name, 0) + int(row["launches"])
    names = sorted(set(ours) | set(jit))
    w = max([len("kernel"), *map(len, names)])
    print(f"| {'kernel':<{w}} | JIT launches | khal exact | khal other | khal JIT |")
    print(f"|{'-' * (w + 2)}|---|---|---|---|")
    tot = [0, 0, 0, 0]
    for n in names:
        e, o, j = ours.get(n, [0, 0, 0])
        tot = [tot[0] + jit.get(n, 0), tot[1] + e, tot[2] + o, tot[3] + j]
        print(f"| {n:<{w}} | {jit.get(n, 0)} | {e} | {o} | {j} |")
    print(f"| {'total':<{w}} | {tot[0]} | {tot[1]} | {tot[2]} | {tot[3]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``cdigen topo import`` of large made-up matrices: whole process, wall and CPU time.

    python benchmarks/bench_topo_import.py [COUNT ...]   (default: 300 1000)

One run per size and format (a 1,000-GPU import is seconds); the node written is loaded again
to check it. CPU time is the child's user + system time.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.helpers.topo import big_matrix  # noqa: E402


def run(argv: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds of ``cdigen`` with ``argv``; exits the benchmark if it fails."""
    before = os.times()
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "cdigen.cli", *argv], capture_output=True,
                          text=True, cwd=REPO)  # fmt: skip
    wall = time.perf_counter() - start
    after = os.times()
    if done.returncode != 0:
        raise SystemExit(f"bench: cdigen {' '.join(argv)} failed: {done.stderr.strip()}")
    cpu = (after.children_user - before.children_user) + (
        after.children_system - before.children_system
    )
    return wall, cpu


def main(counts: list[int]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for count in counts:
            source = Path(tmp) / f"topo-{count}.txt"
            source.write_text(big_matrix(count))
            for fmt in ("yaml", "json"):
                target = Path(tmp) / f"node-{count}.{fmt}"
                wall, cpu = run(["topo", "import", str(source), "--memory", "80GiB",
                                 "--format", fmt, "-o", str(target)])  # fmt: skip
                size = target.stat().st_size / 1e6
                print(f"{count} GPUs ({count * (count - 1) // 2} links), {fmt}: "
                      f"wall {wall:.2f} s, CPU {cpu:.2f} s, {size:.1f} MB")  # fmt: skip


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [300, 1000])

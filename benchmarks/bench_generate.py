"""Whole-process wall time of ``cdigen generate`` (dry run, a new spec file, an unchanged one)
and ``cdigen --help``.

An 8-GPU node on a fake host with 60 driver libraries (tests/cdihost.py). Each command runs as a
fresh process, interleaved with two baselines measured in the same run: ``python -c pass`` (the
interpreter start every command pays) and a python importing only the libraries generate needs
(the floor under it), and a python importing only pynvml (what a real node's default
``--node nvml`` adds). Prints median, p99 and the ratio to the first baseline, and whether cdigen
is an editable install (whose import hook raises the baseline). Goals: generate under 300 ms,
--help under 150 ms, both including interpreter start (issue 3); generate within 4x the
baseline (issue 17; figures before and after in docs/cdi.md, "Performance").

    python benchmarks/bench_generate.py [--runs N]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cdigen.nodefile import dump_node
from tests.cdihost import DRIVER_LIBRARIES, build_host, make_node

GPUS = 8
LIBRARIES = 60
# What any run of generate imports before cdigen's own code does anything: the floor under it.
FLOOR_MODULES = ("re", "argparse", "typing", "pathlib", "dataclasses", "json", "yaml")
# As an installed package runs: with its bytecode cached (pip compiles on install). Without
# this, PYTHONDONTWRITEBYTECODE=1 (set in some shells and CI images) makes every run compile
# cdigen's modules again, and that compile time is not what a node pays.
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def cdigen_command() -> list[str]:
    """The installed console script if there is one, else ``python -m cdigen.cli``."""
    script = shutil.which("cdigen") or str(Path(sys.executable).parent / "cdigen")
    return [script] if Path(script).exists() else [sys.executable, "-m", "cdigen.cli"]


def install_kind() -> str:
    """How cdigen is installed: an editable install's import hook runs at every interpreter
    start, so it raises the baseline too and flatters the ratios."""
    out = subprocess.run(
        [sys.executable, "-c", "import cdigen; print(cdigen.__file__)"],
        check=True, capture_output=True, text=True, env=ENV, cwd="/",
    ).stdout.strip()  # fmt: skip
    if "site-packages" in out:
        return f"installed normally ({out})"
    return (
        f"an editable install ({out}): its import hook adds ~25 ms to every start, the "
        "baseline's included; with 'pip install .' the baseline is lower and every ratio higher"
    )


def run_ms(argv: list[str]) -> tuple[float, float]:
    """Wall time and CPU time (user + system) of one run of ``argv``, in ms.

    CPU time is what the process itself costs; it is steadier than wall time on a busy machine.
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env=ENV)
    wall = (time.perf_counter() - start) * 1000
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1000
    return wall, cpu


def p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        # 12 standard driver libraries + 1 in an ld.so.cache-only directory + extras
        host = build_host(
            base, make_node(GPUS), extra_libraries=LIBRARIES - len(DRIVER_LIBRARIES) - 1
        )
        node_file = base / "node.yaml"
        node_file.write_text(dump_node(host.node, "yaml"))
        cdigen = cdigen_command()
        generate = [
            *cdigen, "generate", "--node", str(node_file),
            "--driver-root", str(host.driver_root), "--dev-root", str(host.dev_root),
            "--sysfs-root", str(host.sysfs_root),
        ]  # fmt: skip
        spec_dir = base / "cdi"
        spec_file = spec_dir / "nvidia.com-gpu.yaml"
        commands = {
            "python -c pass (baseline)": [sys.executable, "-c", "pass"],
            "python importing the libraries generate needs": [
                sys.executable, "-c", f"import {', '.join(FLOOR_MODULES)}"
            ],
            # A real node's boot runs 'generate' with the default '--node nvml', which also
            # imports pynvml: this row shows what that costs on its own.
            "python importing pynvml (what --node nvml adds)": [
                sys.executable, "-c", "import pynvml"
            ],
            "cdigen --help": [*cdigen, "--help"],
            f"cdigen generate --dry-run ({GPUS} GPUs, {len(host.libraries)} libs)": [
                *generate, "--dry-run"
            ],
            "  the same, writing a new spec file": [*generate, "--output-dir", str(spec_dir)],
            "  the same, spec file unchanged (a reboot)": [
                *generate, "--output-dir", str(spec_dir)
            ],
        }  # fmt: skip
        first_write = "  the same, writing a new spec file"
        spec = subprocess.run([*generate, "--dry-run"], check=True, capture_output=True)
        mounts = spec.stdout.count(b"containerPath:")
        walls: dict[str, list[float]] = {name: [] for name in commands}
        cpus: dict[str, list[float]] = {name: [] for name in commands}
        for argv in commands.values():  # warm the page cache once
            run_ms(argv)
        for _ in range(args.runs):
            for name, argv in commands.items():
                if name == first_write:
                    spec_file.unlink(missing_ok=True)
                wall, cpu = run_ms(argv)
                walls[name].append(wall)
                cpus[name].append(cpu)
    baseline = statistics.median(walls["python -c pass (baseline)"])
    load = os.getloadavg()[0]
    print(
        f"{args.runs} runs each, interleaved; spec has {mounts} mounts; "
        f"python {sys.version.split()[0]}; {os.cpu_count()} CPUs, load average {load:.1f}"
    )
    print(f"cdigen is {install_kind()}")
    print(f"{'command':<50} {'median ms':>9} {'p99 ms':>8} {'x baseline':>10} {'cpu ms':>7}")
    for name, values in walls.items():
        median = statistics.median(values)
        cpu = statistics.median(cpus[name])
        print(
            f"{name:<50} {median:>9.1f} {p99(values):>8.1f} {median / baseline:>10.2f} {cpu:>7.1f}"
        )


if __name__ == "__main__":
    main()

"""MIG re-advertisement latency: node-file layout change -> the kubelet sees the new device list.

    python benchmarks/bench_mig.py [--flips N] [--poll 0.05]

One in-process ``Plugin`` (migStrategy mixed, generateSpecs on) serves ``dgx-a100-mig-mixed``
from a node file to the kubelet simulator. Each flip rewrites the file with the other of two MIG
layouts and times until the kubelet holds the new ``nvidia.com/mig-3g.40gb`` list and the
appearing resource is registered. The baseline, in the same run, is a health-only change of the
same file (a whole GPU marked unhealthy and back), which travels the same poll path without
regenerating specs or starting servers. Prints p50/p99 of both and the ratio at p50.

The default is 100 flips (200 health changes, about 70 s): with 20, the p99 of 40 samples is
their maximum. Even over 200 samples the health p99 moved 92 -> 120 ms between two runs of one
tree on the shared 2-core box, so compare trees with the same ``--flips`` over several runs,
alternated.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.common import percentile  # noqa: E402
from cdigen.discover import load_node  # noqa: E402
from cdigen.nodefile import dump_node  # noqa: E402
from cdigen.plugin.deviceplugin.config import HealthConfig, PluginConfig  # noqa: E402
from cdigen.plugin.deviceplugin.runner import Plugin  # noqa: E402
from tests.helpers.mig import repartition  # noqa: E402
from tests.kubelet_sim import KubeletSimulator  # noqa: E402


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank), in ms."""
    return 1000 * percentile(values, q / 100)


def main() -> int:
    """Run the flips and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flips", type=int, default=100, help="layout flips (default 100)")
    parser.add_argument("--poll", type=float, default=0.05, help="health poll interval (s)")
    args = parser.parse_args()

    node = load_node("builtin:dgx-a100-mig-mixed")
    layouts = [node, repartition(node)]
    sizes = [3, 5]  # 3g.40gb devices in each layout
    plain_id = node.gpus[5].uuid
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        (base / "driver").mkdir()
        (base / "dev").mkdir()
        node_file = base / "node.yaml"
        node_file.write_text(dump_node(node))
        config = PluginConfig(
            node=str(node_file),
            plugin_dir=base / "plugins",
            spec_dirs=(base / "cdi",),
            mig_strategy="mixed",
            generate_specs=True,
            driver_root=str(base / "driver"),
            dev_root=str(base / "dev"),
            health=HealthConfig(poll_interval_s=args.poll),
        )
        plugin = Plugin(config)
        layout_s: list[float] = []
        health_s: list[float] = []
        with KubeletSimulator(config.plugin_dir) as kubelet:
            plugin.start()
            try:
                kubelet.wait_registered("nvidia.com/mig-7g.80gb")
                kubelet.wait_devices("nvidia.com/mig-3g.40gb", lambda d: len(d) == 3)
                for flip in range(args.flips):
                    # baseline: a health-only change through the same file
                    sick = dataclasses.replace(
                        node,
                        gpus=tuple(
                            dataclasses.replace(g, healthy=False) if g.uuid == plain_id else g
                            for g in layouts[flip % 2].gpus
                        ),
                    )
                    for variant, want in ((sick, "Unhealthy"), (layouts[flip % 2], "Healthy")):
                        started = time.monotonic()
                        node_file.write_text(dump_node(variant))
                        kubelet.wait_devices(
                            "nvidia.com/gpu",
                            lambda d, w=want: {x.ID: x.health for x in d}.get(plain_id) == w,
                        )
                        health_s.append(time.monotonic() - started)
                    target = (flip + 1) % 2
                    started = time.monotonic()
                    node_file.write_text(dump_node(layouts[target]))
                    kubelet.wait_devices(
                        "nvidia.com/mig-3g.40gb", lambda d, n=sizes[target]: len(d) == n
                    )
                    appearing = "nvidia.com/mig-4g.40gb" if target else "nvidia.com/mig-7g.80gb"
                    kubelet.wait_registered(appearing, count=flip // 2 + (1 if target else 2))
                    layout_s.append(time.monotonic() - started)
            finally:
                plugin.stop()
    print(f"poll interval {args.poll * 1000:.0f} ms, {args.flips} layout flips")
    for label, values in (("health change (baseline)", health_s), ("MIG layout change", layout_s)):
        print(f"{label:25} p50 {pct(values, 50):7.1f} ms  p99 {pct(values, 99):7.1f} ms")
    print(f"ratio at p50: {statistics.median(layout_s) / statistics.median(health_s):.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

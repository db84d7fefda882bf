"""MIG layouts changed by hand, as an operator's repartition would change them."""

from __future__ import annotations

import dataclasses

from cdigen.model import Gpu, MigDevice, Node


def repartition(node: Node) -> Node:
    """GPU 3 goes from one 7g.80gb to two 3g.40gb; GPU 4 gets MIG with one 4g.40gb."""

    def mig(uuid: str, profile: str, gi: int, minors: tuple[int, int]) -> MigDevice:
        return MigDevice(uuid, profile, gi, 0, 40 << 30, minors)

    gpus: list[Gpu] = []
    for gpu in node.gpus:
        if gpu.index == 3:
            base = 3 * 9 * 15  # leave room: minors just need to be unique on the node
            gpu = dataclasses.replace(
                gpu,
                mig_devices=(
                    mig("MIG-00000000-0000-4000-8000-000000000301", "3g.40gb", 1, (base, base + 1)),
                    mig(
                        "MIG-00000000-0000-4000-8000-000000000302",
                        "3g.40gb",
                        2,
                        (base + 9, base + 10),
                    ),
                ),
            )
        elif gpu.index == 4:
            base = 4 * 9 * 15
            gpu = dataclasses.replace(
                gpu,
                mig_enabled=True,
                mig_devices=(
                    mig("MIG-00000000-0000-4000-8000-000000000401", "4g.40gb", 1, (base, base + 1)),
                ),
            )
        gpus.append(gpu)
    return dataclasses.replace(node, gpus=tuple(gpus))

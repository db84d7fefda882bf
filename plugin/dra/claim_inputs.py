"""What ``cdigen dra explain`` and ``dra check`` fit claims against: the DeviceClasses
deploy/dra installs, and a node's devices as `dra serve` would publish them."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from cdigen.plugin.dra.cli_args import shares_problem

if TYPE_CHECKING:
    from cdigen.memory_shares import MemoryShares
    from cdigen.model import Node
    from cdigen.policies.device_view import DeviceView
    from cdigen.policies.dra.slice_devices import SliceDevice


def shipped_classes() -> list[Path]:
    """The DeviceClasses ``kubectl apply -k deploy/dra`` installs, shipped as package data."""
    from cdigen.package_data import shipped_file

    return [
        shipped_file(
            "cdigen.dra_files", "deviceclasses.yaml", checkout="deploy/dra/deviceclasses.yaml"
        )
    ]


def node_devices(
    node: Node, driver: str, mig_strategy: str, shares: MemoryShares | None
) -> tuple[list[DeviceView], list[SliceDevice]]:
    """The node's device views and the devices of the ResourceSlices `dra serve` would publish
    for it with these shares (a default share the API server would refuse is refused here too,
    naming its flag)."""
    from cdigen.plugin.dra.slices import build_slices
    from cdigen.policies.device_view import device_views
    from cdigen.policies.dra.order import ordered_views
    from cdigen.policies.dra.slice_devices import slice_devices

    views = ordered_views(device_views(node, mig_strategy=mig_strategy), node)
    shares_problem(shares, views)
    slices = build_slices(
        views, driver=driver, node_name=node.name or "node", generation=1, shares=shares
    )
    return views, list(slice_devices(slices))

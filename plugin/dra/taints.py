"""DRA device taints from health (KEP-5055): a device whose health reasons hold a configured
critical Xid gets a taint ``<driver>/xid`` with the Xid as its value."""

from __future__ import annotations

from collections.abc import Mapping

from cdigen.plugin.agent.health import Reason
from cdigen.plugin.dra.slices import TaintDoc
from cdigen.policies.dra.slice_devices import TAINT_EFFECTS

# Xids that taint a device by default: 48 (double-bit ECC), 79 (fallen off the bus), 95
# (uncontained ECC), 64 and 94 (row remapping, contained ECC). All NoSchedule, as NVIDIA's DRA
# driver does: new claims stay off the device and running pods are left to the admin (a
# DeviceTaintRule, or --taint-xid 79=NoExecute to evict).
DEFAULT_TAINT_XIDS: Mapping[int, str] = {
    48: "NoSchedule",
    79: "NoSchedule",
    95: "NoSchedule",
    64: "NoSchedule",
    94: "NoSchedule",
}


def xid_taints(
    reasons: Mapping[str, tuple[str, ...]], taint_xids: Mapping[int, str], driver: str
) -> dict[str, list[TaintDoc]]:
    """The taints the health reasons call for: one per device whose reasons hold an Xid of
    ``taint_xids`` (key ``<driver>/xid``, the Xid as value; the most severe effect wins)."""
    out: dict[str, list[TaintDoc]] = {}
    for device, held in sorted(reasons.items()):
        worst: tuple[int, int] | None = None  # (effect rank, xid)
        for reason in held:
            xid = reason.xid if isinstance(reason, Reason) else None
            if xid is None or (effect := taint_xids.get(xid)) is None:
                continue
            rank = TAINT_EFFECTS.index(effect)
            if worst is None or rank > worst[0]:
                worst = (rank, xid)
        if worst is not None:
            out[device] = [
                {"key": f"{driver}/xid", "value": str(worst[1]), "effect": TAINT_EFFECTS[worst[0]]}
            ]
    return out

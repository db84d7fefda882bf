"""The transient CDI spec of one claim and the names in it: cdigen's generator on a node
holding only the claim's devices, each renamed to a name unique to the claim, plus a device per
driver capability the claim's config asks for beyond the node-wide ones."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from cdigen.cdi.capabilities import ordered_capabilities
from cdigen.cdi.driverfiles import DriverFiles
from cdigen.cdi.hostfs import HostFS
from cdigen.cdi.names import capability_device_name
from cdigen.cdi.spec import (
    SpecOptions,
    build_spec,
    extra_capabilities,
    missing_capability_devices,
)
from cdigen.cdi.types import SpecDoc
from cdigen.errors import InputError
from cdigen.model import Gpu, Node
from plugin.dra.checkpoint import CLAIM_CLASS
from plugin.dra.claims import AllocatedDevice, ClaimRef
from plugin.dra.config import RequestConfig, config_for
from policies.device_view import DeviceView


def claim_kind(driver: str) -> str:
    """The CDI kind of the transient per-claim specs: ``k8s.<driver>/claim``."""
    return f"k8s.{driver}/{CLAIM_CLASS}"


def claim_device_name(uid: str, result: AllocatedDevice) -> str:
    """The CDI device name of one allocated device in its claim's transient spec."""
    return f"{uid}-{result.device}"


def claim_capability_name(uid: str, capability: str) -> str:
    """The CDI device name of a capability device in claim ``uid``'s transient spec (unique to
    the claim: every claim spec shares one kind), e.g. ``<uid>-capability-graphics``."""
    return f"{uid}-{capability_device_name(capability)}"


class ClaimSpecs:
    """Builds claims' specs for one driver on this node (``node`` follows the layout)."""

    def __init__(
        self,
        *,
        driver: str,
        node: Node,
        options: SpecOptions,
        driver_files: DriverFiles,
        fs: HostFS,
    ) -> None:
        self.driver = driver
        self.node = node
        # the capabilities claims may ask for beyond the node-wide ones (--capability-devices)
        self.offered = extra_capabilities(options)
        self.options = replace(
            options,
            vendor=f"k8s.{driver}",
            cls=CLAIM_CLASS,
            name_strategies=("uuid",),
            hook_path=None,
            cdi_version=None,
            capability_devices=(),
        )
        self._driver_files = driver_files
        self._fs = fs

    def capabilities_asked(
        self, ref: ClaimRef, configs: Sequence[RequestConfig], allocated: Sequence[AllocatedDevice]
    ) -> tuple[dict[str, tuple[str, ...]], frozenset[str]]:
        """The capabilities beyond the node-wide ones that each request's config (``configs``,
        decoded once by plugin.dra.config.claim_configs) asks for, and those asked by name (not
        through ``all``, which means every one offered); InputError on a capability named that
        this driver does not offer (--capability-devices)."""
        out: dict[str, tuple[str, ...]] = {}
        explicit: set[str] = set()
        if not configs:
            return out, frozenset()
        for result in allocated:
            entry = config_for(configs, result.request)
            if entry is None or result.request in out:
                continue
            asked = tuple(
                c
                for c in entry.config.capabilities
                if c not in self.options.capabilities
                and (c in self.offered or not entry.config.every)
            )
            if not entry.config.every:
                explicit.update(asked)
            missing = [c for c in asked if c not in self.offered]
            if missing:
                raise InputError(
                    f"request {result.request!r} asks for driver capabilities "
                    f"{', '.join(missing)}, which this driver does not offer "
                    f"(offered: {', '.join(self.offered) or 'none'})",
                    where=f"ResourceClaim {ref.namespace}/{ref.name} "
                    f"status.allocation.devices.config[{entry.index}] ({entry.source})",
                    hint=f"start cdigen dra serve with --capability-devices "
                    f"{','.join(ordered_capabilities((*self.offered, *missing)))}, "
                    "or drop them from the config",
                )
            out[result.request] = asked
        return out, frozenset(explicit)

    def build(
        self,
        ref: ClaimRef,
        views: Sequence[DeviceView],
        capabilities: tuple[str, ...] = (),
        explicit: frozenset[str] = frozenset(),
    ) -> SpecDoc:
        """The transient spec of one claim: cdigen's generator on a node holding only the
        claim's devices, each renamed to a name unique to the claim, and a device per asked
        capability (what it adds to the common edits), renamed alike. InputError when the
        driver root has no files for a capability in ``explicit`` (asked for by name)."""
        uid = ref.uid
        gpus: dict[int, Gpu] = {}
        for view in views:
            gpu = gpus.get(view.gpu.index)
            if view.mig is None:
                gpus[view.gpu.index] = replace(view.gpu, mig_enabled=False, mig_devices=())
            elif gpu is None:
                gpus[view.gpu.index] = replace(view.gpu, mig_devices=(view.mig,))
            else:
                gpus[view.gpu.index] = replace(gpu, mig_devices=(*gpu.mig_devices, view.mig))
        sub_node = replace(self.node, gpus=tuple(gpus.values()), links=())
        options = replace(self.options, capability_devices=capabilities)
        spec = build_spec(sub_node, options, self._driver_files, self._fs)
        missing = [c for c in missing_capability_devices(spec, options) if c in explicit]
        if missing:
            raise InputError(
                f"the driver root {options.driver_root} has no files for driver capabilities "
                f"{', '.join(missing)}",
                where=f"ResourceClaim {ref.namespace}/{ref.name}",
                hint="install the driver's libraries for them on this node, or drop them from "
                "the claim's config",
            )
        by_uuid = {v.uuid: f"{uid}-{v.name}" for v in views}
        for cap in capabilities:
            by_uuid[capability_device_name(cap)] = claim_capability_name(uid, cap)
        spec["devices"] = [
            {**d, "name": by_uuid[d["name"]]} for d in spec["devices"] if d["name"] in by_uuid
        ]
        return spec

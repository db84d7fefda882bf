"""The transient CDI spec of one claim and the names in it, built for the claim: a device per
allocated device named for the claim, a device per driver capability its config asks for beyond
the node-wide ones, the common edits (the driver's files, as ``generate`` makes them) with the
claim's MPS settings, and the lowest cdiVersion of that content."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from cdigen.cdi import devnodes
from cdigen.cdi.capabilities import ordered_capabilities
from cdigen.cdi.devnodes import DeviceNodeInfo
from cdigen.cdi.driverfiles import DriverFiles
from cdigen.cdi.hostfs import HostFS
from cdigen.cdi.names import capability_device_name
from cdigen.cdi.spec import (
    SpecOptions,
    capability_edits,
    extra_capabilities,
    gpu_device_nodes,
)
from cdigen.cdi.types import ContainerEditsDoc, DeviceDoc, MountDoc, SpecDoc
from cdigen.cdi.version import minimum_version
from cdigen.errors import InputError
from cdigen.model import Node
from cdigen.plugin.dra.checkpoint import CLAIM_CLASS, claim_vendor
from cdigen.plugin.dra.claims import AllocatedDevice, ClaimRef
from cdigen.plugin.dra.config import RequestConfig, config_for
from cdigen.plugin.dra.dynamic_mig import MadeMig, complete_cap_nodes
from cdigen.policies.device_view import DeviceView


def claim_kind(driver: str) -> str:
    """The CDI kind of the transient per-claim specs: ``k8s.<driver>/claim``."""
    return f"{claim_vendor(driver)}/{CLAIM_CLASS}"


def claim_name(uid: str, name: str) -> str:
    """The CDI device name of ``name`` (a device of the pool, or a capability device) in
    claim ``uid``'s transient spec: unique to the claim, since every claim spec shares one kind."""
    return f"{uid}-{name}"


def claim_device_name(uid: str, result: AllocatedDevice) -> str:
    """The CDI device name of one allocated device in its claim's transient spec."""
    return claim_name(uid, result.device)


def claim_capability_name(uid: str, capability: str) -> str:
    """The CDI device name of a capability device in claim ``uid``'s transient spec, e.g.
    ``<uid>-capability-graphics``."""
    return claim_name(uid, capability_device_name(capability))


# distinct (capabilities asked, control nodes) whose common edits a ClaimSpecs keeps
EDIT_CACHE_MAX = 16


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
            vendor=claim_vendor(driver),
            cls=CLAIM_CLASS,
            name_strategies=("uuid",),
            hook_path=None,
            cdi_version=None,
            capability_devices=(),
        )
        self._driver_files = driver_files
        self._fs = fs
        self._edit_cache: dict[
            tuple[tuple[str, ...], tuple[DeviceNodeInfo, ...]],
            tuple[ContainerEditsDoc, dict[str, ContainerEditsDoc]],
        ] = {}

    def capabilities_asked(
        self, ref: ClaimRef, configs: Sequence[RequestConfig], allocated: Sequence[AllocatedDevice]
    ) -> tuple[dict[str, tuple[str, ...]], frozenset[str]]:
        """The capabilities beyond the node-wide ones that each request's config (``configs``,
        decoded once by cdigen.plugin.dra.config.claim_configs) asks for, and those asked by name
        (not through ``all``, which means every one offered); InputError on a capability named that
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
        *,
        env: Sequence[str] = (),
        mounts: Sequence[MountDoc] = (),
        made: Sequence[MadeMig] = (),
    ) -> SpecDoc:
        """The transient spec of one claim, built for it: a device per view named for the
        claim (its device nodes: the GPU's, then its DRM nodes or its MIG device's nvidia-caps
        nodes), a device per asked capability (what it adds to the common edits), the common
        edits with the claim's MPS ``env`` and ``mounts``, the nvidia-caps nodes of the MIG
        devices ``made`` completed, and then the lowest cdiVersion that content needs.
        InputError when the driver root has no files for a capability in ``explicit`` (asked
        for by name)."""
        uid, opts = ref.uid, self.options
        devices: list[DeviceDoc] = [
            {
                "name": claim_name(uid, view.name),
                "containerEdits": {
                    "deviceNodes": gpu_device_nodes(view.gpu, view.mig, opts, self._fs)
                },
            }
            for view in views
        ]
        control = tuple(devnodes.control_nodes(opts.dev_root, self._fs))
        edits, beyond = self._edits(capabilities, control)
        missing = [c for c in capabilities if c not in beyond and c in explicit]
        if missing:
            raise InputError(
                f"the driver root {opts.driver_root} has no files for driver capabilities "
                f"{', '.join(missing)}",
                where=f"ResourceClaim {ref.namespace}/{ref.name}",
                hint="install the driver's libraries for them on this node, or drop them from "
                "the claim's config",
            )
        for cap in capabilities:
            if cap in beyond:
                devices.append(
                    {"name": claim_capability_name(uid, cap), "containerEdits": beyond[cap]}
                )
        common = edits  # shared between claims (never changed): checked once at the write
        if env:
            common = {
                **edits,
                "env": [*edits.get("env", []), *env],
                "mounts": [*edits.get("mounts", []), *mounts],
            }
        spec: SpecDoc = {
            "cdiVersion": "",
            "kind": claim_kind(self.driver),
            "devices": devices,
            "containerEdits": common,
        }
        complete_cap_nodes(spec, made)
        spec["cdiVersion"] = minimum_version(spec)  # of the whole content, MPS edits included
        return spec

    def _edits(
        self, capabilities: tuple[str, ...], control: tuple[DeviceNodeInfo, ...]
    ) -> tuple[ContainerEditsDoc, dict[str, ContainerEditsDoc]]:
        """The common edits, and what each capability with files adds to them: the same for
        every claim while the control nodes are (kept per capabilities and control nodes; the
        driver's files are scanned once at start). Shared: never changed by a caller."""
        key = (capabilities, control)
        found = self._edit_cache.get(key)
        if found is None:
            edits, beyond = capability_edits(
                self._driver_files, self.options, control, capabilities
            )
            if len(self._edit_cache) >= EDIT_CACHE_MAX:
                self._edit_cache.pop(next(iter(self._edit_cache)))
            found = self._edit_cache[key] = (edits, beyond)
        return found

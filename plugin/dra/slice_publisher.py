"""The ResourceSlices of this node's pool, kept equal to the device view: one generation per
change, fitted to what the API server's version takes (taint effect None, list attributes, MIG
counters in their own slices) and checked for what it dropped (feature gates off).

Slices are built by :mod:`cdigen.plugin.dra.slices` and :mod:`cdigen.plugin.dra.counters`; they
reach the API server through a :class:`SliceApi` (:class:`cdigen.plugin.dra.kube.KubeApi` in a
cluster).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from cdigen.memory_shares import MemoryShares
from cdigen.plugin.agent.kubeapi import ApiCallError
from cdigen.plugin.dra.counters import build_counter_slices
from cdigen.plugin.dra.slices import TaintDoc, build_slices
from cdigen.policies.device_view import Attribute, DeviceView

log = logging.getLogger(__name__)


NONE_EFFECT_MINOR = 35  # the first Kubernetes 1.x whose API server takes taint effect None
# the first Kubernetes 1.x whose DeviceAttribute has list values (ints, KEP-5491; alpha there,
# behind the DRAListTypeAttributes gate, which the operator vouches for with the flag)
LIST_ATTRIBUTES_MINOR = 36


class SliceApi(Protocol):
    """The ResourceSlice calls the publisher needs."""

    def list_slices(self, driver: str, node_name: str) -> list[dict[str, Any]]:
        """This node's slices of ``driver``."""
        ...

    def create_slice(self, body: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """Create one slice; the stored object when the API answers with it."""
        ...

    def replace_slice(self, name: str, body: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """Replace one slice; the stored object when the API answers with it."""
        ...

    def delete_slice(self, name: str) -> None:
        """Delete one slice."""
        ...


class SlicePublisher:
    """Keeps this node's pool of ResourceSlices equal to the device view, one generation per
    change."""

    def __init__(
        self, api: SliceApi, *, driver: str, node_name: str, owner: dict[str, str] | None = None
    ) -> None:
        self._api = api
        self.driver = driver
        self.node_name = node_name
        self._owner = owner
        self.generation = 0
        # name -> (resourceVersion the API gave our last write, the spec we sent)
        self._written: dict[str, tuple[str | None, Any]] = {}
        self._said_lacking: set[str] = set()  # the features said to be left out, once each
        self._said_taints = False  # the error about dropped device taints, said once
        self._said_counters = False  # the error about dropped counters, said once

    def _server_minor(self) -> int | None:
        """The API server's Kubernetes 1.x minor, where the api can tell (KubeApi can)."""
        minor: int | None = getattr(self._api, "server_minor", lambda: None)()
        return minor

    def _server_lacks(self, needed: int, what: str, needs: str) -> bool:
        """Whether the API server is older than Kubernetes 1.``needed`` (or of an unknown
        version), so a feature that needs ``needed`` is left out; said once as a WARNING
        (``<what>: the API server is 1.x, and <needs> Kubernetes 1.<needed> or newer``)."""
        minor = self._server_minor()
        if minor is not None and minor >= needed:
            return False
        if what not in self._said_lacking:
            self._said_lacking.add(what)
            log.warning(
                "%s: the API server is %s, and %s Kubernetes 1.%d or newer",
                what,
                f"1.{minor}" if minor is not None else "of an unknown version",
                needs,
                needed,
            )
        return True

    def set_owner(self, owner: dict[str, str] | None) -> None:
        """The Node owner reference for slices published from now on."""
        self._owner = owner

    def in_step(self) -> bool:
        """True when this node's slices are exactly the ones we last wrote: none deleted,
        none added, none changed by someone else (one list call)."""
        if not self._written:
            return False
        found = {
            s["metadata"]["name"]: s for s in self._api.list_slices(self.driver, self.node_name)
        }
        if found.keys() != self._written.keys():
            return False
        for name, (version, spec) in self._written.items():
            got = found[name]
            got_version = (got.get("metadata") or {}).get("resourceVersion")
            if version is not None and got_version is not None:
                if got_version != version:
                    return False
            elif got.get("spec") != spec:
                return False
        return True

    def publish(
        self,
        views: Sequence[DeviceView],
        *,
        shares: MemoryShares | None = None,
        taints: Mapping[str, Sequence[TaintDoc]] | None = None,
    ) -> list[dict[str, Any]]:
        """Replace this node's slices with ones for ``views`` (in that order), with memory
        ``shares`` and device ``taints`` (by device name); return them. Taints of effect
        ``None`` go only to a server that knows it (Kubernetes 1.35+)."""
        if taints and any(t["effect"] == "None" for ts in taints.values() for t in ts):
            taints = self._informational_taints(taints)
        if any(a.kind == "ints" for v in views for a in v.attributes.values()):
            views = self._list_attributes(views)
        existing = {
            s["metadata"]["name"]: s for s in self._api.list_slices(self.driver, self.node_name)
        }
        published = max(
            [
                int(((s.get("spec") or {}).get("pool") or {}).get("generation", 0))
                for s in existing.values()
            ]
            or [0]
        )
        self.generation = max(self.generation, published) + 1
        wanted = self._build(views, shares, taints)
        self._written = {}
        for body in wanted:
            name = body["metadata"]["name"]
            old = existing.pop(name, None)
            if old is None:
                stored = self._api.create_slice(body)
            else:
                version = (old.get("metadata") or {}).get("resourceVersion")
                if version:
                    body["metadata"]["resourceVersion"] = version
                stored = self._api.replace_slice(name, body)
            self._check_counters_kept(body, stored)
            self._check_taints_kept(body, stored)
            got = ((stored or {}).get("metadata") or {}).get("resourceVersion")
            self._written[name] = (str(got) if got else None, body.get("spec"))
        for name in existing:
            self._api.delete_slice(name)
        log.info(
            "published %d devices in %d ResourceSlice(s), pool %s generation %d",
            len(views),
            len(wanted),
            self.node_name,
            self.generation,
        )
        return wanted

    def _build(
        self,
        views: Sequence[DeviceView],
        shares: MemoryShares | None,
        taints: Mapping[str, Sequence[TaintDoc]] | None,
    ) -> list[dict[str, Any]]:
        """The slices of this generation; with MIG placements (counters), in the layout of the
        server's version, and an ApiCallError (retried) while that version is unknown."""
        common: dict[str, Any] = {
            "driver": self.driver,
            "node_name": self.node_name,
            "generation": self.generation,
            "owner": self._owner,
            "shares": shares,
            "taints": taints,
        }
        if not any(v.placement is not None for v in views):
            return build_slices(views, **common)
        minor = self._server_minor()
        if minor is None:
            raise ApiCallError(
                "cannot read the API server's version, which decides where the MIG counters "
                "go (their own ResourceSlices from Kubernetes 1.35)"
            )
        return build_counter_slices(views, server_minor=minor, **common)

    def _check_counters_kept(
        self, sent: Mapping[str, Any], stored: Mapping[str, Any] | None
    ) -> None:
        """Say once when the API server dropped the counters we sent: its
        DRAPartitionableDevices feature gate is off, and the scheduler would then allocate
        overlapping MIG placements that prepare cannot make."""
        spec = (stored or {}).get("spec")
        if self._said_counters or not isinstance(spec, Mapping):
            return
        sent_spec = sent.get("spec") or {}
        pairs = zip(sent_spec.get("devices") or [], spec.get("devices") or [], strict=False)
        dropped = ("sharedCounters" in sent_spec and "sharedCounters" not in spec) or any(
            "consumesCounters" in d and "consumesCounters" not in g for d, g in pairs
        )
        if dropped:
            self._said_counters = True
            log.error(
                "the API server dropped the MIG counters of the ResourceSlices: enable the "
                "DRAPartitionableDevices feature gate (API server and scheduler), or serve "
                "another --mig-strategy; until then claims for overlapping placements fail"
            )

    def _check_taints_kept(self, sent: Mapping[str, Any], stored: Mapping[str, Any] | None) -> None:
        """Say once when the API server dropped the device taints we sent: its DRADeviceTaints
        feature gate is off (alpha before 1.36, off by default), and the scheduler would then
        hand out the GPUs the taints were to keep claims off."""
        spec = (stored or {}).get("spec")
        if self._said_taints or not isinstance(spec, Mapping):
            return
        sent_devices = (sent.get("spec") or {}).get("devices") or []
        pairs = zip(sent_devices, spec.get("devices") or [], strict=False)
        if any(d.get("taints") and not g.get("taints") for d, g in pairs):
            self._said_taints = True
            log.error(
                "the API server dropped the device taints of the ResourceSlices: enable the "
                "DRADeviceTaints feature gate (API server and scheduler; on by default from "
                "Kubernetes 1.36, GA in 1.37); until then tainted GPUs are still allocated"
            )

    def _informational_taints(
        self, taints: Mapping[str, Sequence[TaintDoc]]
    ) -> Mapping[str, Sequence[TaintDoc]]:
        """``taints``, less those of effect None where the server does not know that effect
        (said once)."""
        if not self._server_lacks(
            NONE_EFFECT_MINOR,
            "taints of effect None left out of the ResourceSlices",
            "the effect needs",
        ):
            return taints
        kept = {d: [t for t in ts if t["effect"] != "None"] for d, ts in taints.items()}
        return {d: ts for d, ts in kept.items() if ts}

    def _list_attributes(self, views: Sequence[DeviceView]) -> Sequence[DeviceView]:
        """``views``, their list attributes cut to their first value (the scalar form) where
        the server's DeviceAttribute has no lists (said once)."""
        if not self._server_lacks(
            LIST_ATTRIBUTES_MINOR,
            "list attributes (--numa-node-attribute list) published as their first value",
            "lists need",
        ):
            return views
        return [_scalar_attributes(v) for v in views]

    def delete_all(self) -> None:
        """Delete this node's slices (a clean shutdown, when configured to)."""
        self._written = {}
        for item in self._api.list_slices(self.driver, self.node_name):
            self._api.delete_slice(item["metadata"]["name"])


def _scalar_attributes(view: DeviceView) -> DeviceView:
    """``view`` with each list attribute as its first value."""
    attributes = {
        name: Attribute("int", a.value[0]) if isinstance(a.value, tuple) else a
        for name, a in view.attributes.items()
    }
    return dataclasses.replace(view, attributes=attributes)

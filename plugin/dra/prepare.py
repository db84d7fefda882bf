"""NodePrepareResources / NodeUnprepareResources: claims -> transient CDI specs, checkpointed.

Calls are serialized (one lock) and idempotent: preparing a prepared claim returns what the
first call returned, unpreparing an unknown claim is a success. Every prepared claim is kept in
a checkpoint file, so that a restarted plugin still unprepares claims prepared before it; a
prepared claim whose spec is gone (a tmpfs CDI dir after a reboot) is prepared again.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from cdigen.cdi.capabilities import ordered_capabilities
from cdigen.cdi.driverfiles import DriverFiles
from cdigen.cdi.hostfs import HostFS
from cdigen.cdi.names import qualified_name
from cdigen.cdi.spec import (
    SpecOptions,
)
from cdigen.cdi.write import write_claim_spec
from cdigen.errors import CdigenError, InputError
from cdigen.fileio import atomic_write, remove_temp_files
from cdigen.model import Node
from plugin.dra.checkpoint import (
    CHECKPOINT_VERSION,
    ClaimDoc,
    PreparedDeviceDoc,
    claim_spec_path,
    claim_spec_prefix,
    legacy_claim_spec_path,
    load_checkpoint,
    remove_spec,
    spec_present,
)
from plugin.dra.claim_spec import (
    ClaimSpecs,
    claim_capability_name,
    claim_device_name,
    claim_kind,
)
from plugin.dra.claims import (
    AllocatedDevice,
    ClaimReader,
    ClaimRef,
    allocated_devices,
    kind_of,
    quoted,
)
from plugin.dra.config import claim_configs, claim_sharing
from plugin.dra.dynamic_mig import MadeMig, MigMaker, complete_cap_nodes
from plugin.dra.mps import MpsSettings, claim_limits
from policies.device_view import DeviceView

log = logging.getLogger(__name__)

# A claim's error goes into the kubelet's pod events: one line, at most this long.
MAX_ERROR_CHARS = 300


@dataclass(frozen=True)
class PrepareResult:
    """The devices of one prepared claim, or why it failed (that claim only)."""

    devices: tuple[PreparedDeviceDoc, ...] = ()
    error: str = ""


def one_line(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """``text`` on one line (whitespace runs become one space), cut to ``limit`` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


class Preparer:
    """Prepares and unprepares claims for one driver and pool on this node."""

    def __init__(
        self,
        *,
        driver: str,
        pool: str,
        node: Node,
        views: Sequence[DeviceView],
        reader: ClaimReader,
        spec_dir: Path,
        checkpoint: Path,
        options: SpecOptions,
        driver_files: DriverFiles,
        fs: HostFS,
        mps: MpsSettings | None = None,
        mig: MigMaker | None = None,
    ) -> None:
        self.driver = driver
        self._mig = mig  # makes the MIG device of an allocated placement
        self.pool = pool
        self._views = {v.name: v for v in views}
        self._reader = reader
        self._spec_dir = spec_dir
        self._checkpoint = checkpoint
        self._specs = ClaimSpecs(
            driver=driver, node=node, options=options, driver_files=driver_files, fs=fs
        )
        self._mps = mps or MpsSettings()
        self._lock = threading.Lock()
        self._claims: dict[str, ClaimDoc] = load_checkpoint(
            checkpoint, spec_dir=spec_dir, driver=driver
        )
        # what a kill -9 during a write left: only our own temp files, never another writer's
        remove_temp_files(spec_dir, lambda: log, f".{claim_spec_prefix(driver)}")
        remove_temp_files(checkpoint.parent, lambda: log, f".{checkpoint.name}.")

    def set_devices(self, node: Node, views: Sequence[DeviceView]) -> None:
        """A new layout: prepare from now on against these devices."""
        with self._lock:
            self._specs.node = node
            self._views = {v.name: v for v in views}

    def made_migs(self) -> frozenset[tuple[str, int]]:
        """The MIG devices made for prepared claims, as (GPU UUID, GPU instance ID)."""
        with self._lock:
            return frozenset(
                (m["gpuUUID"], m["gi"])
                for claim in self._claims.values()
                for m in claim.get("migDevices", [])
            )

    def prepared(self) -> dict[str, ClaimDoc]:
        """A copy of the prepared claims by UID."""
        with self._lock:
            return dict(self._claims)

    # ------------------------------------------------------------------ prepare

    def prepare(self, ref: ClaimRef) -> PrepareResult:
        """Prepare one claim; a failure belongs to this claim and is returned as one line of
        at most MAX_ERROR_CHARS, never raised. The UID is checked before any use."""
        problem = ref.problem()
        if problem:
            log.warning("NodePrepareResources: %s", one_line(problem))
            return PrepareResult(error=one_line(problem))
        try:
            result = self._prepare(ref)
        except Exception:  # a bug fails this claim only, never the kubelet's whole call
            log.exception("claim %s: preparing failed", ref.shown)
            result = PrepareResult(error="internal error preparing the claim (see the plugin log)")
        return replace(result, error=one_line(result.error)) if result.error else result

    def _prepare(self, ref: ClaimRef) -> PrepareResult:
        with self._lock:
            done = self._claims.get(ref.uid)
            if done is not None and spec_present(done):
                return PrepareResult(tuple(done["devices"]))
        try:
            claim = self._reader.read_claim(ref.namespace, ref.name)
        except Exception as exc:  # an API error belongs to this claim; the kubelet retries
            return PrepareResult(error=f"reading ResourceClaim {ref.namespace}/{ref.name}: {exc}")
        if not isinstance(claim, Mapping):
            return PrepareResult(
                error=f"reading ResourceClaim {ref.namespace}/{ref.name}: the API server "
                f"sent {kind_of(claim)}, not an object"
            )
        with self._lock:
            done = self._claims.get(ref.uid)
            if done is not None:
                if spec_present(done):  # prepared by a concurrent duplicate call
                    return PrepareResult(tuple(done["devices"]))
                # the CDI dir lost the spec (a tmpfs after a reboot): write it again
                log.warning(
                    "claim %s/%s (%s): its spec %s is gone; writing it again",
                    ref.namespace,
                    ref.name,
                    ref.uid,
                    done["specPath"],
                )
                error = self._destroy_migs(done)  # made again below
                if error:
                    return PrepareResult(error=error)
                self._save_quietly()  # the checkpoint no longer names them
            try:
                return PrepareResult(tuple(self._prepare_locked(ref, claim)))
            except CdigenError as exc:
                log.warning("claim %s/%s (%s): %s", ref.namespace, ref.name, ref.uid, exc)
                return PrepareResult(error=str(exc))

    def _prepare_locked(self, ref: ClaimRef, claim: Mapping[str, Any]) -> list[PreparedDeviceDoc]:
        allocated = allocated_devices(claim, ref, driver=self.driver, pool=self.pool)
        extra, explicit = self._specs.capabilities_asked(ref, claim, allocated)
        views: list[DeviceView] = []
        for result in allocated:
            view = self._views.get(result.device)
            if view is None:
                raise InputError(
                    f"device {quoted(result.device)} of pool {self.pool!r} is not offered by "
                    "this node",
                    where=f"ResourceClaim {ref.namespace}/{ref.name}",
                    hint="the node's devices changed since the claim was allocated",
                )
            self._refuse_if_held(ref, result)
            views.append(view)
        made = self._make_migs(ref, views)
        try:
            return self._prepare_views(ref, claim, allocated, extra, explicit, views, made)
        except BaseException:  # nothing half-made stays: the MIG devices made go again
            for one in made:
                error = self._mig.destroy(one.doc) if self._mig else ""
                if error:
                    log.error("claim %s: %s", ref.shown, error)
            raise

    def _make_migs(self, ref: ClaimRef, views: list[DeviceView]) -> list[MadeMig]:
        """Make the MIG device of each placement in ``views`` and put it in its view's place;
        MigError (with those made destroyed) when one cannot be made."""
        made: list[MadeMig] = []
        for n, view in enumerate(views):
            if view.placement is None:
                continue
            try:
                if self._mig is None:
                    raise InputError(
                        f"device {view.name!r} is a MIG placement, and this plugin cannot make "
                        "MIG devices (no NVML)",
                        where=f"ResourceClaim {ref.namespace}/{ref.name}",
                        hint="serve --mig-strategy dynamic with NVML (--node nvml)",
                    )
                one = self._mig.create(view)
            except CdigenError:
                for earlier in made:
                    assert self._mig is not None
                    self._mig.destroy(earlier.doc)
                raise
            made.append(one)
            views[n] = replace(view, entry=replace(view.entry, mig=one.mig))
        return made

    def _destroy_migs(self, done: ClaimDoc) -> str:
        """Destroy the MIG devices made for a prepared claim. The first error, or ""."""
        for doc in done.get("migDevices", []):
            error = self._mig.destroy(doc) if self._mig else "no NVML to destroy MIG devices with"
            if error:
                return error
        done["migDevices"] = []
        return ""

    def _prepare_views(
        self,
        ref: ClaimRef,
        claim: Mapping[str, Any],
        allocated: Sequence[AllocatedDevice],
        extra: dict[str, tuple[str, ...]],
        explicit: frozenset[str],
        views: list[DeviceView],
        migs: Sequence[MadeMig],
    ) -> list[PreparedDeviceDoc]:
        """Write the claim's spec for ``views`` (placements already made) and checkpoint it."""
        path = claim_spec_path(self._spec_dir, self.driver, ref.uid)
        if views:
            asked = ordered_capabilities(c for caps in extra.values() for c in caps)
            spec = self._specs.build(ref, views, asked, explicit)
            made = {d["name"] for d in spec["devices"]}
            extra = {
                request: tuple(c for c in caps if claim_capability_name(ref.uid, c) in made)
                for request, caps in extra.items()
            }
            where = f"ResourceClaim {ref.namespace}/{ref.name}"
            configs = claim_configs(claim, ref, driver=self.driver)
            sharing = claim_sharing(configs, [r.request for r in allocated], where)
            env, mounts = claim_limits(allocated, self._views, self._mps, sharing, where=where)
            if env:
                edits = spec.setdefault("containerEdits", {})
                edits["env"] = [*edits.get("env", []), *env]
                edits["mounts"] = [*edits.get("mounts", []), *mounts]
            complete_cap_nodes(spec, migs)
            # within: the (checked) UID makes one file name; the write is refused anywhere else
            write_claim_spec(spec, path, within=self._spec_dir)
        devices = [self._device_doc(ref.uid, r, extra.get(r.request, ())) for r in allocated]
        self._claims[ref.uid] = {
            "namespace": ref.namespace,
            "name": ref.name,
            "devices": devices,
            "shareable": {r.device: r.shareable for r in allocated},
            "specPath": str(path) if views else "",
        }
        if migs:
            self._claims[ref.uid]["migDevices"] = [one.doc for one in migs]
        try:
            self._save()
        except CdigenError:  # not kept across a restart: not prepared (the kubelet retries)
            del self._claims[ref.uid]
            if views:
                remove_spec(path)
            raise
        log.info(
            "prepared claim %s/%s (%s): %s",
            ref.namespace,
            ref.name,
            ref.uid,
            ", ".join(d["deviceName"] for d in devices) or "no devices of ours",
        )
        return devices

    def _device_doc(
        self, uid: str, result: AllocatedDevice, capabilities: Sequence[str]
    ) -> PreparedDeviceDoc:
        """What the kubelet is told of one prepared device: its CDI IDs in the claim's spec."""
        kind = claim_kind(self.driver)
        doc: PreparedDeviceDoc = {
            "requestNames": [result.request] if result.request else [],
            "poolName": self.pool,
            "deviceName": result.device,
            "cdiDeviceIds": [
                qualified_name(kind, claim_device_name(uid, result)),
                *(qualified_name(kind, claim_capability_name(uid, c)) for c in capabilities),
            ],
            "shareId": result.share_id,
        }
        if result.consumed:  # what the claim was given of a shared device (attribution)
            doc["consumedCapacity"] = dict(result.consumed)
        return doc

    def _refuse_if_held(self, ref: ClaimRef, result: AllocatedDevice) -> None:
        for uid, other in self._claims.items():
            if uid == ref.uid or result.device not in other["shareable"]:
                continue
            if result.shareable and other["shareable"][result.device]:
                continue
            raise InputError(
                f"device {result.device!r} is already prepared for claim "
                f"{other['namespace']}/{other['name']} ({uid})",
                where=f"ResourceClaim {ref.namespace}/{ref.name}",
                hint="a device is shared only when both claims were allocated it for sharing",
            )

    # ------------------------------------------------------------------ unprepare

    def unprepare(self, ref: ClaimRef) -> str:
        """Unprepare one claim: remove its transient spec and forget it. The error (one line of
        at most MAX_ERROR_CHARS), or "". The UID is checked before any use: one that is not a
        Kubernetes UID was never prepared, so, as any unknown claim, it is a success."""
        problem = ref.problem()
        if problem:  # never prepared (prepare refuses it, the checkpoint load too): unknown
            log.warning("NodeUnprepareResources: %s: nothing to unprepare", one_line(problem))
            return ""
        try:
            return one_line(self._unprepare(ref))
        except Exception:  # a bug fails this claim only, never the kubelet's whole call
            log.exception("claim %s: unpreparing failed", ref.shown)
            return "internal error unpreparing the claim (see the plugin log)"

    def _unprepare(self, ref: ClaimRef) -> str:
        with self._lock:
            done = self._claims.get(ref.uid)
            if done is None:
                # a spec written before a crash kept it out of the checkpoint, or nothing
                return self._remove_unknown_spec(ref.uid)
            error = self._destroy_migs(done)
            if error:
                return error
            error = remove_spec(done["specPath"]) if done["specPath"] else ""
            if error:
                return error
            del self._claims[ref.uid]
            try:
                self._save()
            except CdigenError as exc:
                return exc.message
            log.info("unprepared claim %s/%s (%s)", ref.namespace, ref.name, ref.uid)
            return ""

    def _remove_unknown_spec(self, uid: str) -> str:
        """Remove the spec a claim the checkpoint does not know may have left (``uid`` is a
        checked one). The error, or ""."""
        for path in (
            claim_spec_path(self._spec_dir, self.driver, uid),
            legacy_claim_spec_path(self._spec_dir, self.driver, uid),
        ):
            if not os.path.lexists(path):
                continue
            error = remove_spec(path)
            if error:
                return error
            log.info("removed %s, left by claim %s without a checkpoint entry", path, uid)
        return ""

    def _save_quietly(self) -> None:
        """:meth:`_save`, a failure logged (the next save writes the same)."""
        try:
            self._save()
        except CdigenError as exc:
            log.error("cannot write the checkpoint: %s", exc)

    def _save(self) -> None:
        doc = {"version": CHECKPOINT_VERSION, "claims": self._claims}
        atomic_write(
            self._checkpoint, json.dumps(doc, indent=1, sort_keys=True).encode(), mode=0o600
        )

"""NodePrepareResources / NodeUnprepareResources: claims -> transient CDI specs, checkpointed.

Each claim is planned (cdigen.plugin.dra.plan: no side effect), then applied: the side effects made
in order, each recorded in the two-phase checkpoint (cdigen.plugin.dra.checkpoint) before a crash
could strand it. Calls are serialized (one lock) and idempotent: preparing a prepared claim returns
what the first call returned, unpreparing an unknown claim is a success. A restarted plugin rolls
back the claims left half-prepared and finishes the unprepares begun; after a reboot (a new boot
ID) a claim that had MIG devices is prepared again at the kubelet's next call, as is one whose
spec is gone (a tmpfs CDI dir). A failed undo stays in the checkpoint, tried again at every call
and at start: never dropped.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from cdigen.cdi.capabilities import ordered_capabilities
from cdigen.cdi.driverfiles import DriverFiles
from cdigen.cdi.hostfs import HostFS
from cdigen.cdi.spec import SpecOptions
from cdigen.cdi.write import write_claim_spec
from cdigen.errors import CdigenError
from cdigen.fileio import atomic_write, remove_temp_files
from cdigen.model import Node
from cdigen.plugin.dra.checkpoint import (
    COMPLETED,
    STARTED,
    UNPREPARING,
    ClaimDoc,
    PreparedDeviceDoc,
    checkpoint_bytes,
    claim_spec_path,
    claim_spec_prefix,
    load_checkpoint,
    remove_spec,
    remove_unknown_spec,
    spec_present,
)
from cdigen.plugin.dra.claim_spec import ClaimSpecs, claim_capability_name
from cdigen.plugin.dra.claims import ClaimReader, ClaimRef, kind_of
from cdigen.plugin.dra.dynamic_mig import MadeMig, MigMaker
from cdigen.plugin.dra.mps import MpsSettings
from cdigen.plugin.dra.plan import ClaimPlan, device_doc, plan_claim
from cdigen.policies.device_view import DeviceView

log = logging.getLogger(__name__)

# A claim's error goes into the kubelet's pod events: one line, at most this long.
MAX_ERROR_CHARS = 300
NO_MIG_MAKER = "no NVML to destroy MIG devices with"


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
        boot_id: str | None = None,
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
        loaded = load_checkpoint(checkpoint, spec_dir=spec_dir, driver=driver)
        self._claims: dict[str, ClaimDoc] = loaded.claims
        self._boot_id = boot_id  # this boot's (/proc/sys/kernel/random/boot_id), if known
        self._unsaved = False  # the last save failed
        # what a kill -9 during a write left: only our own temp files, never another writer's
        remove_temp_files(spec_dir, lambda: log, f".{claim_spec_prefix(driver)}")
        remove_temp_files(checkpoint.parent, lambda: log, f".{checkpoint.name}.")
        with self._lock:
            if loaded.boot_id is not None and boot_id is not None and loaded.boot_id != boot_id:
                self._after_reboot()
            self._retry_undos()  # roll back the half-prepared, finish the half-unprepared

    def _after_reboot(self) -> None:
        """A reboot since the checkpoint was written took the MIG devices: claims that had some
        lose their spec (the kubelet's next prepare makes them again)."""
        for uid, doc in list(self._claims.items()):
            if not doc.get("migDevices") and not doc.get("placements"):
                continue
            doc["migDevices"], doc["placements"] = [], []
            if doc["state"] != COMPLETED:
                continue  # rolled back (its spec removed) by _retry_undos
            error = remove_spec(doc["specPath"]) if doc["specPath"] else ""
            log.warning(
                "claim %s/%s (%s): the node rebooted, its MIG devices are gone; prepared "
                "again at the kubelet's next call%s",
                doc["namespace"], doc["name"], uid, f" ({error})" if error else "",
            )  # fmt: skip
        self._save_quietly()

    def set_devices(self, node: Node, views: Sequence[DeviceView]) -> None:
        """A new layout: prepare from now on against these devices."""
        with self._lock:
            self._specs.node = node
            self._views = {v.name: v for v in views}

    def made_migs(self) -> frozenset[tuple[str, int]]:
        """The MIG devices made for prepared claims, as (GPU UUID, GPU instance ID)."""
        with self._lock:
            return self._made_migs()

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
            if done is not None and done["state"] == COMPLETED and spec_present(done):
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
            self._retry_undos(but=ref.uid)
            done = self._claims.get(ref.uid)
            if done is not None:
                if done["state"] == COMPLETED and spec_present(done):
                    return PrepareResult(tuple(done["devices"]))  # a concurrent duplicate call
                if done["state"] == COMPLETED:  # the CDI dir lost the spec (a tmpfs, a reboot)
                    log.warning(
                        "claim %s: its spec %s is gone; preparing it again",
                        ref.shown,
                        done["specPath"],
                    )
                error = self._undo(ref.uid, done)  # half-prepared, or unpreparing: undone first
                self._save_quietly()
                if error:
                    return PrepareResult(error=error)
            try:
                plan = plan_claim(
                    ref,
                    claim,
                    driver=self.driver,
                    pool=self.pool,
                    views=self._views,
                    specs=self._specs,
                    mps=self._mps,
                    held=self._claims,
                    can_make_migs=self._mig is not None,
                )
                return PrepareResult(tuple(self._apply(ref, plan)))
            except CdigenError as exc:
                log.warning("claim %s: %s", ref.shown, exc)
                return PrepareResult(error=str(exc))

    def _apply(self, ref: ClaimRef, plan: ClaimPlan) -> list[PreparedDeviceDoc]:
        """Carry out ``plan``: record it (PrepareStarted, with the placements it will make)
        before any side effect, make each MIG device and record it, write the spec, and record
        the claim as PrepareCompleted. A failure undoes what was made; an undo that fails too
        keeps the claim half-prepared in the checkpoint, tried again later, never dropped."""
        path = claim_spec_path(self._spec_dir, self.driver, ref.uid)
        doc: ClaimDoc = {
            "namespace": ref.namespace,
            "name": ref.name,
            "devices": [],
            "shareable": {r.device: r.shareable for r in plan.allocated},
            "specPath": str(path) if plan.views else "",
            "state": STARTED,
            "placements": list(plan.placements),
            "migDevices": [],
        }
        self._claims[ref.uid] = doc
        if plan.placements:  # MIG devices a crash could strand: the plan on disk first
            try:
                self._save()
            except CdigenError:  # nothing done yet, and nothing recorded: not prepared
                del self._claims[ref.uid]
                raise
        try:
            return self._carry_out(ref, plan, doc, path)
        except BaseException:
            error = self._undo(ref.uid, doc)
            if error:
                log.error("claim %s: undoing a prepare that failed: %s; kept in the checkpoint as "
                          "half-prepared, tried again at the next call and at start",
                          ref.shown, error)  # fmt: skip
            self._save_quietly()
            raise

    def _carry_out(
        self, ref: ClaimRef, plan: ClaimPlan, doc: ClaimDoc, path: Path
    ) -> list[PreparedDeviceDoc]:
        views = list(plan.views)
        made: list[MadeMig] = []
        for n, view in enumerate(views):
            if view.placement is None:
                continue
            assert self._mig is not None  # the plan refuses placements without it
            one = self._mig.create(view)
            made.append(one)
            # saved with the claim; a crash before leaves it where the saved plan's rollback looks
            doc.setdefault("migDevices", []).append(one.doc)
            views[n] = replace(view, entry=replace(view.entry, mig=one.mig))
        extra = plan.extra
        if views:
            asked = ordered_capabilities(c for caps in extra.values() for c in caps)
            spec = self._specs.build(
                ref, views, asked, plan.explicit, env=plan.env, mounts=plan.mounts, made=made
            )
            names = {d["name"] for d in spec["devices"]}
            extra = {
                request: tuple(c for c in caps if claim_capability_name(ref.uid, c) in names)
                for request, caps in extra.items()
            }
            # within: the (checked) UID makes one file name; the write is refused anywhere else
            write_claim_spec(spec, path, within=self._spec_dir)
        devices = [
            device_doc(self.driver, self.pool, ref.uid, r, extra.get(r.request, ()))
            for r in plan.allocated
        ]
        doc["devices"] = devices
        doc["state"] = COMPLETED
        self._save()
        shown = ", ".join(d["deviceName"] for d in devices) or "no devices of ours"
        log.info("prepared claim %s: %s", ref.shown, shown)
        return devices

    def _undo(self, uid: str, doc: ClaimDoc) -> str:
        """Undo what a claim holds: destroy the MIG devices recorded for it and those its plan
        may have made before it could record them, remove its spec, forget it (the caller
        saves). The first error, with the claim kept (what is already undone is recorded
        gone), or ""."""
        recorded = doc.setdefault("migDevices", [])
        while recorded:
            error = self._mig.destroy(recorded[0]) if self._mig else NO_MIG_MAKER
            if error:
                return error
            recorded.pop(0)
        if doc["state"] == STARTED:  # the plan may have made what it did not record
            keep = self._made_migs(but=uid)
            for at in doc.get("placements", []):
                if self._mig is None:
                    return NO_MIG_MAKER
                error = self._mig.destroy_at(at["gpuUUID"], at["start"], at["size"], keep)
                if error:
                    return error
            doc["placements"] = []
        error = remove_spec(doc["specPath"]) if doc["specPath"] else ""
        if error:
            return error
        del self._claims[uid]
        return ""

    def _made_migs(self, but: str = "") -> frozenset[tuple[str, int]]:
        """:meth:`made_migs` for a caller holding the lock, leaving out claim ``but``."""
        return frozenset(
            (m["gpuUUID"], m["gi"])
            for uid, claim in self._claims.items()
            if uid != but
            for m in claim.get("migDevices", [])
        )

    def _retry_undos(self, but: str = "") -> None:
        """Try again to undo the claims left half-prepared or half-unprepared (an undo that
        failed before); each failure logged, the claim kept."""
        pending = [
            (uid, doc)
            for uid, doc in self._claims.items()
            if doc["state"] != COMPLETED and uid != but
        ]
        for uid, doc in pending:
            error = self._undo(uid, doc)
            if error:
                log.error("claim %s/%s (%s): undo still fails: %s", doc["namespace"],
                          doc["name"], uid, error)  # fmt: skip
            else:
                log.info("claim %s/%s (%s): undone", doc["namespace"], doc["name"], uid)
        if pending:
            self._save_quietly()

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
            self._retry_undos(but=ref.uid)
            done = self._claims.get(ref.uid)
            if done is None:  # a spec a crash kept out of the checkpoint, or nothing
                return self._saved() or remove_unknown_spec(self._spec_dir, self.driver, ref.uid)
            if done["state"] == COMPLETED and done.get("migDevices"):
                done["state"] = UNPREPARING  # recorded before a MIG device is destroyed
                try:
                    self._save()
                except CdigenError as exc:
                    done["state"] = COMPLETED
                    return exc.message
            error = self._undo(ref.uid, done)
            try:
                self._save()
            except CdigenError as exc:
                return error or exc.message
            if error:
                return error
            log.info("unprepared claim %s", ref.shown)
            return ""

    def _saved(self) -> str:
        """ "" when the file holds what memory does, else a save's error (the kubelet retries
        an unprepare whose save failed: the claim is gone from memory, not yet from the file)."""
        try:
            if self._unsaved:
                self._save()
        except CdigenError as exc:
            return exc.message
        return ""

    def _save_quietly(self) -> None:
        """:meth:`_save`, a failure logged (the next save writes the same)."""
        try:
            self._save()
        except CdigenError as exc:
            log.error("cannot write the checkpoint: %s", exc)

    def _save(self) -> None:
        self._unsaved = True
        atomic_write(self._checkpoint, checkpoint_bytes(self._claims, self._boot_id), mode=0o600)
        self._unsaved = False

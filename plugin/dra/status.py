"""The device status of prepared claims (KEP-4817, ``ResourceClaim.status.devices``): for each
device the driver prepared, its data (UUID, PCI bus ID, CDI names) and a ``Ready`` condition, so
that ``kubectl get resourceclaim -o yaml`` says what the claim got. Removed again at unprepare.

Written by a background thread, so that prepare never waits for the API server: the kubelet
has its answer first, the status follows. Each write carries the claim's UID: a claim deleted,
or deleted and re-created under its name, before the write is left alone (one DEBUG line). A
server that refuses (no RBAC for ``resourceclaims/status``, or, from 1.36, for
``associated-node:patch`` on ``resourceclaims/driver``; an older API) is one WARNING per kind of
answer naming the permission, never a claim's error; a server without the
DRAResourceClaimDeviceStatus feature keeps the claim as it was.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from cdigen.errors import printable
from cdigen.plugin.agent.kubeapi import api_error

log = logging.getLogger(__name__)

READY = "Ready"


@runtime_checkable
class StatusApi(Protocol):
    """The one API call the writer needs (cdigen.plugin.dra.kube.KubeApi has it)."""

    def apply_claim_status(
        self,
        namespace: str,
        name: str,
        uid: str,
        devices: Sequence[Mapping[str, Any]],
        manager: str,
    ) -> None:
        """Apply ``status.devices`` as ``manager`` to the claim only while its UID is ``uid``."""
        ...


def device_status(
    driver: str, pool: str, device: str, data: Mapping[str, Any], when: float
) -> dict[str, Any]:
    """One ``status.devices`` entry: the device, its data and a Ready condition."""
    return {
        "driver": driver,
        "pool": pool,
        "device": device,
        "data": dict(data),
        "conditions": [
            {
                "type": READY,
                "status": "True",
                "reason": "Prepared",
                "message": f"prepared by {driver} on this node",
                "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when)),
            }
        ],
    }


class StatusWriter:
    """Writes and clears claims' device status in the background, in call order."""

    def __init__(
        self,
        api: StatusApi,
        *,
        driver: str,
        pool: str,
        device_data: Callable[[str], Mapping[str, Any]],
    ) -> None:
        self._api = api
        self._driver = driver
        self._pool = pool
        self._device_data = device_data
        self._queue: queue.Queue[tuple[str, str, str, list[dict[str, Any]]] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._said: set[str] = set()  # the kinds of refusal already logged

    def start(self) -> None:
        """Start the writer thread."""
        self._thread = threading.Thread(target=self._run, name="dra-status", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop after what is queued; waits at most half a second (SIGTERM stops the plugin
        within 2 s: a status still queued then is not written, it is informational)."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=0.5)
            self._thread = None

    def prepared(
        self, namespace: str, name: str, uid: str, devices: Sequence[Mapping[str, Any]]
    ) -> None:
        """Queue the status of the claim just prepared (``devices``: the prepare answer's)."""
        now = time.time()
        entries = [
            device_status(
                self._driver,
                str(d["poolName"]),
                str(d["deviceName"]),
                {
                    **self._device_data(str(d["deviceName"])),
                    "cdiDeviceIds": list(d["cdiDeviceIds"]),
                },
                now,
            )
            for d in devices
        ]
        self._queue.put((namespace, name, uid, entries))

    def unprepared(self, namespace: str, name: str, uid: str) -> None:
        """Queue the removal of this driver's entries from the claim's status."""
        self._queue.put((namespace, name, uid, []))

    def wait_idle(self, timeout_s: float) -> bool:
        """Block until everything queued has been tried (tests), or the timeout."""
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                self._write(*item)
            finally:
                self._queue.task_done()

    def _write(self, namespace: str, name: str, uid: str, entries: list[dict[str, Any]]) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self._api.apply_claim_status(namespace, name, uid, entries, self._driver)
        except ApiException as exc:
            causes = _causes(exc)
            if exc.status == 404 or (exc.status in (409, 422) and "metadata.uid" in causes):
                # gone with its pod, or re-created under the name: not the claim prepared
                log.debug(
                    "device status of claim %s/%s (UID %s) not written: %s",
                    printable(namespace),
                    printable(name),
                    printable(uid),
                    "the claim is gone" if exc.status == 404 else "the claim was replaced",
                )
                return
            if exc.status == 422 and "status.devices" in causes:
                hint = (
                    "give the plugin associated-node:patch on resourceclaims/driver for "
                    f"resourceNames [{self._driver}] (Kubernetes 1.36, "
                    "DRAResourceClaimGranularStatusAuthorization; deploy/dra/rbac.yaml)"
                )
            else:
                hint = _refusal_hint(exc.status)
            self._refused(f"HTTP {exc.status}", namespace, name, api_error(exc), hint)
        except Exception as exc:  # the API server may be away: the status is informational
            self._refused(type(exc).__name__, namespace, name, api_error(exc), _refusal_hint(None))

    def _refused(self, kind: str, namespace: str, name: str, why: str, hint: str) -> None:
        if kind in self._said:
            log.debug("device status of claim %s/%s not written: %s", namespace, name, why)
            return
        self._said.add(kind)
        log.warning(
            "device status of claim %s/%s not written (%s); claims are prepared all the same, "
            "and this is said once: %s",
            printable(namespace),
            printable(name),
            why,
            hint,
        )


def _refusal_hint(status: int | None) -> str:
    """What to do about a status write the API server refused with HTTP ``status``."""
    if status in (401, 403):
        return "give the plugin patch on resourceclaims/status (deploy/dra/rbac.yaml)"
    if status == 409:
        return "the claim changed meanwhile; its next prepare writes the status again"
    return "the API server may be away or overloaded; the next prepare writes the status again"


def _causes(exc: Any) -> set[str]:
    """The ``field`` of each cause in an API error's Status ``details`` (empty when none)."""
    try:
        doc = json.loads(exc.body or "")
    except (TypeError, ValueError):
        return set()
    details = doc.get("details") if isinstance(doc, dict) else None
    causes = details.get("causes") if isinstance(details, dict) else None
    if not isinstance(causes, list):
        return set()
    return {str(c.get("field")) for c in causes if isinstance(c, dict) and c.get("field")}

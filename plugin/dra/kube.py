"""The API server side of the DRA plugin: ResourceClaims read, ResourceSlices published.

Talks through the official ``kubernetes`` client (resource.k8s.io/v1) with plain dicts in and
out: the client's models are stricter than the API server, and the slices are built as dicts.
Slice bodies go through the client's lower-level ``ApiClient.call_api`` (its configuration, auth
and connection pool): the generated methods first validate a body against the client's pydantic
models and project it back, 90% of publishing 56 devices (benchmarks/bench_dra.py).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any, Protocol
from urllib.parse import quote

from plugin.agent.kubeapi import DEFAULT_API_TIMEOUT_S, ApiCallError, api_error
from plugin.dra.counters import build_counter_slices
from plugin.dra.slices import MemoryShares, TaintDoc, build_slices
from policies.device_view import DeviceView

log = logging.getLogger(__name__)


NONE_EFFECT_MINOR = 35  # the first Kubernetes 1.x whose API server takes taint effect None


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


class KubeApi:
    """:class:`SliceApi` and :class:`plugin.dra.claims.ClaimReader` over the kubernetes client,
    every call bounded by ``timeout_s`` (connect and read)."""

    SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"

    def __init__(self, api_client: Any, *, timeout_s: float = DEFAULT_API_TIMEOUT_S) -> None:
        from kubernetes import client

        self._client = api_client
        self.timeout_s = timeout_s
        self._resource = client.ResourceV1Api(api_client)
        self._core = client.CoreV1Api(api_client)
        self._minor: int | None = None

    @staticmethod
    def _json(response: Any) -> Any:
        return json.loads(response.data)

    def read_claim(self, namespace: str, name: str) -> dict[str, Any]:
        """The ResourceClaim ``namespace/name`` as a dict; :class:`ApiCallError` (one line)
        when the API server cannot give it."""
        try:
            response = self._resource.read_namespaced_resource_claim(
                name, namespace, _preload_content=False, _request_timeout=self.timeout_s
            )
        except Exception as exc:
            raise ApiCallError(api_error(exc)) from None
        try:
            claim = self._json(response)
        except ValueError:
            raise ApiCallError("API server answered with something that is not JSON") from None
        if not isinstance(claim, dict):
            raise ApiCallError("API server answered with JSON that is not an object") from None
        return claim

    def list_slices(self, driver: str, node_name: str) -> list[dict[str, Any]]:
        """This node's slices of ``driver``."""
        response = self._resource.list_resource_slice(
            field_selector=f"spec.driver={driver},spec.nodeName={node_name}",
            _preload_content=False,
            _request_timeout=self.timeout_s,
        )
        try:
            doc = self._json(response)
        except ValueError:
            raise ApiCallError("API server answered with something that is not JSON") from None
        items = doc.get("items") if isinstance(doc, dict) else None
        if not isinstance(items, list) or not all(
            isinstance(i, dict) and isinstance(i.get("metadata"), dict) for i in items
        ):
            raise ApiCallError("API server answered with something that is not a slice list")
        return items

    def create_slice(self, body: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """Create one slice; the stored object."""
        return self._send("POST", self.SLICES_PATH, body)

    def replace_slice(self, name: str, body: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """Replace one slice; the stored object."""
        return self._send("PUT", f"{self.SLICES_PATH}/{quote(name, safe='')}", body)

    def server_minor(self) -> int | None:
        """The API server's minor version (1.x), read once; None while it cannot be read."""
        if self._minor is None:
            from kubernetes import client

            try:
                response = client.VersionApi(self._client).get_code(
                    _preload_content=False, _request_timeout=self.timeout_s
                )
                minor = str(self._json(response).get("minor", ""))
                self._minor = int("".join(c for c in minor if c.isdigit()) or 0)
            except Exception as exc:  # unknown now: asked again at the next publish
                log.debug("cannot read the API server's version: %s", api_error(exc))
        return self._minor

    def apply_claim_status(
        self,
        namespace: str,
        name: str,
        uid: str,
        devices: Sequence[Mapping[str, Any]],
        manager: str,
    ) -> None:
        """Server-side apply of ``status.devices`` of the ResourceClaim ``namespace/name``
        whose UID is ``uid``, as field manager ``manager`` (the driver): the entries it applied
        before and not now go away, other drivers' stay. The UID in the applied object is the
        precondition: a claim re-created under the name has another UID, and the API server
        refuses the write (422, ``metadata.uid`` is immutable) instead of writing the old
        claim's devices onto it. An ApiException for a non-2xx answer."""
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "status": {"devices": [dict(d) for d in devices]},
        }
        path = (
            f"/apis/resource.k8s.io/v1/namespaces/{quote(namespace, safe='')}/resourceclaims/"
            f"{quote(name, safe='')}/status?fieldManager={quote(manager, safe='')}&force=true"
        )
        self._send("PATCH", path, body, content_type="application/apply-patch+yaml")

    def _send(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any],
        *,
        content_type: str = "application/json",
    ) -> Mapping[str, Any] | None:
        """``method path`` with the JSON ``body`` as it is, through the client's ApiClient (auth,
        TLS, pool); an ApiException for a non-2xx answer, as the generated methods raise."""
        from kubernetes.client.exceptions import ApiException

        headers = {"Accept": "application/json", "Content-Type": content_type}
        method, url, headers, _, _ = self._client.param_serialize(
            method=method, resource_path=path, header_params=headers, auth_settings=["BearerToken"]
        )
        response = self._client.call_api(
            method, url, header_params=headers, body=dict(body), _request_timeout=self.timeout_s
        )
        data = response.read()
        if not 200 <= response.status <= 299:
            raise ApiException.from_response(http_resp=response, body=None, data=None)
        try:
            stored = json.loads(data)
        except (TypeError, ValueError):
            return None
        return stored if isinstance(stored, dict) else None

    def delete_slice(self, name: str) -> None:
        """Delete one slice."""
        self._resource.delete_resource_slice(
            name, _preload_content=False, _request_timeout=self.timeout_s
        )

    def node_owner(self, node_name: str) -> dict[str, str] | None:
        """``{"name", "uid"}`` of the Node object, for owner references; None when the API
        server refuses (RBAC, no such Node); the error when it could not answer (retry)."""
        from kubernetes.client.exceptions import ApiException

        try:
            node = self._json(
                self._core.read_node(
                    node_name, _preload_content=False, _request_timeout=self.timeout_s
                )
            )
        except ApiException as exc:  # RBAC may not allow it: slices then live until deleted
            if exc.status is not None and exc.status >= 500:
                raise
            log.warning(
                "cannot read Node %s (%s): slices get no owner reference", node_name, api_error(exc)
            )
            return None
        uid = (node.get("metadata") or {}).get("uid")
        return {"name": node_name, "uid": uid} if uid else None


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
        self._said_none = False  # the warning about effect None, said once
        self._said_counters = False  # the error about dropped counters, said once

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
        minor = getattr(self._api, "server_minor", lambda: None)()
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

    def _informational_taints(
        self, taints: Mapping[str, Sequence[TaintDoc]]
    ) -> Mapping[str, Sequence[TaintDoc]]:
        """``taints``, less those of effect None where the server does not know that effect
        (said once)."""
        minor = getattr(self._api, "server_minor", lambda: None)()
        if minor is not None and minor >= NONE_EFFECT_MINOR:
            return taints
        if not self._said_none:
            self._said_none = True
            log.warning(
                "taints of effect None left out of the ResourceSlices: the API server is %s, "
                "and the effect needs Kubernetes 1.%d or newer",
                f"1.{minor}" if minor is not None else "of an unknown version",
                NONE_EFFECT_MINOR,
            )
        kept = {d: [t for t in ts if t["effect"] != "None"] for d, ts in taints.items()}
        return {d: ts for d, ts in kept.items() if ts}

    def delete_all(self) -> None:
        """Delete this node's slices (a clean shutdown, when configured to)."""
        self._written = {}
        for item in self._api.list_slices(self.driver, self.node_name):
            self._api.delete_slice(item["metadata"]["name"])

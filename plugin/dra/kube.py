"""The API server side of the DRA plugin: the client it reads ResourceClaims, Nodes and
DeviceClasses through and writes ResourceSlices and claim status with.

Talks through the official ``kubernetes`` client (resource.k8s.io/v1) with plain dicts in and
out: the client's models are stricter than the API server, and the slices are built as dicts.
Every call goes through the client's lower-level ``ApiClient.call_api`` (its configuration,
auth and connection pool; :func:`cdigen.plugin.agent.kubeapi.raw_call` says why not the
generated methods). What is published, and when, is :mod:`cdigen.plugin.dra.slice_publisher`'s.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

from cdigen.plugin.agent.kubeapi import (
    DEFAULT_API_TIMEOUT_S,
    ApiCallError,
    api_error,
    get_json,
    raw_call,
)

log = logging.getLogger(__name__)

RESOURCE_API = "/apis/resource.k8s.io/v1"  # ResourceSlices, ResourceClaims, DeviceClasses


class KubeApi:
    """:class:`cdigen.plugin.dra.slice_publisher.SliceApi` and
    :class:`cdigen.plugin.dra.claims.ClaimReader` over the kubernetes client, every call bounded by
    ``timeout_s`` (connect and read)."""

    SLICES_PATH = f"{RESOURCE_API}/resourceslices"

    def __init__(self, api_client: Any, *, timeout_s: float = DEFAULT_API_TIMEOUT_S) -> None:
        self._client = api_client
        self.timeout_s = timeout_s
        self._minor: int | None = None

    def _get(self, path: str) -> Any:
        """GET ``path``: the answer's body parsed; the client's error otherwise (a ValueError
        for a body that is not JSON)."""
        return get_json(self._client, path, timeout_s=self.timeout_s)

    def read_claim(self, namespace: str, name: str) -> dict[str, Any]:
        """The ResourceClaim ``namespace/name`` as a dict; :class:`ApiCallError` (one line)
        when the API server cannot give it."""
        path = (
            f"{RESOURCE_API}/namespaces/{quote(namespace, safe='')}/resourceclaims/"
            f"{quote(name, safe='')}"
        )
        try:
            claim = self._get(path)
        except ValueError:
            raise ApiCallError("API server answered with something that is not JSON") from None
        except Exception as exc:
            raise ApiCallError(api_error(exc)) from None
        if not isinstance(claim, dict):
            raise ApiCallError("API server answered with JSON that is not an object") from None
        return claim

    def list_slices(self, driver: str, node_name: str) -> list[dict[str, Any]]:
        """This node's slices of ``driver``."""
        selector = quote(f"spec.driver={driver},spec.nodeName={node_name}", safe="")
        try:
            doc = self._get(f"{self.SLICES_PATH}?fieldSelector={selector}")
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
            try:
                minor = str(self._get("/version").get("minor", ""))
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
            f"{RESOURCE_API}/namespaces/{quote(namespace, safe='')}/resourceclaims/"
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
        """``method path`` with the JSON ``body`` as it is; an ApiException for a non-2xx
        answer, as the generated methods raise."""
        response = raw_call(
            self._client, method, path, timeout_s=self.timeout_s, body=body,
            content_type=content_type,
        )  # fmt: skip
        try:
            stored = json.loads(response.data)
        except (TypeError, ValueError):
            return None
        return stored if isinstance(stored, dict) else None

    def delete_slice(self, name: str) -> None:
        """Delete one slice."""
        path = f"{self.SLICES_PATH}/{quote(name, safe='')}"
        raw_call(self._client, "DELETE", path, timeout_s=self.timeout_s)

    def read_node(self, node_name: str) -> dict[str, Any]:
        """The Node object (its status: what it advertises); the client's error otherwise."""
        doc = self._get(f"/api/v1/nodes/{quote(node_name, safe='')}")
        return doc if isinstance(doc, dict) else {}

    def list_device_classes(self) -> list[dict[str, Any]]:
        """Every DeviceClass; the client's error when they cannot be listed."""
        doc = self._get(f"{RESOURCE_API}/deviceclasses")
        items = doc.get("items") if isinstance(doc, dict) else None
        return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []

    def node_owner(self, node_name: str) -> dict[str, str] | None:
        """``{"name", "uid"}`` of the Node object, for owner references; None when the API
        server refuses (RBAC, no such Node); the error when it could not answer (retry)."""
        from kubernetes.client.exceptions import ApiException

        try:
            node = self._get(f"/api/v1/nodes/{quote(node_name, safe='')}")
        except ApiException as exc:  # RBAC may not allow it: slices then live until deleted
            if exc.status is not None and exc.status >= 500:
                raise
            log.warning(
                "cannot read Node %s (%s): slices get no owner reference", node_name, api_error(exc)
            )
            return None
        uid = (node.get("metadata") or {}).get("uid")
        return {"name": node_name, "uid": uid} if uid else None

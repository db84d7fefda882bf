"""A fake Kubernetes API server on loopback for the DRA plugin's tests.

It serves the few resource.k8s.io/v1 paths the plugin and ``dra why`` use (ResourceSlices: list
with field selectors, create, replace, delete; ResourceClaims: get, list in a namespace or in
all; DeviceClasses: get, list) and core/v1 Node and Pod get, stores objects in memory, and logs
every request. Faults on demand: ``hang`` a kind of request until
``release`` is set, ``fail`` a kind with an HTTP status, and delete or change slices behind the
plugin's back. The official kubernetes client talks to it through a
kubeconfig written by :meth:`FakeApiServer.kubeconfig`.
"""

from __future__ import annotations

import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}"
ALL_CLAIMS = "/apis/resource.k8s.io/v1/resourceclaims"
CLASSES = "/apis/resource.k8s.io/v1/deviceclasses"


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """Quiet about clients that gave up on a hung answer (their timeout is the test)."""
        import sys

        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


class FakeApiServer:
    """In-memory ResourceSlices, ResourceClaims and Nodes behind a real HTTP server."""

    def __init__(self) -> None:
        self.slices: dict[str, dict[str, Any]] = {}
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.nodes: dict[str, dict[str, Any]] = {}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.classes: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        # kinds: "slices", "claims", "claimstatus", "nodes", "pods", "classes"
        self.hang: set[str] = set()
        self.release = threading.Event()
        self.fail: dict[str, int] = {}
        self.version = ("1", "36")  # what /version answers
        # False: the DRAPartitionableDevices gate is off, and the counter fields are dropped
        self.partitionable = True
        # False: the DRADeviceTaints gate is off (alpha, off by default, before 1.36), and the
        # devices' taints are dropped
        self.device_taints = True
        # (namespace, claim) -> field manager -> the status.devices keys it applied
        self.status_owners: dict[tuple[str, str], dict[str, set[tuple[str, str, str]]]] = {}
        self._version = 0
        self._server = _Server(("127.0.0.1", 0), _handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> FakeApiServer:
        """Serve in a thread; returns self."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving."""
        self._server.shutdown()
        self._server.server_close()

    def kubeconfig(self, path: Path) -> Path:
        """A kubeconfig at ``path`` that points the kubernetes client here."""
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": "fake"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
            "current-context": "fake",
        }
        path.write_text(json.dumps(doc))
        return path

    def next_version(self) -> str:
        """A new resourceVersion."""
        self._version += 1
        return str(self._version)

    def delete_slices(self, node_name: str | None = None) -> list[str]:
        """Delete slices (``node_name``'s, or all) as someone else would; their names."""
        with self.lock:
            gone = [
                n
                for n, s in self.slices.items()
                if node_name is None or s.get("spec", {}).get("nodeName") == node_name
            ]
            for name in gone:
                del self.slices[name]
        return gone

    def change_slice(self, name: str, spec: dict[str, Any]) -> None:
        """Replace a slice's spec as someone else would (a new resourceVersion)."""
        with self.lock:
            self.slices[name] = {**self.slices[name], "spec": spec}
            self.slices[name]["metadata"] = {
                **self.slices[name]["metadata"],
                "resourceVersion": self.next_version(),
            }

    def add_claim(self, claim: dict[str, Any]) -> None:
        """Store a ResourceClaim (as the scheduler would have allocated it)."""
        meta = claim["metadata"]
        with self.lock:
            self.claims[(meta["namespace"], meta["name"])] = claim

    def add_pod(self, pod: dict[str, Any]) -> None:
        """Store a Pod (``metadata.namespace`` defaults to ``default``)."""
        meta = pod["metadata"]
        with self.lock:
            self.pods[(meta.get("namespace", "default"), meta["name"])] = pod

    def add_class(self, device_class: dict[str, Any]) -> None:
        """Store a DeviceClass."""
        with self.lock:
            self.classes[device_class["metadata"]["name"]] = device_class


def _list(kind: str, items: list[dict[str, Any]]) -> dict[str, Any]:
    """A list answer as the API server shapes it: ``<Kind>List``, and items without their own
    kind and apiVersion."""
    version = "v1" if kind == "Pod" else "resource.k8s.io/v1"
    bare = [{k: v for k, v in i.items() if k not in ("kind", "apiVersion")} for i in items]
    return {"kind": f"{kind}List", "apiVersion": version, "metadata": {}, "items": bare}


def _gated(api: FakeApiServer, body: dict[str, Any]) -> dict[str, Any]:
    """``body`` as stored: without the counter fields while the partitionable gate is off, and
    without the devices' taints while the device taints gate is off."""
    if not api.partitionable:
        body["spec"].pop("sharedCounters", None)
        for device in body["spec"].get("devices") or []:
            device.pop("consumesCounters", None)
    if not api.device_taints:
        for device in body["spec"].get("devices") or []:
            device.pop("taints", None)
    return body


def _invalid_slice(body: dict[str, Any]) -> str:
    """The API server's refusal of a slice's device capacities (their request policies), as
    one message, or ""."""
    from tests.helpers.slice_rules import capacity_problems

    problems = [
        f"spec.devices[{n}]: {p}"
        for n, device in enumerate(body.get("spec", {}).get("devices") or [])
        for p in capacity_problems(device)
    ]
    return "; ".join(problems)


def _matches(obj: dict[str, Any], selector: str) -> bool:
    for term in filter(None, selector.split(",")):
        field, _, value = term.partition("=")
        current: Any = obj
        for part in field.split("."):
            current = current.get(part) if isinstance(current, dict) else None
        if current != value:
            return False
    return True


def _handler(api: FakeApiServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            return

        def _send(self, code: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _status(self, code: int, reason: str, message: str) -> None:
            self._send(
                code,
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Failure",
                    "reason": reason,
                    "message": message,
                    "code": code,
                },
            )

        def _body(self) -> dict[str, Any]:
            length = int(self.headers.get("Content-Length") or 0)
            doc: dict[str, Any] = json.loads(self.rfile.read(length) or b"{}")
            return doc

        def _route(self, method: str) -> None:
            url = urlparse(self.path)
            path = url.path.rstrip("/")
            with api.lock:
                api.requests.append((method, self.path))
            parts = path.split("/")
            kind = (
                "nodes"
                if path.startswith("/api/v1/nodes")
                else "pods"
                if path.startswith("/api/v1/namespaces/")
                else "classes"
                if path.startswith(CLASSES)
                else "slices"
                if path.startswith(SLICES)
                else "claimstatus"
                if path.endswith("/status")
                else "claims"
            )
            if kind in api.hang:
                api.release.wait(60)
            code = api.fail.get(kind)
            if code:
                return self._status(code, "InternalError", f"injected failure for {kind}")
            if path == SLICES and method == "GET":
                selector = parse_qs(url.query).get("fieldSelector", [""])[0]
                with api.lock:
                    items = [s for s in api.slices.values() if _matches(s, selector)]
                self._send(200, {"kind": "ResourceSliceList", "apiVersion": "resource.k8s.io/v1",
                                 "metadata": {}, "items": items})  # fmt: skip
            elif path == SLICES and method == "POST":
                body = self._body()
                if _invalid_slice(body):
                    return self._status(422, "Invalid", _invalid_slice(body))
                name = body["metadata"]["name"]
                with api.lock:
                    if name in api.slices:
                        return self._status(409, "AlreadyExists", f"{name} already exists")
                    body["metadata"]["uid"] = str(uuid.uuid4())
                    body["metadata"]["resourceVersion"] = api.next_version()
                    api.slices[name] = _gated(api, body)
                self._send(201, body)
            elif path.startswith(SLICES + "/") and method in ("PUT", "DELETE"):
                name = parts[-1]
                with api.lock:
                    if name not in api.slices:
                        return self._status(404, "NotFound", f"{name} not found")
                    if method == "DELETE":
                        gone = api.slices.pop(name)
                        return self._send(200, gone)
                    body = self._body()
                    if _invalid_slice(body):
                        return self._status(422, "Invalid", _invalid_slice(body))
                    sent = body["metadata"].get("resourceVersion")
                    held = api.slices[name]["metadata"]["resourceVersion"]
                    if sent and sent != held:
                        return self._status(409, "Conflict", "the object has been modified")
                    body["metadata"]["uid"] = api.slices[name]["metadata"]["uid"]
                    body["metadata"]["resourceVersion"] = api.next_version()
                    api.slices[name] = _gated(api, body)
                self._send(200, body)
            elif method == "GET" and path == ALL_CLAIMS:
                with api.lock:
                    items = list(api.claims.values())
                self._send(200, _list("ResourceClaim", items))
            elif (
                method == "GET"
                and len(parts) == 7
                and parts[:5] == ["", "apis", "resource.k8s.io", "v1", "namespaces"]
                and parts[6] == "resourceclaims"
            ):
                with api.lock:
                    items = [c for (ns, _), c in api.claims.items() if ns == parts[5]]
                self._send(200, _list("ResourceClaim", items))
            elif method == "GET" and path == CLASSES:
                with api.lock:
                    items = list(api.classes.values())
                self._send(200, _list("DeviceClass", items))
            elif method == "GET" and path.startswith(CLASSES + "/") and len(parts) == 6:
                with api.lock:
                    found = api.classes.get(parts[5])
                if found is None:
                    return self._status(404, "NotFound", f'deviceclasses "{parts[5]}" not found')
                self._send(200, found)
            elif (
                method == "GET"
                and len(parts) == 7
                and parts[:4] == ["", "api", "v1", "namespaces"]
                and parts[5] == "pods"
            ):
                with api.lock:
                    pod = api.pods.get((parts[4], parts[6]))
                if pod is None:
                    return self._status(404, "NotFound", f'pods "{parts[6]}" not found')
                self._send(200, pod)
            elif (
                method == "GET"
                and len(parts) == 8
                and parts[:5] == ["", "apis", "resource.k8s.io", "v1", "namespaces"]
                and parts[6] == "resourceclaims"
            ):
                with api.lock:
                    claim = api.claims.get((parts[5], parts[7]))
                if claim is None:
                    return self._status(404, "NotFound", f"resourceclaims {parts[7]} not found")
                self._send(200, claim)
            elif (
                method == "PATCH"
                and len(parts) == 9
                and parts[6] == "resourceclaims"
                and parts[8] == "status"
            ):
                # server-side apply of status.devices, as the API server does it for one field
                # manager: what it applied before and not now goes, other managers' entries stay
                if "apply-patch" not in (self.headers.get("Content-Type") or ""):
                    return self._status(415, "UnsupportedMediaType", "apply patches only")
                manager = parse_qs(url.query).get("fieldManager", [""])[0]
                devices = (self._body().get("status") or {}).get("devices") or []
                key = (parts[5], parts[7])
                with api.lock:
                    claim = api.claims.get(key)
                    if claim is None:
                        return self._status(404, "NotFound", f"resourceclaims {parts[7]} not found")
                    owned = api.status_owners.setdefault(key, {})
                    mine = {(d["driver"], d["pool"], d["device"]) for d in devices}
                    before = owned.get(manager, set())
                    status = claim.setdefault("status", {})
                    kept = [
                        d
                        for d in status.get("devices") or []
                        if (d["driver"], d["pool"], d["device"]) not in before | mine
                    ]
                    status["devices"] = kept + devices
                    if not status["devices"]:
                        status.pop("devices")
                    owned[manager] = mine
                self._send(200, claim)
            elif method == "GET" and path == "/version":
                major, minor = api.version
                self._send(
                    200, {"major": major, "minor": minor, "gitVersion": f"v{major}.{minor}.0"}
                )
            elif method == "GET" and path.startswith("/api/v1/nodes/"):
                with api.lock:
                    node = api.nodes.get(parts[-1])
                if node is None:
                    return self._status(404, "NotFound", f"nodes {parts[-1]} not found")
                self._send(200, node)
            else:
                self._status(404, "NotFound", f"{method} {path} is not served by the fake")
            return None

        def do_GET(self) -> None:
            self._route("GET")

        def do_POST(self) -> None:
            self._route("POST")

        def do_PUT(self) -> None:
            self._route("PUT")

        def do_DELETE(self) -> None:
            self._route("DELETE")

        def do_PATCH(self) -> None:
            self._route("PATCH")

    return Handler


def allocated_claim(
    name: str, uid: str, results: list[dict[str, Any]], namespace: str = "default"
) -> dict[str, Any]:
    """A ResourceClaim as the scheduler leaves it after allocation."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]}},
        "status": {"allocation": {"devices": {"results": results}}},
    }

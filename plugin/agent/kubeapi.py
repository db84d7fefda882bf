"""Talking to the API server: a client from a kubeconfig or the in-cluster config, and API
failures as one bounded line. Shared by the DRA plugin and the device plugin's per-node
configs (which read their Node's labels).

Every call's timeout (``_request_timeout``, else :data:`DEFAULT_API_TIMEOUT_S`) is a deadline for
the whole call: connecting, sending, the headers and the whole body. urllib3 bounds each read
only, so a server that trickles a byte at a time could hold a call for ever; here a timer shuts
the call's socket down when the deadline passes and the call fails with
:class:`DeadlineExceeded`. Callers keep their signatures: the client does it."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
from collections.abc import Callable, Mapping
from typing import Any

from cdigen.errors import InputError, printable

__all__ = [
    "DEFAULT_API_TIMEOUT_S",
    "ApiCallError",
    "DeadlineExceeded",
    "api_client",
    "api_error",
]

DEFAULT_API_TIMEOUT_S = 5.0
_ERROR_MAX = 300


def api_error(exc: BaseException) -> str:
    """One bounded line for an API call's failure: the HTTP status and the Status reason and
    message for an answer, the cause for a connection that failed (never headers or body)."""
    from kubernetes.client.exceptions import ApiException

    if isinstance(exc, (ApiCallError, DeadlineExceeded)):
        return str(exc)
    if isinstance(exc, ApiException):
        reason, message = exc.reason or "", ""
        try:
            doc = json.loads(exc.body or "")
        except (TypeError, ValueError):
            doc = None
        if isinstance(doc, dict):
            reason = str(doc.get("reason") or reason)
            message = str(doc.get("message") or "")
        text = f"API server answered {exc.status} {reason}" + (f": {message}" if message else "")
    else:
        cause: BaseException = exc
        reason_attr = getattr(exc, "reason", None)  # urllib3's MaxRetryError wraps the cause
        if isinstance(reason_attr, BaseException):
            cause = reason_attr
        detail = str(cause).split("\n", 1)[0]
        if ">: " in detail:  # urllib3 prefixes '<connection object at 0x...>: '
            detail = detail.split(">: ", 1)[1]
        detail = re.sub(r"\(read timeout=[\d.]+\)", "(no answer in time)", detail)
        text = f"API server unreachable: {type(cause).__name__}: {detail}"
    text = printable(" ".join(text.split()))  # the server's message may quote a hostile name
    return text if len(text) <= _ERROR_MAX else text[: _ERROR_MAX - 3] + "..."


class ApiCallError(Exception):
    """An API call failed; the message is one bounded line (:func:`api_error`)."""


class DeadlineExceeded(Exception):
    """An API call did not finish, body included, within its deadline."""


_calls = threading.local()  # the deadline of the call this thread is making


class _Deadline:
    """One call's deadline: the connection it uses, shut down if the time runs out."""

    def __init__(self) -> None:
        self.connection: Any = None
        self.fired = False

    def fire(self) -> None:
        self.fired = True
        sock = getattr(self.connection, "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # a blocked read returns at once


def _tracked(base: Any) -> type:
    """``base`` (a urllib3 connection class) telling the current call's deadline which
    connection it sends on."""

    def request(self: Any, *args: Any, **kwargs: Any) -> Any:
        deadline = getattr(_calls, "deadline", None)
        if deadline is not None:
            deadline.connection = self
        return base.request(self, *args, **kwargs)

    return type(f"Deadline{base.__name__}", (base,), {"request": request})


def _seconds(timeout: Any) -> float:
    """The whole-call deadline a kubernetes-client timeout asks for."""
    total = getattr(timeout, "total", None)
    if isinstance(total, (int, float)) and total > 0:
        return float(total)
    read = getattr(timeout, "read_timeout", None)  # a (connect, read) pair: their sum
    connect = getattr(timeout, "connect_timeout", None)
    if isinstance(read, (int, float)) and isinstance(connect, (int, float)):
        return float(read) + float(connect)
    if isinstance(timeout, (int, float)) and timeout > 0:
        return float(timeout)
    return DEFAULT_API_TIMEOUT_S


class _DeadlinePoolManager:
    """The client's urllib3 pool manager, each request bounded as a whole (see the module)."""

    def __init__(self, pool_manager: Any) -> None:
        from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

        http = type(
            "DeadlineHTTPPool",
            (HTTPConnectionPool,),
            {"ConnectionCls": _tracked(HTTPConnectionPool.ConnectionCls)},
        )
        https = type(
            "DeadlineHTTPSPool",
            (HTTPSConnectionPool,),
            {"ConnectionCls": _tracked(HTTPSConnectionPool.ConnectionCls)},
        )
        pool_manager.pool_classes_by_scheme = {"http": http, "https": https}
        self._pool_manager = pool_manager

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool_manager, name)

    def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        seconds = _seconds(kwargs.get("timeout"))
        kwargs["preload_content"] = True  # the body is read here, under the deadline
        deadline = _Deadline()
        timer = threading.Timer(seconds, deadline.fire)
        timer.daemon = True
        _calls.deadline = deadline
        timer.start()
        try:
            response = self._pool_manager.request(method, url, *args, **kwargs)
        except Exception:
            if deadline.fired:
                raise DeadlineExceeded(
                    f"API server unreachable: timed out: no whole answer within {seconds:g} s"
                ) from None
            raise
        finally:
            timer.cancel()
            _calls.deadline = None
        if deadline.fired:  # a body cut short by the shutdown: not an answer
            raise DeadlineExceeded(
                f"API server unreachable: timed out: no whole answer within {seconds:g} s"
            )
        return response


def _readable_kubeconfig(path: str) -> None:
    """One-line InputError unless ``path`` is a regular, bounded, UTF-8 YAML mapping: the
    kubernetes library would block on a FIFO, read /dev/zero forever, or raise a TypeError on
    a list."""
    from cdigen.fileio import not_a_mapping, parse_document, read_text

    where = f"--kubeconfig: {path}"
    try:
        doc = parse_document(read_text(path, what="kubeconfig"), where=path)
    except InputError as exc:
        raise InputError(str(exc), where="--kubeconfig") from None
    if not isinstance(doc, dict):
        raise InputError(
            f"not a kubeconfig ({not_a_mapping(doc)})",
            where=where,
            hint="pass a kubeconfig file (apiVersion: v1, kind: Config), or leave "
            "--kubeconfig out in a pod",
        )


def api_client(kubeconfig: str | None) -> Any:
    """A kubernetes ApiClient: from ``kubeconfig`` when given, else the in-cluster config;
    InputError naming the file (or the in-cluster config) when it cannot be used."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    configuration = client.Configuration()
    if kubeconfig:
        _readable_kubeconfig(kubeconfig)
    try:
        if kubeconfig:
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, client_configuration=configuration
            )
        else:
            config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration
            )
    except (ConfigException, OSError, ValueError, TypeError, AttributeError, KeyError) as exc:
        # malformed structure (contexts: 5) surfaces from the library as a TypeError & co.
        if kubeconfig:
            raise InputError(
                f"cannot use it: {str(exc).rstrip('.')}",
                where=f"--kubeconfig: {kubeconfig}",
                hint="pass a readable kubeconfig file, or leave --kubeconfig out in a pod",
            ) from None
        raise InputError(
            f"no in-cluster config: {str(exc).rstrip('.')}",
            where="--kubeconfig",
            hint="outside a pod, pass --kubeconfig FILE",
        ) from None
    # one try per call: the caller retries with its own backoff, and a hung API server costs one
    # --api-timeout, not four (urllib3 retries three times by default, logging each)
    configuration.retries = 0
    api = client.ApiClient(configuration)
    rest: Any = api.rest_client
    rest.pool_manager = _DeadlinePoolManager(rest.pool_manager)
    return api


def raw_call(
    api_client: Any,
    method: str,
    path: str,
    *,
    timeout_s: float,
    body: Mapping[str, Any] | None = None,
    content_type: str = "application/json",
) -> Any:
    """``method path`` (path and query already quoted) through ``api_client``'s configuration,
    auth and connection pool; the urllib3 response (``.data`` is the body), or the ApiException
    the client's generated methods raise for a non-2xx answer. Why not those methods: importing
    one of the client's API classes imports the models its methods name (``CoreV1Api``: Pod,
    PersistentVolume and more, about 0.45 s of CPU), which came before both plugins' kubelet
    registration; and they validate a body against the models and project it back, 90 % of
    publishing 56 devices (benchmarks/bench_dra.py)."""
    from kubernetes.client.exceptions import ApiException

    headers = {"Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = content_type
    method, url, headers, _, _ = api_client.param_serialize(
        method=method, resource_path=path, header_params=headers, auth_settings=["BearerToken"]
    )
    response = api_client.call_api(
        method,
        url,
        header_params=headers,
        body=None if body is None else dict(body),
        _request_timeout=timeout_s,
    )
    response.read()
    if not 200 <= response.status <= 299:
        raise ApiException.from_response(http_resp=response, body=None, data=None)
    return response.response


def get_json(
    api_client: Any, path: str, *, timeout_s: float, loads: Callable[[bytes], Any] = json.loads
) -> Any:
    """GET ``path`` (:func:`raw_call`) and its body parsed by ``loads``: the client's error for
    a failed call, a ValueError for a body that is not JSON."""
    return loads(raw_call(api_client, "GET", path, timeout_s=timeout_s).data)

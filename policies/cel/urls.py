"""Kubernetes' URL library for CEL: ``url()``, ``isURL()`` and the ``getScheme()``,
``getHost()``, ``getHostname()``, ``getPort()``, ``getEscapedPath()``, ``getQuery()`` of a URL.

As Kubernetes reads them: an absolute URL (``https://host:8443/p?q=1``) or an absolute path
(``/p``); a relative reference (``example.com/p``) or a string with blanks or control characters
is not a URL.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

from celpy import celtypes

from cdigen.policies.cel.call_args import function_error

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*$")


class Url:
    """One parsed URL (a CEL value of type ``kubernetes.URL``)."""

    __slots__ = ("parts", "text")
    cel_type_name = "kubernetes.URL"  # read by errors.type_name

    def __init__(self, text: str) -> None:
        self.text = text
        self.parts = urlsplit(text)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Url) and self.text == other.text

    def __hash__(self) -> int:
        return hash(self.text)

    def __repr__(self) -> str:
        return f"url({self.text!r})"


def url_problem(text: str) -> str | None:
    """Why ``text`` is not a URL Kubernetes' ``url()`` accepts, or None."""
    if not text:
        return "empty url"
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in text):
        return "invalid character in URL"
    if text.startswith("/"):
        return None
    scheme, colon, _ = text.partition(":")
    if not colon or not scheme:
        return "invalid URI for request"
    if not _SCHEME.match(scheme):
        return "first path segment in URL cannot contain colon"
    return None


def cel_url(text: Any) -> Any:
    if not isinstance(text, str):
        return function_error("no such overload: url applied to a non-string")
    problem = url_problem(str(text))
    if problem is not None:
        return function_error(
            f'URL parse error during conversion from string: parse "{text}": {problem}'
        )
    return Url(str(text))


def cel_is_url(text: Any) -> Any:
    if not isinstance(text, str):
        return function_error("no such overload: isURL applied to a non-string")
    return celtypes.BoolType(url_problem(str(text)) is None)


def _part(name: str, read: Any) -> Any:
    def get(value: Any) -> Any:
        if not isinstance(value, Url):
            return function_error(f"no such overload: {name} applied to a non-URL")
        return read(value.parts)

    return get


def _hostname(parts: Any) -> Any:
    host = parts.netloc.rpartition("@")[2]
    if host.startswith("["):
        return celtypes.StringType(host[1 : host.find("]")])
    return celtypes.StringType(host.rpartition(":")[0] if ":" in host else host)


def _port(parts: Any) -> Any:
    host = parts.netloc.rpartition("@")[2]
    tail = host[host.find("]") + 1 :] if host.startswith("[") else host
    return celtypes.StringType(tail.rpartition(":")[2] if ":" in tail else "")


def _query(parts: Any) -> Any:
    found = parse_qs(parts.query, keep_blank_values=True)
    return celtypes.MapType(
        {
            celtypes.StringType(k): celtypes.ListType([celtypes.StringType(v) for v in vs])
            for k, vs in found.items()
        }
    )


URL_FUNCTIONS: dict[str, Any] = {
    "url": cel_url,
    "isURL": cel_is_url,
    "getScheme": _part("getScheme", lambda p: celtypes.StringType(p.scheme)),
    "getHost": _part("getHost", lambda p: celtypes.StringType(p.netloc.rpartition("@")[2])),
    "getHostname": _part("getHostname", _hostname),
    "getPort": _part("getPort", _port),
    "getEscapedPath": _part(
        "getEscapedPath",
        lambda p: celtypes.StringType(quote(unquote(p.path), safe="/:@!$&'()*+,;=-._~")),
    ),
    "getQuery": _part("getQuery", _query),
}

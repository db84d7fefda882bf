"""Kubernetes' format library for CEL: ``format.dns1123Label()`` and the other named formats,
``format.named("dns1123Label")`` (an optional), and ``<format>.validate(s)``: none when ``s``
is valid, else the list of what is wrong (Kubernetes' validation messages)."""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable
from datetime import date, datetime
from typing import Any

from celpy import celtypes

from cdigen.policies.cel.call_args import function_error
from cdigen.policies.cel.optional import NONE, Optional
from cdigen.policies.cel.urls import url_problem

_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_LABEL_1035 = "[a-z]([-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN = rf"{_LABEL}(\.{_LABEL})*"
_NAME = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")


def _full(pattern: str, text: str) -> bool:
    return re.fullmatch(pattern, text) is not None


def _dns_label(text: str, pattern: str = _LABEL, kind: str = "RFC 1123") -> list[str]:
    problems = []
    if len(text) > 63:
        problems.append("must be no more than 63 characters")
    if not _full(pattern, text):
        start = (
            "start with an alphabetic character"
            if kind == "RFC 1035"
            else ("start and end with an alphanumeric character")
        )
        problems.append(
            f"a lowercase {kind} label must consist of lower case alphanumeric characters or "
            f"'-', and must {start} (regex used for validation is '{pattern}')"
        )
    return problems


def _dns_subdomain(text: str) -> list[str]:
    problems = []
    if len(text) > 253:
        problems.append("must be no more than 253 characters")
    if not _full(_SUBDOMAIN, text):
        problems.append(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
            "'-' or '.', and must start and end with an alphanumeric character (regex used for "
            f"validation is '{_SUBDOMAIN}')"
        )
    return problems


def _name_part(text: str) -> list[str]:
    problems = []
    if not text:
        problems.append("name part must be non-empty")
    elif len(text) > 63:
        problems.append("name part must be no more than 63 characters")
    if text and not _full(_NAME, text):
        problems.append(
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must start "
            f"and end with an alphanumeric character (regex used for validation is '{_NAME}')"
        )
    return problems


def _qualified_name(text: str) -> list[str]:
    parts = text.split("/")
    if len(parts) == 1:
        return _name_part(parts[0])
    if len(parts) == 2:
        prefix = (
            ["prefix part " + p for p in _dns_subdomain(parts[0])]
            if parts[0]
            else ["prefix part must be non-empty"]
        )
        return prefix + _name_part(parts[1])
    return [
        "a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must "
        "start and end with an alphanumeric character, with an optional DNS subdomain prefix "
        "and '/'"
    ]


def _label_value(text: str) -> list[str]:
    problems = []
    if len(text) > 63:
        problems.append("must be no more than 63 characters")
    if text and not _full(_NAME, text):
        problems.append(
            "a valid label must be an empty string or consist of alphanumeric characters, '-', "
            "'_' or '.', and must start and end with an alphanumeric character (regex used for "
            f"validation is '({_NAME})?')"
        )
    return problems


def _prefix(check: Callable[[str], list[str]]) -> Callable[[str], list[str]]:
    """A generateName prefix: a trailing '-' is allowed."""
    return lambda text: check(text[:-1] + "a" if text.endswith("-") else text)


def _uri(text: str) -> list[str]:
    problem = url_problem(text)
    return [] if problem is None else [f"invalid URI: {problem}"]


def _uuid(text: str) -> list[str]:
    return [] if _UUID.match(text) else ["does not match the UUID format"]


def _byte(text: str) -> list[str]:
    try:
        base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return ["invalid base64"]
    return []


def _date(text: str) -> list[str]:
    try:
        date.fromisoformat(text)
    except ValueError:
        return ["invalid date"]
    return [] if len(text) == 10 else ["invalid date"]


def _datetime(text: str) -> list[str]:
    try:
        datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return ["invalid datetime"]
    return [] if "T" in text.upper() else ["invalid datetime"]


FORMATS: dict[str, Callable[[str], list[str]]] = {
    "dns1123Label": _dns_label,
    "dns1123Subdomain": _dns_subdomain,
    "dns1035Label": lambda t: _dns_label(t, _LABEL_1035, "RFC 1035"),
    "qualifiedName": _qualified_name,
    "dns1123LabelPrefix": _prefix(_dns_label),
    "dns1123SubdomainPrefix": _prefix(_dns_subdomain),
    "dns1035LabelPrefix": _prefix(lambda t: _dns_label(t, _LABEL_1035, "RFC 1035")),
    "labelValue": _label_value,
    "uri": _uri,
    "uuid": _uuid,
    "byte": _byte,
    "date": _date,
    "datetime": _datetime,
}


class NamedFormat:
    """A CEL ``kubernetes.NamedFormat``."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NamedFormat) and self.name == other.name

    def __hash__(self) -> int:
        return hash(self.name)


def _validate(fmt: Any, text: Any) -> Any:
    if not (isinstance(fmt, NamedFormat) and isinstance(text, str)):
        return function_error("no such overload: validate")
    problems = FORMATS[fmt.name](str(text))
    if not problems:
        return NONE
    return Optional(celtypes.ListType([celtypes.StringType(p) for p in problems]))


def _named(name: Any) -> Any:
    if not isinstance(name, str):
        return function_error("no such overload: format.named")
    return Optional(NamedFormat(str(name))) if name in FORMATS else NONE


FORMAT_FUNCTIONS: dict[str, Any] = {
    **{f"format.{name}": (lambda n=name: NamedFormat(n)) for name in FORMATS},
    "format.named": _named,
    "validate": _validate,
}

"""Kubernetes' IP and CIDR libraries for CEL: ``ip()``, ``isIP()``, ``ip.isCanonical()``,
``cidr()``, ``isCIDR()`` and the methods of their values, with Go's meaning of the address
classes (``isGlobalUnicast`` is true for private addresses too)."""

from __future__ import annotations

import ipaddress
from typing import Any

from celpy import celtypes
from celpy.evaluation import CELEvalError

from cdigen.policies.cel.call_args import all_strings, function_error

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class Ip:
    """A CEL ``net.IP``."""

    __slots__ = ("address",)

    def __init__(self, address: Address) -> None:
        self.address = address

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Ip) and self.address == other.address

    def __hash__(self) -> int:
        return hash(self.address)

    def __str__(self) -> str:
        return str(self.address)


class Cidr:
    """A CEL ``net.CIDR``: an address and a prefix length (the address need not be masked)."""

    __slots__ = ("address", "network")

    def __init__(self, address: Address, network: Network) -> None:
        self.address = address
        self.network = network

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Cidr) and (self.address, self.network) == (
            other.address,
            other.network,
        )

    def __hash__(self) -> int:
        return hash((self.address, self.network))

    def __str__(self) -> str:
        return f"{self.address}/{self.network.prefixlen}"


def _address(text: str) -> Address | str:
    """The address of ``text``, or why Kubernetes' ip() refuses it."""
    if "%" in text:
        return "IP address with zone value is not allowed"
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return f"IP Address {text!r} parse error during conversion from string"
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return "IPv4-mapped IPv6 address is not allowed"
    return address


def _network(text: str) -> Cidr | str:
    address_text, slash, prefix = text.partition("/")
    address = _address(address_text)
    if isinstance(address, str) or not slash or not prefix.isdigit():
        return f"network address parse error during conversion from string: {text!r}"
    try:
        network = ipaddress.ip_network(f"{address}/{prefix}", strict=False)
    except ValueError:
        return f"network address parse error during conversion from string: {text!r}"
    return Cidr(address, network)


def cel_ip(value: Any) -> Any:
    if isinstance(value, Cidr):  # cidr.ip()
        return Ip(value.address)
    if not all_strings(value):
        return function_error("no such overload: ip")
    address = _address(str(value))
    return function_error(address) if isinstance(address, str) else Ip(address)


def cel_is_ip(value: Any) -> Any:
    if not all_strings(value):
        return function_error("no such overload: isIP")
    return celtypes.BoolType(not isinstance(_address(str(value)), str))


def cel_is_canonical(value: Any) -> Any:
    if not all_strings(value):
        return function_error("no such overload: ip.isCanonical")
    address = _address(str(value))
    if isinstance(address, str):
        return function_error(address)
    return celtypes.BoolType(str(address) == str(value))


def cel_cidr(value: Any) -> Any:
    if not all_strings(value):
        return function_error("no such overload: cidr")
    found = _network(str(value))
    return function_error(found) if isinstance(found, str) else found


def cel_is_cidr(value: Any) -> Any:
    if not all_strings(value):
        return function_error("no such overload: isCIDR")
    return celtypes.BoolType(not isinstance(_network(str(value)), str))


def _ip_method(name: str, test: Any) -> Any:
    def apply(value: Any) -> Any:
        if not isinstance(value, Ip):
            return function_error(f"no such overload: {name}")
        return test(value.address)

    return apply


_BROADCAST = ipaddress.IPv4Address("255.255.255.255")
_LINK_LOCAL_MULTICAST = {
    4: ipaddress.ip_network("224.0.0.0/24"),
    6: ipaddress.ip_network("ff02::/16"),
}


def _global_unicast(a: Address) -> bool:
    """Go's net.IP.IsGlobalUnicast."""
    return not (
        a.is_unspecified or a.is_loopback or a.is_multicast or a.is_link_local or a == _BROADCAST
    )


def _cidr_method(name: str, apply: Any) -> Any:
    def run(value: Any, *args: Any) -> Any:
        if not isinstance(value, Cidr):
            return function_error(f"no such overload: {name}")
        return apply(value, *args)

    return run


def _contains_ip(cidr: Cidr, other: Any) -> Any:
    if isinstance(other, str):
        other = cel_ip(other)
    if isinstance(other, CELEvalError):
        return other
    if not isinstance(other, Ip):
        return function_error("no such overload: containsIP")
    return celtypes.BoolType(other.address in cidr.network)


def _contains_cidr(cidr: Cidr, other: Any) -> Any:
    if isinstance(other, str):
        other = cel_cidr(other)
    if isinstance(other, CELEvalError):
        return other
    if not isinstance(other, Cidr):
        return function_error("no such overload: containsCIDR")
    inner = other.network
    return celtypes.BoolType(
        inner.version == cidr.network.version and inner.subnet_of(cidr.network)  # type: ignore[arg-type]
    )


NETWORK_FUNCTIONS: dict[str, Any] = {
    "ip": cel_ip,
    "isIP": cel_is_ip,
    "ip.isCanonical": cel_is_canonical,
    "cidr": cel_cidr,
    "isCIDR": cel_is_cidr,
    "family": _ip_method("family", lambda a: celtypes.IntType(a.version)),
    "isUnspecified": _ip_method("isUnspecified", lambda a: celtypes.BoolType(a.is_unspecified)),
    "isLoopback": _ip_method("isLoopback", lambda a: celtypes.BoolType(a.is_loopback)),
    "isLinkLocalMulticast": _ip_method(
        "isLinkLocalMulticast",
        lambda a: celtypes.BoolType(a.is_multicast and a in _LINK_LOCAL_MULTICAST[a.version]),
    ),
    "isLinkLocalUnicast": _ip_method(
        "isLinkLocalUnicast", lambda a: celtypes.BoolType(a.is_link_local and not a.is_multicast)
    ),
    "isGlobalUnicast": _ip_method(
        "isGlobalUnicast", lambda a: celtypes.BoolType(_global_unicast(a))
    ),
    "containsIP": _cidr_method("containsIP", _contains_ip),
    "containsCIDR": _cidr_method("containsCIDR", _contains_cidr),
    "masked": _cidr_method("masked", lambda c: Cidr(c.network.network_address, c.network)),
    "prefixLength": _cidr_method("prefixLength", lambda c: celtypes.IntType(c.network.prefixlen)),
}

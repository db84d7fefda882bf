"""The declared overloads of every CEL operator and function in the DRA selector environment
(cel-go's standard library, its strings extension at version 2, optional types, and Kubernetes'
quantity, semver, lists, regex, URL, IP, CIDR, named-format and sets libraries), and which of
them a call resolves to.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cdigen.policies.cel.cel_types import (
    BOOL,
    BYTES,
    CIDR,
    DOUBLE,
    DURATION,
    DYN,
    INT,
    IP,
    NAMED_FORMAT,
    ORDERED,
    QUANTITY,
    SEMVER,
    STRING,
    TIMESTAMP,
    UINT,
    URL,
    A,
    B,
    Bindings,
    CelType,
    assignable,
    list_of,
    map_of,
    optional_of,
    substitute,
    type_of,
)
from cdigen.policies.cel.named_formats import FORMATS


@dataclass(frozen=True)
class Overload:
    """One declared overload: receiver-style (``member``) or global, its argument types (the
    receiver first) and its result."""

    args: tuple[CelType, ...]
    result: CelType
    member: bool = False


def _g(result: CelType, *args: CelType) -> Overload:
    return Overload(tuple(args), result)


def _m(result: CelType, *args: CelType) -> Overload:
    return Overload(tuple(args), result, member=True)


_NUMBERS = (INT, UINT, DOUBLE)
_CROSS = [(a, b) for a in _NUMBERS for b in _NUMBERS if a != b]  # CrossTypeNumericComparisons


def _both(result: CelType, types: Sequence[CelType]) -> list[Overload]:
    return [_g(result, t, t) for t in types]


_TIME_ACCESSORS = [
    "getFullYear",
    "getMonth",
    "getDayOfYear",
    "getDayOfMonth",
    "getDate",
    "getDayOfWeek",
    "getHours",
    "getMinutes",
    "getSeconds",
    "getMilliseconds",
]

OVERLOADS: dict[str, list[Overload]] = {
    # operators
    "_==_": [_g(BOOL, A, A)],
    "_!=_": [_g(BOOL, A, A)],
    "_<_": _both(BOOL, ORDERED) + [_g(BOOL, a, b) for a, b in _CROSS],
    "_&&_": [_g(BOOL, BOOL, BOOL)],
    "_||_": [_g(BOOL, BOOL, BOOL)],
    "!_": [_g(BOOL, BOOL)],
    "-_": [_g(INT, INT), _g(DOUBLE, DOUBLE)],
    "_?_:_": [_g(A, BOOL, A, A)],
    "_+_": _both(INT, [INT])
    + _both(UINT, [UINT])
    + _both(DOUBLE, [DOUBLE])
    + _both(STRING, [STRING])
    + _both(BYTES, [BYTES])
    + [
        _g(list_of(A), list_of(A), list_of(A)),
        _g(DURATION, DURATION, DURATION),
        _g(TIMESTAMP, TIMESTAMP, DURATION),
        _g(TIMESTAMP, DURATION, TIMESTAMP),
    ],
    "_-_": [_g(t, t, t) for t in _NUMBERS]
    + [
        _g(DURATION, DURATION, DURATION),
        _g(TIMESTAMP, TIMESTAMP, DURATION),
        _g(DURATION, TIMESTAMP, TIMESTAMP),
    ],
    "_*_": [_g(t, t, t) for t in _NUMBERS],
    "_/_": [_g(t, t, t) for t in _NUMBERS],
    "_%_": [_g(INT, INT, INT), _g(UINT, UINT, UINT)],
    "_[_]": [_g(A, list_of(A), INT), _g(B, map_of(A, B), A)],
    "@in": [_g(BOOL, A, list_of(A)), _g(BOOL, A, map_of(A, B))],
    # the standard library
    "size": [
        _g(INT, STRING),
        _g(INT, BYTES),
        _g(INT, list_of(A)),
        _g(INT, map_of(A, B)),
        _m(INT, STRING),
        _m(INT, BYTES),
        _m(INT, list_of(A)),
        _m(INT, map_of(A, B)),
    ],
    "matches": [_g(BOOL, STRING, STRING), _m(BOOL, STRING, STRING)],
    "contains": [_m(BOOL, STRING, STRING)],
    "startsWith": [_m(BOOL, STRING, STRING)],
    "endsWith": [_m(BOOL, STRING, STRING)],
    "int": [_g(INT, t) for t in (INT, UINT, DOUBLE, STRING, TIMESTAMP)],
    "uint": [_g(UINT, t) for t in (UINT, INT, DOUBLE, STRING)],
    "double": [_g(DOUBLE, t) for t in (DOUBLE, INT, UINT, STRING)],
    "string": [_g(STRING, t) for t in (STRING, INT, UINT, DOUBLE, BOOL, BYTES, TIMESTAMP)]
    + [_g(STRING, DURATION), _g(STRING, IP), _g(STRING, CIDR)],
    "bytes": [_g(BYTES, BYTES), _g(BYTES, STRING)],
    "bool": [_g(BOOL, BOOL), _g(BOOL, STRING)],
    "dyn": [_g(DYN, A)],
    "type": [_g(type_of(A), A)],
    "duration": [_g(DURATION, DURATION), _g(DURATION, STRING)],
    "timestamp": [_g(TIMESTAMP, TIMESTAMP), _g(TIMESTAMP, STRING), _g(TIMESTAMP, INT)],
    **{
        name: [_m(INT, TIMESTAMP), _m(INT, TIMESTAMP, STRING)]
        + ([_m(INT, DURATION)] if name in ("getHours", "getMinutes", "getSeconds") else [])
        + ([_m(INT, DURATION)] if name == "getMilliseconds" else [])
        for name in _TIME_ACCESSORS
    },
    # cel-go's strings extension, version 2 (Kubernetes' base environment)
    "charAt": [_m(STRING, STRING, INT)],
    "indexOf": [
        _m(INT, STRING, STRING),
        _m(INT, STRING, STRING, INT),
        _m(INT, list_of(A), A),  # Kubernetes' lists library
    ],
    "lastIndexOf": [
        _m(INT, STRING, STRING),
        _m(INT, STRING, STRING, INT),
        _m(INT, list_of(A), A),
    ],
    "lowerAscii": [_m(STRING, STRING)],
    "upperAscii": [_m(STRING, STRING)],
    "replace": [_m(STRING, STRING, STRING, STRING), _m(STRING, STRING, STRING, STRING, INT)],
    "split": [_m(list_of(STRING), STRING, STRING), _m(list_of(STRING), STRING, STRING, INT)],
    "substring": [_m(STRING, STRING, INT), _m(STRING, STRING, INT, INT)],
    "trim": [_m(STRING, STRING)],
    "join": [_m(STRING, list_of(STRING)), _m(STRING, list_of(STRING), STRING)],
    "format": [_m(STRING, STRING, list_of(DYN))],
    "strings.quote": [_g(STRING, STRING)],
    # optional types
    "optional.of": [_g(optional_of(A), A)],
    "optional.ofNonZeroValue": [_g(optional_of(A), A)],
    "optional.none": [_g(optional_of(DYN))],
    "hasValue": [_m(BOOL, optional_of(A))],
    "value": [_m(A, optional_of(A))],
    "orValue": [_m(A, optional_of(A), A)],
    "or": [_m(optional_of(A), optional_of(A), optional_of(A))],
    # Kubernetes' quantity library
    "quantity": [_g(QUANTITY, STRING)],
    "isQuantity": [_g(BOOL, STRING)],
    "isInteger": [_m(BOOL, QUANTITY)],
    "asInteger": [_m(INT, QUANTITY)],
    "asApproximateFloat": [_m(DOUBLE, QUANTITY)],
    "sign": [_m(INT, QUANTITY)],
    "add": [_m(QUANTITY, QUANTITY, QUANTITY), _m(QUANTITY, QUANTITY, INT)],
    "sub": [_m(QUANTITY, QUANTITY, QUANTITY), _m(QUANTITY, QUANTITY, INT)],
    "isLessThan": [_m(BOOL, QUANTITY, QUANTITY), _m(BOOL, SEMVER, SEMVER)],
    "isGreaterThan": [_m(BOOL, QUANTITY, QUANTITY), _m(BOOL, SEMVER, SEMVER)],
    "compareTo": [_m(INT, QUANTITY, QUANTITY), _m(INT, SEMVER, SEMVER)],
    # Kubernetes' semver library
    "semver": [_g(SEMVER, STRING), _g(SEMVER, STRING, BOOL)],
    "isSemver": [_g(BOOL, STRING), _g(BOOL, STRING, BOOL)],
    "major": [_m(INT, SEMVER)],
    "minor": [_m(INT, SEMVER)],
    "patch": [_m(INT, SEMVER)],
    # Kubernetes' lists library
    "isSorted": [_m(BOOL, list_of(A))],
    "sum": [_m(A, list_of(A))],
    "min": [_m(A, list_of(A))],
    "max": [_m(A, list_of(A))],
    # Kubernetes' regex library
    "find": [_m(STRING, STRING, STRING)],
    "findAll": [_m(list_of(STRING), STRING, STRING), _m(list_of(STRING), STRING, STRING, INT)],
    # Kubernetes' URL library
    "url": [_g(URL, STRING)],
    "isURL": [_g(BOOL, STRING)],
    "getScheme": [_m(STRING, URL)],
    "getHost": [_m(STRING, URL)],
    "getHostname": [_m(STRING, URL)],
    "getPort": [_m(STRING, URL)],
    "getEscapedPath": [_m(STRING, URL)],
    "getQuery": [_m(map_of(STRING, list_of(STRING)), URL)],
    # Kubernetes' IP and CIDR libraries
    "ip": [_g(IP, STRING), _m(IP, CIDR)],
    "isIP": [_g(BOOL, STRING)],
    "ip.isCanonical": [_g(BOOL, STRING)],
    "family": [_m(INT, IP)],
    "isUnspecified": [_m(BOOL, IP)],
    "isLoopback": [_m(BOOL, IP)],
    "isLinkLocalMulticast": [_m(BOOL, IP)],
    "isLinkLocalUnicast": [_m(BOOL, IP)],
    "isGlobalUnicast": [_m(BOOL, IP)],
    "cidr": [_g(CIDR, STRING)],
    "isCIDR": [_g(BOOL, STRING)],
    "containsIP": [_m(BOOL, CIDR, IP), _m(BOOL, CIDR, STRING)],
    "containsCIDR": [_m(BOOL, CIDR, CIDR), _m(BOOL, CIDR, STRING)],
    "masked": [_m(CIDR, CIDR)],
    "prefixLength": [_m(INT, CIDR)],
    # Kubernetes' format library
    **{f"format.{name}": [_g(NAMED_FORMAT)] for name in FORMATS},
    "format.named": [_g(optional_of(NAMED_FORMAT), STRING)],
    "validate": [_m(optional_of(list_of(STRING)), NAMED_FORMAT, STRING)],
    # cel-go's sets extension
    "sets.contains": [_g(BOOL, list_of(A), list_of(A))],
    "sets.equivalent": [_g(BOOL, list_of(A), list_of(A))],
    "sets.intersects": [_g(BOOL, list_of(A), list_of(A))],
}
for _name in ("_<=_", "_>_", "_>=_"):
    OVERLOADS[_name] = OVERLOADS["_<_"]

OPERATORS = {
    "relation_lt": ("_<_", "<"),
    "relation_le": ("_<=_", "<="),
    "relation_gt": ("_>_", ">"),
    "relation_ge": ("_>=_", ">="),
    "relation_eq": ("_==_", "=="),
    "relation_ne": ("_!=_", "!="),
    "relation_in": ("@in", "in"),
    "addition_add": ("_+_", "+"),
    "addition_sub": ("_-_", "-"),
    "multiplication_mul": ("_*_", "*"),
    "multiplication_div": ("_/_", "/"),
    "multiplication_mod": ("_%_", "%"),
}


def is_declared(name: str, member: bool) -> bool:
    """Whether some overload of ``name`` is called that way (receiver-style or global)."""
    return any(o.member == member for o in OVERLOADS.get(name, ()))


def overload_result(name: str, args: Sequence[CelType], member: bool) -> CelType | None:
    """The result type of calling ``name`` on ``args`` (the receiver first when ``member``):
    ``dyn`` where overloads of different results take them; None where none does."""
    result: CelType | None = None
    for overload in OVERLOADS.get(name, ()):
        if overload.member != member or len(overload.args) != len(args):
            continue
        m = Bindings()
        if all(assignable(m, a, d) for a, d in zip(args, overload.args, strict=True)):
            found = substitute(m, overload.result)
            if result is None:
                result = found
            elif result != found and not result.dynamic:
                result = DYN
    return result


def did_you_mean(name: str, member: bool) -> str:
    """`` (did you mean 'startsWith'?)`` for the closest declared function, or ""."""
    import difflib

    names = [
        n for n, o in OVERLOADS.items() if n[0].isalpha() and any(x.member == member for x in o)
    ]
    close = difflib.get_close_matches(name, names, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""

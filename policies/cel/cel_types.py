"""The static types of CEL as cel-go's checker has them (``int``, ``list(A)``, ``dyn``), the
objects and type names the DRA selector environment declares, and assignability with type
parameters (after cel-go's checker/types.go). :mod:`cdigen.policies.cel.typecheck` checks with them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class CelType:
    """A CEL type as cel-go's checker has it: a name and its parameters (``list(int)``)."""

    name: str
    params: tuple[CelType, ...] = ()

    def __str__(self) -> str:
        if not self.params:
            return self.name
        return f"{self.name}({', '.join(str(p) for p in self.params)})"

    @property
    def dynamic(self) -> bool:
        """``dyn`` or ``any``: checked only at run time."""
        return self.name in ("dyn", "any", "!error!")

    @property
    def param(self) -> bool:
        return len(self.name) == 1 and self.name.isupper()


def _t(name: str, *params: CelType) -> CelType:
    return CelType(name, params)


DYN, ANY, ERROR = _t("dyn"), _t("any"), _t("!error!")
BOOL, INT, UINT, DOUBLE = _t("bool"), _t("int"), _t("uint"), _t("double")
STRING, BYTES, NULL = _t("string"), _t("bytes"), _t("null")
DURATION, TIMESTAMP = _t("google.protobuf.Duration"), _t("google.protobuf.Timestamp")
QUANTITY, SEMVER = _t("kubernetes.Quantity"), _t("kubernetes.Semver")
URL, IP, CIDR = _t("kubernetes.URL"), _t("net.IP"), _t("net.CIDR")
A, B = _t("A"), _t("B")
DEVICE = _t("kubernetes.DRADevice")
NAMED_FORMAT = _t("kubernetes.NamedFormat")


def list_of(elem: CelType) -> CelType:
    return _t("list", elem)


def map_of(key: CelType, value: CelType) -> CelType:
    return _t("map", key, value)


def optional_of(value: CelType) -> CelType:
    return _t("optional_type", value)


def type_of(value: CelType) -> CelType:
    return _t("type", value)


# ``device`` as Kubernetes declares it for DRA selectors (k8s.io/dynamic-resource-allocation/cel):
# attribute values are ``any`` (int, bool, string or semver, known only per device).
DEVICE_FIELDS: Mapping[str, CelType] = {
    "driver": STRING,
    "attributes": map_of(STRING, map_of(STRING, ANY)),
    "capacity": map_of(STRING, map_of(STRING, QUANTITY)),
    "allowMultipleAllocations": BOOL,  # DRAConsumableCapacity
}
OBJECT_FIELDS: Mapping[str, Mapping[str, CelType]] = {DEVICE.name: DEVICE_FIELDS}

ORDERED = (BOOL, INT, UINT, DOUBLE, STRING, BYTES, DURATION, TIMESTAMP)

LITERALS = {
    "INT_LIT": INT,
    "UINT_LIT": UINT,
    "FLOAT_LIT": DOUBLE,
    "STRING_LIT": STRING,
    "MLSTRING_LIT": STRING,
    "BYTES_LIT": BYTES,
    "BOOL_LIT": BOOL,
    "NULL_LIT": NULL,
}
# The type names an expression may use as values (``type(x) == int``).
TYPE_NAMES: Mapping[str, CelType] = {
    "int": INT,
    "uint": UINT,
    "double": DOUBLE,
    "bool": BOOL,
    "string": STRING,
    "bytes": BYTES,
    "list": list_of(DYN),
    "map": map_of(DYN, DYN),
    "null_type": NULL,
    "type": type_of(DYN),
}
INT64 = (-(2**63), 2**63 - 1)


# -- assignability and substitution, after cel-go's checker/types.go


class Bindings:
    """Type parameter bindings while one overload is tried."""

    def __init__(self) -> None:
        self.bound: dict[str, CelType] = {}

    def copy(self) -> Bindings:
        other = Bindings()
        other.bound = dict(self.bound)
        return other


def assignable(m: Bindings, actual: CelType, declared: CelType) -> bool:
    if declared.param:
        bound = m.bound.get(declared.name)
        if bound is None:
            m.bound[declared.name] = actual
            return True
        if assignable(m, actual, bound):
            if bound.dynamic or (not actual.dynamic and less_specific(actual, bound)):
                m.bound[declared.name] = actual if not bound.dynamic else bound
            return True
        return False
    if actual.dynamic or declared.dynamic:
        return True
    if actual.name == "null" or declared.name == "null":
        other = declared if actual.name == "null" else actual
        return other.name == "null" or (
            other.name not in {t.name for t in ORDERED}
            and (other.name not in ("list", "map", "type"))
        )
    if actual.name == "type" and declared.name == "type":
        return True  # cel-go: any type value is assignable to another
    if actual.name != declared.name or len(actual.params) != len(declared.params):
        return False
    return all(assignable(m, a, d) for a, d in zip(actual.params, declared.params, strict=True))


def less_specific(t1: CelType, t2: CelType) -> bool:
    if t1.dynamic:
        return True
    if t2.dynamic:
        return False
    return t1.name == t2.name and all(
        less_specific(a, b) for a, b in zip(t1.params, t2.params, strict=True)
    )


def substitute(m: Bindings, t: CelType) -> CelType:
    if t.param:
        bound = m.bound.get(t.name)
        return substitute(m, bound) if bound is not None and bound != t else DYN
    if not t.params:
        return t
    return CelType(t.name, tuple(substitute(m, p) for p in t.params))


def common_type(previous: CelType | None, current: CelType) -> CelType | None:
    """The common type of two literal elements (None when they differ)."""
    if previous is None:
        return current
    m = Bindings()
    if assignable(m, previous, current) and assignable(Bindings(), current, previous):
        return previous if less_specific(previous, current) else current
    return None


def comprehension_variables(
    target: CelType, names: Sequence[str]
) -> tuple[CelType, dict[str, CelType]] | None:
    """The key (or index) type of a comprehension's range ``target`` and its variables
    ``names`` with their types (over a list its elements, or its indexes and elements; over a
    map its keys, or its keys and values); None where ``target`` cannot be a range."""
    if target.dynamic:
        key, value = DYN, DYN
    elif target.name == "list":
        key, value = INT, target.params[0]
    elif target.name == "map":
        key, value = target.params
    else:
        return None
    if len(names) == 2:
        return key, {names[0]: key, names[1]: value}
    return key, {names[0]: value if target.name == "list" else key}


def comprehension_result(
    macro: str, key: CelType, variable: CelType, body: CelType
) -> CelType | None:
    """The type of a comprehension ``macro`` whose range has keys (or indexes) ``key``, whose
    (first) variable is ``variable`` and whose last body is ``body``; None where
    ``transformMapEntry``'s body is not a map."""
    if macro in ("all", "exists", "exists_one", "existsOne"):
        return BOOL
    if macro == "filter":
        return list_of(variable)
    if macro in ("map", "transformList"):
        return list_of(body)
    if macro == "transformMap":
        return map_of(key, body)
    if not (body.dynamic or body.name == "map"):  # transformMapEntry
        return None
    return body if body.name == "map" else map_of(DYN, DYN)

"""The API server's create-time check of a CEL expression, in the DRA selector environment.

Kubernetes compiles a selector with cel-go's type checker against declared types: ``device`` is
an object (``driver`` a string, ``attributes`` a map of domains to maps of ``any`` values,
``capacity`` a map of domains to maps of ``kubernetes.Quantity``), literals have their types,
and every operator and function has declared overloads (cel-go's standard library, its strings
extension at version 2, optional types, and Kubernetes' quantity, semver, lists, regex, URL, IP,
CIDR and sets libraries). An operand of a declared type that no overload takes, a field the
object lacks, a name nothing declares, a list or map literal mixing types, a ``matches`` literal
RE2 cannot compile, a literal ``format`` call whose clauses disagree with its arguments, and a
result that is neither bool nor of unknown type are refused there, before any device is looked
at. This module does the same over cel-python's parse tree, in cel-go's words.

``any`` and ``dyn`` (an attribute value, a macro variable over them, ``dyn(x)``) are checked
only when evaluated, as cel-go does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lark import Token, Tree

from policies.cel import comprehensions
from policies.cel.errors import CelCompileError
from policies.cel.named_formats import FORMATS


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
_ORDERED = (BOOL, INT, UINT, DOUBLE, STRING, BYTES, DURATION, TIMESTAMP)
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
    "_<_": _both(BOOL, _ORDERED) + [_g(BOOL, a, b) for a, b in _CROSS],
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

_OPERATORS = {
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
_LITERALS = {
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


class _Mapping:
    """Type parameter bindings while one overload is tried."""

    def __init__(self) -> None:
        self.bound: dict[str, CelType] = {}

    def copy(self) -> _Mapping:
        other = _Mapping()
        other.bound = dict(self.bound)
        return other


def _assignable(m: _Mapping, actual: CelType, declared: CelType) -> bool:
    if declared.param:
        bound = m.bound.get(declared.name)
        if bound is None:
            m.bound[declared.name] = actual
            return True
        if _assignable(m, actual, bound):
            if bound.dynamic or (not actual.dynamic and _less_specific(actual, bound)):
                m.bound[declared.name] = actual if not bound.dynamic else bound
            return True
        return False
    if actual.dynamic or declared.dynamic:
        return True
    if actual.name == "null" or declared.name == "null":
        other = declared if actual.name == "null" else actual
        return other.name == "null" or (
            other.name not in {t.name for t in _ORDERED}
            and (other.name not in ("list", "map", "type"))
        )
    if actual.name == "type" and declared.name == "type":
        return True  # cel-go: any type value is assignable to another
    if actual.name != declared.name or len(actual.params) != len(declared.params):
        return False
    return all(_assignable(m, a, d) for a, d in zip(actual.params, declared.params, strict=True))


def _less_specific(t1: CelType, t2: CelType) -> bool:
    if t1.dynamic:
        return True
    if t2.dynamic:
        return False
    return t1.name == t2.name and all(
        _less_specific(a, b) for a, b in zip(t1.params, t2.params, strict=True)
    )


def _substitute(m: _Mapping, t: CelType) -> CelType:
    if t.param:
        bound = m.bound.get(t.name)
        return _substitute(m, bound) if bound is not None and bound != t else DYN
    if not t.params:
        return t
    return CelType(t.name, tuple(_substitute(m, p) for p in t.params))


def _joined(previous: CelType | None, current: CelType) -> CelType | None:
    """The common type of two literal elements (None when they differ)."""
    if previous is None:
        return current
    m = _Mapping()
    if _assignable(m, previous, current) and _assignable(_Mapping(), current, previous):
        return previous if _less_specific(previous, current) else current
    return None


# -- the checker


class _Checker:
    def __init__(self, text: str, variables: Mapping[str, CelType]) -> None:
        self.text = text
        self.scopes: list[dict[str, CelType]] = [dict(variables)]
        # What cel-go's validators find: they run once the type check has passed, and the
        # API server reports the first by position.
        self.validation: list[CelCompileError] = []
        self.in_format = 0  # inside a format() call: literals may mix types

    def fail(self, message: str, where: Any) -> CelCompileError:
        line, column = _where(where)
        return CelCompileError(message, line, column)

    def lookup(self, name: str) -> CelType | None:
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        return None

    def resolve(
        self,
        name: str,
        args: Sequence[CelType],
        member: bool,
        where: Any,
        name_at: Token | None = None,
    ) -> CelType:
        """The result type of calling ``name`` on ``args`` (the receiver first when
        ``member``), or cel-go's refusal."""
        declared = OVERLOADS.get(name)
        if declared is None or all(o.member != member for o in declared):
            raise self.fail(
                f"undeclared reference to {name!r} (in container ''){_did_you_mean(name, member)}",
                name_at or where,
            )
        result: CelType | None = None
        for overload in declared:
            if overload.member != member or len(overload.args) != len(args):
                continue
            m = _Mapping()
            if all(_assignable(m, a, d) for a, d in zip(args, overload.args, strict=True)):
                found = _substitute(m, overload.result)
                if result is None:
                    result = found
                elif result != found and not result.dynamic:
                    result = DYN
        if result is None:
            if member:
                shown = f"{args[0]}.({', '.join(str(a) for a in args[1:])})"
            else:
                shown = f"({', '.join(str(a) for a in args)})"
            raise self.fail(f"found no matching overload for {name!r} applied to {shown!r}", where)
        return result

    # the grammar's levels

    def check(self, node: Any) -> CelType:
        if isinstance(node, Token):
            raise self.fail(f"unexpected token {str(node)!r}", node)
        method = getattr(self, f"c_{node.data}", None)
        if method is not None:
            result: CelType = method(node)
            return result
        if len(node.children) == 1:
            return self.check(node.children[0])
        raise self.fail(f"unsupported syntax {node.data!r}", node)

    def c_expr(self, node: Any) -> CelType:
        if len(node.children) == 1:
            return self.check(node.children[0])
        cond, yes, no = (self.check(c) for c in node.children)
        where = self._operator_at(node.children[0], "?")
        return self.resolve("_?_:_", (cond, yes, no), False, where)

    def c_conditionalor(self, node: Any) -> CelType:
        return self._logical(node, "_||_", "||")

    def c_conditionaland(self, node: Any) -> CelType:
        return self._logical(node, "_&&_", "&&")

    def _logical(self, node: Any, name: str, symbol: str) -> CelType:
        if len(node.children) == 1:
            return self.check(node.children[0])
        left, right = self.check(node.children[0]), self.check(node.children[1])
        return self.resolve(name, (left, right), False, self._operator_at(node.children[0], symbol))

    def _binary(self, node: Any) -> CelType:
        if len(node.children) == 1:
            return self.check(node.children[0])
        step, right_node = node.children
        name, symbol = _OPERATORS[step.data]
        left_node = step.children[0]
        left, right = self.check(left_node), self.check(right_node)
        return self.resolve(name, (left, right), False, self._operator_at(left_node, symbol))

    c_relation = c_addition = c_multiplication = _binary

    def c_unary(self, node: Any) -> CelType:
        if len(node.children) == 1:
            return self.check(node.children[0])
        op, operand = node.children
        value = self.check(operand)
        name = "!_" if op.data == "unary_not" else "-_"
        return self.resolve(name, (value,), False, operand)

    def c_member(self, node: Any) -> CelType:
        return self.check(node.children[0])

    def c_primary(self, node: Any) -> CelType:
        return self.check(node.children[0])

    def c_paren_expr(self, node: Any) -> CelType:
        return self.check(node.children[0])

    def c_literal(self, node: Any) -> CelType:
        token = node.children[0]
        kind = _LITERALS.get(token.type, DYN)
        if kind in (INT, UINT):
            _check_integer(token, kind, self)
        return kind

    def c_ident(self, node: Any) -> CelType:
        name = str(node.children[0])
        found = self.lookup(name)
        if found is None and name in TYPE_NAMES:
            return type_of(TYPE_NAMES[name])
        if found is None:
            raise self.fail(f"undeclared reference to {name!r} (in container '')", node)
        return found

    def c_list_lit(self, node: Any) -> CelType:
        elements = node.children[0].children if node.children else []
        elem: CelType | None = None
        first: CelType | None = None
        for element in elements:
            current = self.check(element)
            if first is None:
                first = current
            else:
                self._same_type(first, current, element)
            joined = _joined(elem, current)
            elem = DYN if joined is None else joined
        return list_of(elem or DYN)

    def c_map_lit(self, node: Any) -> CelType:
        items = node.children[0].children if node.children else []
        key: CelType | None = None
        value: CelType | None = None
        first: tuple[CelType, CelType] | None = None
        for k_node, v_node in zip(items[::2], items[1::2], strict=True):
            k, v = self.check(k_node), self.check(v_node)
            if k.name not in ("int", "uint", "bool", "string", "dyn", "any"):
                raise self.fail(f"unsupported map key type: {k}", k_node)
            if first is None:
                first = (k, v)
            else:
                self._same_type(first[0], k, k_node)
                self._same_type(first[1], v, v_node)
            joined_key, joined_value = _joined(key, k), _joined(value, v)
            key = DYN if joined_key is None else joined_key
            value = DYN if joined_value is None else joined_value
        return map_of(key or DYN, value or DYN)

    def _same_type(self, expected: CelType, found: CelType, where: Any) -> None:
        """cel-go's homogeneous aggregate literal validator: the elements of a list literal
        (the keys, the values of a map literal) all of one type, except inside format()."""
        if expected != found and not self.in_format:
            self.validation.append(
                self.fail(f"expected type '{expected}' but found '{found}'", where)
            )

    def c_member_object(self, node: Any) -> CelType:
        raise self.fail("message construction is not supported in this environment", node)

    def c_dot_ident(self, node: Any) -> CelType:
        return self.c_ident(Tree("ident", [node.children[0]], meta=node.meta))

    def c_dot_ident_arg(self, node: Any) -> CelType:
        return self.c_ident_arg(node)

    def c_member_dot(self, node: Any) -> CelType:
        target, name = node.children
        return self._select(self.check(target), str(name), name)

    def _select(self, target: CelType, field: str, where: Any) -> CelType:
        if target.dynamic:
            return DYN
        if target.name == "optional_type":
            return optional_of(self._select(target.params[0], field, where))
        if target.name == "map":
            if not _assignable(_Mapping(), STRING, target.params[0]):
                raise self.fail(f"type '{target}' does not support field selection", where)
            return target.params[1]
        fields = OBJECT_FIELDS.get(target.name)
        if fields is not None:
            found = fields.get(field)
            if found is None:
                raise self.fail(f"undefined field {field!r}", where)
            return found
        raise self.fail(f"type '{target}' does not support field selection", where)

    def c_member_dot_opt(self, node: Any) -> CelType:
        target, name = node.children
        selected = self._select(self.check(target), str(name), name)
        return selected if selected.name == "optional_type" else optional_of(selected)

    def c_member_index(self, node: Any) -> CelType:
        target_node, key_node = node.children
        target, key = self.check(target_node), self.check(key_node)
        if target.name == "optional_type":
            inner = self.resolve("_[_]", (target.params[0], key), False, key_node)
            return optional_of(inner)
        return self.resolve("_[_]", (target, key), False, key_node)

    def c_member_index_opt(self, node: Any) -> CelType:
        target_node, key_node = node.children
        target, key = self.check(target_node), self.check(key_node)
        if target.name == "optional_type":
            target = target.params[0]
        inner = self.resolve("_[_]", (target, key), False, key_node)
        return inner if inner.name == "optional_type" else optional_of(inner)

    def c_ident_arg(self, node: Any) -> CelType:
        name_token = node.children[0]
        name = str(name_token)
        args = list(node.children[1].children) if len(node.children) > 1 else []
        if name == "has":
            return self._has(args, node)
        types = [self.check(a) for a in args]
        result = self.resolve(name, types, False, name_token)
        if name == "matches" and args:  # cel-go checks the first argument's literal
            self._regex_literal(args[0])
        if name in ("duration", "timestamp") and args:
            self._time_literal(name, args[0])
        return result

    def _time_literal(self, name: str, argument: Any) -> None:
        """cel-go's ValidateDurationLiterals/ValidateTimestampLiterals: a literal argument of
        ``duration()``/``timestamp()`` must convert."""
        literal = _string_literal(argument)
        if literal is None:
            return
        from celpy import celtypes

        convert = celtypes.DurationType if name == "duration" else celtypes.TimestampType
        try:
            convert(literal)
        except Exception:  # cel-python raises several kinds for a bad literal
            self.validation.append(self.fail(f"invalid {name} argument", argument))

    def _has(self, args: Sequence[Any], node: Any) -> CelType:
        selection = _unwrap(args[0]) if len(args) == 1 else None
        if not (isinstance(selection, Tree) and selection.data == "member_dot"):
            raise self.fail("invalid argument to has() macro", node)
        target, name = selection.children
        self._select(self.check(target), str(name), name)
        return BOOL

    def c_member_dot_arg(self, node: Any) -> CelType:
        target_node, name_token = node.children[0], node.children[1]
        name = str(name_token)
        args = list(node.children[2].children) if len(node.children) > 2 else []
        names = comprehensions.variables(name, args) if name in comprehensions.NAMES else None
        if names is not None:
            return self._comprehension(target_node, name, names, args[len(names) :])
        self.in_format += name == "format"
        try:
            target = self.check(target_node)
            types = [self.check(a) for a in args]
        finally:
            self.in_format -= name == "format"
        where = _call_position(name_token)
        result = self.resolve(name, [target, *types], True, where, name_token)
        if name == "matches" and args:
            self._regex_literal(args[0])
        if name == "format" and args:
            self._format_literal(target_node, args[0])
        return result

    def _comprehension(
        self, target_node: Any, name: str, names: Sequence[str], bodies: Sequence[Any]
    ) -> CelType:
        """A comprehension's type: its range gives the variables' types (a list its elements,
        or its indexes and elements; a map its keys, or its keys and values)."""
        target = self.check(target_node)
        if target.dynamic:
            key, value = DYN, DYN
        elif target.name == "list":
            key, value = INT, target.params[0]
        elif target.name == "map":
            key, value = target.params
        else:
            raise self.fail(
                f"expression of type '{target}' cannot be range of a comprehension (must be "
                "list, map, or dynamic)",
                target_node,
            )
        if len(names) == 2:
            scope = {names[0]: key, names[1]: value}
        else:
            scope = {names[0]: value if target.name == "list" else key}
        self.scopes.append(scope)
        try:
            types = [self.check(b) for b in bodies]
        finally:
            self.scopes.pop()
        if len(types) == 2 or name in ("all", "exists", "exists_one", "existsOne", "filter"):
            step = "_&&_" if name in ("all", "filter") or len(types) == 2 else "_||_"
            self.resolve(step, (BOOL, types[0]), False, bodies[0])
        result = types[-1]
        if name in ("all", "exists", "exists_one", "existsOne"):
            return BOOL
        if name == "filter":
            return list_of(scope[names[0]])
        if name in ("map", "transformList"):
            return list_of(result)
        if name == "transformMap":
            return map_of(key, result)
        if not (result.dynamic or result.name == "map"):  # transformMapEntry
            raise self.fail(
                f"found no matching overload for 'transformMapEntry' applied to '{result}'",
                bodies[-1],
            )
        return result if result.name == "map" else map_of(DYN, DYN)

    def _regex_literal(self, pattern: Any) -> None:
        """cel-go's ValidateRegexLiterals: a literal ``matches`` pattern must compile (RE2)."""
        literal = _string_literal(pattern)
        if literal is None:
            return
        from policies.cel.regex import regex_problem

        if regex_problem(literal) is not None:
            self.validation.append(self.fail("invalid matches argument", pattern))

    def _format_literal(self, target_node: Any, args_node: Any) -> None:
        """cel-go's format validator: a literal format string with a literal list of
        arguments must agree with them, clause by clause, when the expression is created."""
        text = _string_literal(target_node)
        elements = _list_literal(args_node)
        if text is None or elements is None:
            return
        from policies.cel.formatting import FormatError, check_format

        self.in_format += 1
        try:
            kinds = [str(self.check(element)) for element in elements]
        finally:
            self.in_format -= 1
        try:
            check_format(text, kinds)
        except FormatError as exc:
            self.validation.append(self.fail(str(exc), args_node))

    def _operator_at(self, left: Any, symbol: str) -> tuple[int | None, int | None]:
        """The line and column of ``symbol`` after the subtree ``left`` (the operator cel-go
        reports an error at)."""
        meta = getattr(left, "meta", None)
        if meta is None or meta.empty:
            return None, None
        at = self.text.find(symbol, meta.end_pos)
        if at < 0:
            return meta.end_line, meta.end_column
        before = self.text[:at]
        return before.count("\n") + 1, at - (before.rfind("\n") + 1) + 1


def _did_you_mean(name: str, member: bool) -> str:
    """`` (did you mean 'startsWith'?)`` for the closest declared function, or ""."""
    import difflib

    names = [
        n for n, o in OVERLOADS.items() if n[0].isalpha() and any(x.member == member for x in o)
    ]
    close = difflib.get_close_matches(name, names, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _where(where: Any) -> tuple[int | None, int | None]:
    if isinstance(where, tuple):
        return where
    if isinstance(where, Token):
        return where.line, where.column
    meta = getattr(where, "meta", None)
    if meta is None or meta.empty:
        return None, None
    return meta.line, meta.column


def _call_position(name: Token) -> tuple[int | None, int | None]:
    """cel-go reports a member call at its opening bracket, just after the name."""
    if name.line is None or name.column is None:
        return None, None
    return name.line, name.column + len(str(name))


def _unwrap(node: Any) -> Any:
    """The innermost node of a chain of single-child levels (``expr`` down to ``member_dot``)."""
    while (
        isinstance(node, Tree)
        and len(node.children) == 1
        and node.data not in ("ident", "literal", "list_lit", "map_lit", "paren_expr")
    ):
        node = node.children[0]
    return node


def _string_literal(node: Any) -> str | None:
    inner = _unwrap(node)
    if not (isinstance(inner, Tree) and inner.data == "literal"):
        return None
    token = inner.children[0]
    if not isinstance(token, Token) or token.type not in ("STRING_LIT", "MLSTRING_LIT"):
        return None
    from celpy.evaluation import celstr  # cel-python's decoding of a string literal

    return str(celstr(token))


def _list_literal(node: Any) -> list[Any] | None:
    inner = _unwrap(node)
    if not (isinstance(inner, Tree) and inner.data == "list_lit"):
        return None
    return list(inner.children[0].children) if inner.children else []


def _check_integer(token: Token, kind: CelType, checker: _Checker) -> None:
    """cel-go's parser refuses an int literal outside int64 and a uint outside uint64."""
    text = str(token).rstrip("uU")
    negative = text.startswith("-")
    digits = text.lstrip("-")
    value = int(digits, 16) if digits[:2].lower() == "0x" else int(digits)
    value = -value if negative else value
    low, high = INT64 if kind == INT else (0, 2**64 - 1)
    if not low <= value <= high:
        raise checker.fail(f"invalid {kind} literal", token)


def check_types(
    tree: Any, text: str, variables: Mapping[str, CelType], want_bool: bool = True
) -> CelType:
    """The type of ``tree``; CelCompileError, in cel-go's words, where the API server's check
    refuses it. ``want_bool``: the result must be bool or of unknown type (a selector's)."""
    checker = _Checker(text, variables)
    result = checker.check(tree)
    if checker.validation:
        raise min(checker.validation, key=lambda e: (e.line or 0, e.column or 0))
    if want_bool and not (result == BOOL or result.dynamic):
        raise CelCompileError(f"must evaluate to bool or the unknown type, not {result}", 1, 1)
    return result

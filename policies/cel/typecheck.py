"""The part of the API server's CEL type check that our dialect needs: values whose type is
known when the expression is created (literals, ``device.capacity`` entries, ``quantity()``,
``semver()``) must meet an operator that has an overload for them. Attributes are ``dyn``
(checked only when evaluated), as in Kubernetes' declarations."""

from __future__ import annotations

from typing import Any

from lark import Token, Tree

from policies.cel.errors import CelCompileError

QUANTITY = "kubernetes.Quantity"
SEMVER = "kubernetes.Semver"
_OPAQUE = frozenset({QUANTITY, SEMVER})
_LITERALS = {
    "INT_LIT": "int",
    "UINT_LIT": "uint",
    "FLOAT_LIT": "double",
    "STRING_LIT": "string",
    "MLSTRING_LIT": "string",
    "BYTES_LIT": "bytes",
    "BOOL_LIT": "bool",
    "NULL_LIT": "null_type",
}
_MADE_BY = {"quantity": QUANTITY, "semver": SEMVER}
_QUANTITY_METHODS = frozenset({"add", "sub"})
_OPERATORS = {
    "relation_lt": "_<_",
    "relation_le": "_<=_",
    "relation_gt": "_>_",
    "relation_ge": "_>=_",
    "relation_eq": "_==_",
    "relation_ne": "_!=_",
    "addition_add": "_+_",
    "addition_sub": "_-_",
    "multiplication_mul": "_*_",
    "multiplication_div": "_/_",
    "multiplication_mod": "_%_",
}


def check_types(tree: Any) -> None:
    """CelCompileError, as the API server words it, at the first binary operator that has a
    quantity or semver on one side and a value of another known type on the other."""
    for node in tree.iter_subtrees_topdown():
        if len(node.children) != 2 or not isinstance(node.children[0], Tree):
            continue
        step = node.children[0]
        operator = _OPERATORS.get(step.data)
        if operator is None:
            continue
        left, right = static_type(step.children[0]), static_type(node.children[1])
        if left is None or right is None or (left == right and operator in _COMPARING):
            continue
        if left in _OPAQUE or right in _OPAQUE:
            line = None if step.meta.empty else step.meta.end_line
            column = None if step.meta.empty else step.meta.end_column - len(operator) + 2
            raise CelCompileError(
                f"found no matching overload for {operator!r} applied to '({left}, {right})'",
                line,
                column,
            )


_COMPARING = frozenset({"_<_", "_<=_", "_>_", "_>=_", "_==_", "_!=_"})


def static_type(node: Any) -> str | None:
    """The type of ``node`` known before evaluation, or None (``dyn``)."""
    while isinstance(node, Tree) and len(node.children) == 1 and node.data not in _LEAVES:
        node = node.children[0]
    if not isinstance(node, Tree):
        return None
    if node.data == "literal":
        token = node.children[0]
        return _LITERALS.get(token.type) if isinstance(token, Token) else None
    if node.data == "paren_expr":
        return static_type(node.children[0])
    if node.data == "ident_arg":
        return _MADE_BY.get(str(node.children[0]))
    if node.data == "member_dot_arg" and str(node.children[1]) in _QUANTITY_METHODS:
        return QUANTITY if static_type(node.children[0]) == QUANTITY else None
    if node.data in ("member_dot", "member_index") and _capacity_domain(node.children[0]):
        return QUANTITY
    return None


_LEAVES = frozenset({"literal", "paren_expr", "ident_arg", "member_dot_arg", "member_dot"})


def _capacity_domain(node: Any) -> bool:
    """Whether ``node`` is ``device.capacity[<domain>]`` (a map of quantities)."""
    while isinstance(node, Tree) and node.data == "member" and len(node.children) == 1:
        node = node.children[0]
    if not (isinstance(node, Tree) and node.data == "member_index"):
        return False
    dotted = node.children[0]
    while isinstance(dotted, Tree) and dotted.data == "member" and len(dotted.children) == 1:
        dotted = dotted.children[0]
    return (
        isinstance(dotted, Tree)
        and dotted.data == "member_dot"
        and str(dotted.children[1]) == "capacity"
        and _is_device(dotted.children[0])
    )


def _is_device(node: Any) -> bool:
    while isinstance(node, Tree) and len(node.children) == 1 and node.data != "ident":
        node = node.children[0]
    return isinstance(node, Tree) and node.data == "ident" and str(node.children[0]) == "device"

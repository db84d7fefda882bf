"""Reading cel-python's parse tree (lark) for the checker: where a node sits, the innermost
node of a chain, and the value of a string or list literal."""

from __future__ import annotations

from typing import Any

from lark import Token, Tree

from cdigen.policies.cel.errors import line_column


def tree_position(where: Any) -> tuple[int | None, int | None]:
    if isinstance(where, tuple):
        return where
    if isinstance(where, Token):
        return where.line, where.column
    meta = getattr(where, "meta", None)
    if meta is None or meta.empty:
        return None, None
    return meta.line, meta.column


def call_position(name: Token) -> tuple[int | None, int | None]:
    """cel-go reports a member call at its opening bracket, just after the name."""
    if name.line is None or name.column is None:
        return None, None
    return name.line, name.column + len(str(name))


def unwrap(node: Any) -> Any:
    """The innermost node of a chain of single-child levels (``expr`` down to ``member_dot``)."""
    while (
        isinstance(node, Tree)
        and len(node.children) == 1
        and node.data not in ("ident", "literal", "list_lit", "map_lit", "paren_expr")
    ):
        node = node.children[0]
    return node


def string_literal(node: Any) -> str | None:
    inner = unwrap(node)
    if not (isinstance(inner, Tree) and inner.data == "literal"):
        return None
    token = inner.children[0]
    if not isinstance(token, Token) or token.type not in ("STRING_LIT", "MLSTRING_LIT"):
        return None
    from celpy.evaluation import celstr  # cel-python's decoding of a string literal

    return str(celstr(token))


def list_literal(node: Any) -> list[Any] | None:
    inner = unwrap(node)
    if not (isinstance(inner, Tree) and inner.data == "list_lit"):
        return None
    return list(inner.children[0].children) if inner.children else []


def operator_position(text: str, left: Any, symbol: str) -> tuple[int | None, int | None]:
    """The line and column of ``symbol`` in ``text`` after the subtree ``left`` (the operator
    cel-go reports an error at)."""
    meta = getattr(left, "meta", None)
    if meta is None or meta.empty:
        return None, None
    at = text.find(symbol, meta.end_pos)
    if at < 0:
        return meta.end_line, meta.end_column
    return line_column(text, at)

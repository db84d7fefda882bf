"""Parsing CEL: cel-python's own grammar (read from the installed package) plus CEL's optional
field selection, which Kubernetes enables and cel-python does not parse.

Two alternatives are added to ``member``: ``member_dot_opt`` (``m.?name``) and
``member_index_opt`` (``m[?key]``); a plain selection after one is parsed as one too.
``optional.of(x)``, ``strings.quote(s)``, ``sets.contains(a, b)`` and the other namespaced
functions (``NAMESPACED``) parse as methods of an identifier; :func:`parse` turns them into
calls of the functions named ``optional.of`` and so on.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import celpy
from celpy.celparser import CELParseError, CELParser
from lark import Lark, Token, Tree
from lark.exceptions import LexError, ParseError, UnexpectedCharacters, UnexpectedToken

from cdigen.policies.cel.named_formats import FORMATS

_OPTIONAL_SELECTION = """
%extend member: member_dot_opt | member_index_opt
member_dot_opt: member "." "?" IDENT
member_index_opt: member "[" "?" expr "]"
"""
# Functions whose names have a namespace (``optional.of``, ``strings.quote``): they parse as
# methods of an identifier and are turned into calls of the dotted name.
NAMESPACED = {
    "optional": frozenset({"of", "none", "ofNonZeroValue"}),
    "strings": frozenset({"quote"}),
    "sets": frozenset({"contains", "equivalent", "intersects"}),
    "ip": frozenset({"isCanonical"}),
    "format": frozenset({"named", *FORMATS}),  # Kubernetes' format library
}

_PARSER: Lark | None = None


def _bool_literal(token: Token) -> Token:
    """``true`` and ``false`` lex as identifiers; they are bool literals."""
    if token.value in ("true", "false"):
        return Token("BOOL_LIT", token.value)
    return token


def _parser() -> Lark:
    global _PARSER
    if _PARSER is None:
        grammar = (Path(celpy.__file__).parent / "cel.lark").read_text()
        _PARSER = Lark(
            grammar + _OPTIONAL_SELECTION,
            parser="lalr",
            start="expr",
            g_regex_flags=re.M,
            lexer_callbacks={"IDENT": _bool_literal},
            propagate_positions=True,
            maybe_placeholders=False,
            priority="invert",
        )
        # cel-python builds its own parser for each process unless one is there: share ours
        # (a superset of its grammar), so a process builds one instead of two (0.4 s CPU each)
        CELParser.CEL_PARSER = _PARSER
    return _PARSER


def parse(text: str) -> Any:
    """The parse tree of ``text``, or cel-python's CELParseError at the syntax error."""
    try:
        tree = _parser().parse(text)
    except (UnexpectedToken, UnexpectedCharacters) as exc:
        raise CELParseError(exc.get_context(text), line=exc.line, column=exc.column) from None
    except (LexError, ParseError) as exc:
        raise CELParseError(str(exc.args[0]).splitlines()[0]) from None
    _rewrite_namespaced_calls(tree)
    _rewrite_selection_through_optionals(tree)
    return tree


_OPTIONAL_OF = {"member_dot": "member_dot_opt", "member_index": "member_index_opt"}


def _rewrite_selection_through_optionals(tree: Any) -> None:
    """``m.?a.b`` and ``m.?a[k]``: a selection from an optional is itself optional, so each plain
    selection after a ``.?``/``[?`` in its chain becomes one (decided once, here, rather than at
    every evaluation). Subtrees come bottom-up, so a chain is rewritten from its start."""
    for node in tree.iter_subtrees():
        if node.data not in _OPTIONAL_OF:
            continue
        target = node.children[0]
        step = target.children[0] if isinstance(target, Tree) and target.children else None
        if isinstance(step, Tree) and step.data in _OPTIONAL_OF.values():
            node.data = _OPTIONAL_OF[str(node.data)]


def _is_identifier(node: Any, name: str) -> bool:
    return (
        isinstance(node, Tree)
        and node.data == "primary"
        and isinstance(node.children[0], Tree)
        and node.children[0].data == "ident"
        and str(node.children[0].children[0]) == name
    )


def _rewrite_namespaced_calls(tree: Any) -> None:
    for node in list(tree.iter_subtrees()):
        if node.data != "member":
            continue
        for at, child in enumerate(node.children):
            if not (isinstance(child, Tree) and child.data == "member_dot_arg"):
                continue
            target, name = child.children[0], child.children[1]
            receiver = target.children[0] if isinstance(target, Tree) and target.children else None
            namespace = next(
                (n for n, names in NAMESPACED.items() if _is_identifier(receiver, n)), None
            )
            if namespace is None or str(name) not in NAMESPACED[namespace]:
                continue
            assert isinstance(receiver, Tree) and isinstance(receiver.children[0], Tree)
            ident = receiver.children[0].children[0]
            assert isinstance(ident, Token)
            function = Token.new_borrow_pos("IDENT", f"{namespace}.{name}", ident)
            call = Tree("ident_arg", [function, *child.children[2:]], meta=child.meta)
            node.children[at] = Tree("primary", [call], meta=child.meta)

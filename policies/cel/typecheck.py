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
from typing import Any

from lark import Token, Tree

from cdigen.policies.cel import comprehensions
from cdigen.policies.cel.cel_types import (
    BOOL,
    DYN,
    INT,
    LITERALS,
    OBJECT_FIELDS,
    STRING,
    TYPE_NAMES,
    UINT,
    Bindings,
    CelType,
    assignable,
    common_type,
    comprehension_result,
    comprehension_variables,
    list_of,
    map_of,
    optional_of,
    type_of,
)
from cdigen.policies.cel.errors import CelCompileError
from cdigen.policies.cel.literal_checks import (
    integer_in_range,
    regex_compiles,
    time_literal_converts,
)
from cdigen.policies.cel.overloads import OPERATORS, did_you_mean, is_declared, overload_result
from cdigen.policies.cel.parse_tree import (
    call_position,
    list_literal,
    operator_position,
    string_literal,
    tree_position,
    unwrap,
)

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
        line, column = tree_position(where)
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
        if not is_declared(name, member):
            raise self.fail(
                f"undeclared reference to {name!r} (in container ''){did_you_mean(name, member)}",
                name_at or where,
            )
        result = overload_result(name, args, member)
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
        name, symbol = OPERATORS[step.data]
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
        kind = LITERALS.get(token.type, DYN)
        if kind in (INT, UINT) and not integer_in_range(str(token), kind):  # cel-go's parser
            raise self.fail(f"invalid {kind} literal", token)
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
            joined = common_type(elem, current)
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
            joined_key, joined_value = common_type(key, k), common_type(value, v)
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
            if not assignable(Bindings(), STRING, target.params[0]):
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
        literal = string_literal(argument)
        if literal is not None and not time_literal_converts(name, literal):
            self.validation.append(self.fail(f"invalid {name} argument", argument))

    def _has(self, args: Sequence[Any], node: Any) -> CelType:
        selection = unwrap(args[0]) if len(args) == 1 else None
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
        where = call_position(name_token)
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
        ranged = comprehension_variables(target, names)
        if ranged is None:
            raise self.fail(
                f"expression of type '{target}' cannot be range of a comprehension (must be "
                "list, map, or dynamic)",
                target_node,
            )
        key, scope = ranged
        self.scopes.append(scope)
        try:
            types = [self.check(b) for b in bodies]
        finally:
            self.scopes.pop()
        if len(types) == 2 or name in ("all", "exists", "exists_one", "existsOne", "filter"):
            step = "_&&_" if name in ("all", "filter") or len(types) == 2 else "_||_"
            self.resolve(step, (BOOL, types[0]), False, bodies[0])
        result = comprehension_result(name, key, scope[names[0]], types[-1])
        if result is None:  # transformMapEntry
            raise self.fail(
                f"found no matching overload for 'transformMapEntry' applied to '{types[-1]}'",
                bodies[-1],
            )
        return result

    def _regex_literal(self, pattern: Any) -> None:
        literal = string_literal(pattern)
        if literal is not None and not regex_compiles(literal):
            self.validation.append(self.fail("invalid matches argument", pattern))

    def _format_literal(self, target_node: Any, args_node: Any) -> None:
        """cel-go's format validator: a literal format string with a literal list of
        arguments must agree with them, clause by clause, when the expression is created."""
        text = string_literal(target_node)
        elements = list_literal(args_node)
        if text is None or elements is None:
            return
        from cdigen.policies.cel.formatting import FormatError, check_format

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
        return operator_position(self.text, left, symbol)


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

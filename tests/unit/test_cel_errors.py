"""CEL run-time errors: what a policy author reads, and the cel-python behaviour it rests on.

cdigen.policies.cel translates cel-python's errors from data (the exception class, the parse-tree
node or token, ``__cause__``), never from message texts. The ``test_cel_python_*`` tests pin what
that data looks like in the cel-python versions pyproject.toml allows: when one fails after an
upgrade, adapt policies/cel/errors.py and the pin together.
"""

from __future__ import annotations

import tomllib
from importlib.metadata import version
from pathlib import Path
from typing import Any

import celpy
import pytest
from celpy.evaluation import CELEvalError
from lark import Token, Tree
from packaging.requirements import Requirement

import cdigen.policies.cel
from cdigen.policies.cel import (
    CelCompileError,
    CelEvaluationError,
    OperandTypeError,
    compile_expression,
    device_value,
)
from cdigen.policies.cel import limits as cel_limits
from tests.helpers.cel import DEVICE_A, NODE_A

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def _pinned(name: str) -> Requirement:
    dependencies = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    found = [Requirement(d) for d in dependencies if Requirement(d).name == name]
    assert found, f"{name} is not declared in pyproject.toml"
    return found[0]


@pytest.mark.parametrize("name", ["cel-python", "lark"])
def test_installed_versions_are_the_pinned_ones(name: str) -> None:
    requirement = _pinned(name)
    assert requirement.specifier.contains(version(name)), (name, version(name), requirement)
    assert any(s.operator == "<" for s in requirement.specifier), f"{name} has no upper bound"


def _raw(
    text: str, activation: dict[str, Any], functions: dict[str, Any] | None = None
) -> CELEvalError:
    """The CELEvalError cel-python itself raises for ``text`` (no cdigen.policies.cel in
    between)."""
    env = celpy.Environment()
    with pytest.raises(CELEvalError) as info:
        env.program(env.compile(text), functions=functions).evaluate(activation)
    return info.value


def test_cel_python_marks_a_missing_member_by_node_and_class() -> None:
    result = _raw("m.nope == 1", {"m": celpy.celtypes.MapType({})})
    assert result.args[1] is KeyError
    assert isinstance(result.tree, Tree) and result.tree.data == "member_dot"
    name = result.tree.children[1]
    assert isinstance(name, Token) and str(name) == "nope" and name.column == 3


def test_cel_python_keeps_an_operators_type_error_as_the_cause() -> None:
    class Marked(TypeError):
        pass

    def greater(left: Any, right: Any) -> Any:
        raise Marked("x")

    result = _raw("1 > 2", {}, {"_>_": greater})
    assert isinstance(result.__cause__, Marked)


def test_cel_python_marks_unknown_functions_and_variables_by_token_and_node() -> None:
    function = _raw("nosuch(1)", {})
    assert function.args[1] is KeyError
    assert str(function.token) == "nosuch"
    variable = _raw("x == 1", {})
    assert variable.args[1] is KeyError
    assert isinstance(variable.tree, Tree) and variable.tree.data == "primary"
    assert variable.tree.children[0].data == "ident"


def _error(text: str) -> CelEvaluationError:
    with pytest.raises(CelEvaluationError) as info:
        compile_expression(text).evaluate({"device": device_value(DEVICE_A, NODE_A)})
    return info.value


def test_a_missing_attribute_points_at_the_name_that_is_missing() -> None:
    # "pciBusId" is in cdigen.dev, not in gpu.nvidia.com: the error is about the second one
    text = (
        'device.attributes["cdigen.dev"].pciBusId != "" && '
        'device.attributes["gpu.nvidia.com"].pciBusId != ""'
    )
    error = _error(text)
    assert str(error) == "no attribute 'pciBusId' in that domain (guard with has(...))"
    assert (error.line, error.column) == (1, text.rindex("pciBusId") + 1)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("dyn(1) > 'a'", "no operator > between int and string"),
        ("dyn(1) % dyn('a') == 0", "no operator % between int and string"),
        ("dyn([1]) - dyn({}) == 1", "no operator - between list and map"),
        ("dyn('a') + dyn(1) == 'a'", "no operator + between string and int"),
        (
            ('dyn(device.capacity["gpu.nvidia.com"].memory) >= dyn(quantity("1Gi"))'),
            "no operator >= between quantity and quantity (compare quantities with compareTo)",
        ),
    ],
)
def test_operator_type_errors_name_the_operator_and_the_types(text: str, message: str) -> None:
    """Operands of unknown type (dyn) that meet no overload when run; of declared types, the
    compile-time check refuses them first (tests/unit/test_cel_kubernetes.py)."""
    error = _error(text)
    assert str(error) == message
    assert (error.line, error.column) == (1, 1)


def test_unknown_functions_are_undeclared_references_when_compiled() -> None:
    for text, column in (("nosuch(1)", 1), ("device.driver.nosuch()", 15)):
        with pytest.raises(CelCompileError) as info:
            compile_expression(text)
        assert str(info.value) == "undeclared reference to 'nosuch' (in container '')"
        assert info.value.column == column


def test_a_variable_missing_from_the_activation_is_an_undeclared_reference() -> None:
    program = compile_expression("allocation.size == 1")
    with pytest.raises(CelEvaluationError, match=r"^undeclared reference to 'allocation'$"):
        program.evaluate({"device": device_value(DEVICE_A, NODE_A)})


def test_other_messages_pass_through_bounded() -> None:
    error = _error("int('x' + 'y'.replace('y', 'z')) == 1")
    assert 0 < len(str(error)) <= 200


def test_operand_type_error_is_a_type_error() -> None:
    error = OperandTypeError("<", celpy.celtypes.IntType(1), celpy.celtypes.StringType("a"))
    assert isinstance(error, TypeError) and str(error) == "no operator < between int and string"


def test_the_packages_limits_are_the_ones_the_evaluator_reads() -> None:
    saved = cdigen.policies.cel.MAX_VALUE_LENGTH
    try:
        cdigen.policies.cel.MAX_VALUE_LENGTH = 3
        assert cel_limits.MAX_VALUE_LENGTH == 3
        with pytest.raises(CelEvaluationError, match="over 3 characters"):
            compile_expression("'ab' + 'cd' == 'abcd'", frozenset()).evaluate({})
    finally:
        cdigen.policies.cel.MAX_VALUE_LENGTH = saved
    assert compile_expression("'ab' + 'cd' == 'abcd'", frozenset()).evaluate({}) is True

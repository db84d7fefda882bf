"""The CEL dialect: the table of cases in ../shared/reference/cel-dialect.md, and the extensions."""

from __future__ import annotations

from fractions import Fraction

import pytest

from cdigen.policies.cel import (
    CelCompileError,
    CelEvaluationError,
    compile_expression,
    device_value,
    parse_quantity,
    parse_semver,
)
from tests.helpers.cel import DEVICE_A, NODE_A

ERROR = "error"

# (expression, expected): the reference table, row for row.
REFERENCE_TABLE = [
    ('device.driver == "gpu.nvidia.com"', True),
    ('device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0', True),
    ('device.capacity["gpu.nvidia.com"].memory.isGreaterThan(quantity("80Gi"))', False),
    ('device.capacity["gpu.nvidia.com"].memory == quantity("81920Mi")', True),
    ('device.attributes["gpu.nvidia.com"].productName.lowerAscii().matches("^.*a100.*$")', True),
    (
        'device.attributes["gpu.nvidia.com"].driverVersion.isGreaterThan(semver("535.0.0"))',
        True,
    ),
    ('device.attributes["gpu.nvidia.com"].cudaComputeCapability.major() >= 8', True),
    ('has(device.attributes["other.example.com"].x)', False),
    ('device.attributes["gpu.nvidia.com"].noSuchName == "x"', ERROR),
    ('has(device.attributes["gpu.nvidia.com"].noSuchName)', False),
    (
        'cel.bind(a, device.attributes["gpu.nvidia.com"], '
        'a.type == "gpu" && a.architecture == "Ampere")',
        True,
    ),
    ('device.capacity["gpu.nvidia.com"].memory > 1', ERROR),
    ('device.attributes["gpu.nvidia.com"].productName', ERROR),
]

MORE_CASES = [
    ('device.attributes["gpu.nvidia.com"].productName.startsWith("NVIDIA A100")', True),
    ('"productName" in device.attributes["gpu.nvidia.com"]', True),
    ('device.attributes["cdigen.dev"].numaNode == 3', True),
    ('device.attributes["cdigen.dev"].index == 0', True),
    ('device.attributes["resource.kubernetes.io"].pciBusID == "0000:07:00.0"', True),
    ('device.attributes["gpu.nvidia.com"].cudaDriverVersion.isLessThan(semver("12.5.0"))', True),
    ('device.capacity["gpu.nvidia.com"].memory.asInteger() == 85899345920', True),
    ('device.capacity["gpu.nvidia.com"].memory.asApproximateFloat() > 8.5e10', True),
    ('quantity("1.5Gi").add(quantity("512Mi")) == quantity("2Gi")', True),
    ('quantity("1Gi").sub(1073741824) == quantity("0")', True),
    ('quantity("1k").compareTo(quantity("1000")) == 0', True),
    ('quantity("100m").isLessThan(quantity("1"))', True),
    ('isQuantity("12Qi")', False),
    ('semver("v1.2", true) == semver("1.2.0")', True),
    ('isSemver("1.2")', False),
    ('semver("1.0.0-rc.1").isLessThan(semver("1.0.0"))', True),
    ('"a,b,c".split(",").size() == 3', True),
    ('"A100-80".replace("-", " ") == "A100 80"', True),
    ("2.5 > 2", True),
    ('device.attributes["gpu.nvidia.com"].productName + 1 == "x"', ERROR),
    ('quantity("12Qi") == quantity("1")', ERROR),
]


def _run(expression: str) -> bool | str:
    """The value, or ERROR for an error when compiled (as the API server's type check) or run."""
    try:
        return compile_expression(expression).evaluate({"device": device_value(DEVICE_A, NODE_A)})
    except (CelCompileError, CelEvaluationError):
        return ERROR


@pytest.mark.parametrize(("expression", "expected"), REFERENCE_TABLE)
def test_reference_table(expression: str, expected: bool | str) -> None:
    assert _run(expression) == expected


@pytest.mark.parametrize(("expression", "expected"), MORE_CASES)
def test_more_cases(expression: str, expected: bool | str) -> None:
    assert _run(expression) == expected


def test_unknown_name_error_points_at_the_name() -> None:
    text = 'device.attributes["gpu.nvidia.com"].productNmae == "x"'
    with pytest.raises(CelEvaluationError) as info:
        compile_expression(text).evaluate({"device": device_value(DEVICE_A, NODE_A)})
    assert "productNmae" in str(info.value)
    assert (info.value.line, info.value.column) == (1, text.index("productNmae") + 1)


def test_syntax_error_has_a_position() -> None:
    with pytest.raises(CelCompileError) as info:
        compile_expression('device.driver == "gpu.nvidia.com" &&')
    assert info.value.line == 1 and info.value.column is not None


def test_undeclared_variable_is_a_compile_error() -> None:
    with pytest.raises(CelCompileError) as info:
        compile_expression(
            "allocation.size == 1 && devise.driver == 'x'", frozenset({"allocation"})
        )
    assert "devise" in str(info.value) and info.value.column == 25


def test_macro_variables_are_not_undeclared() -> None:
    program = compile_expression(
        "allocation.numaNodes.all(n, n == 0) && cel.bind(k, 2, k == 2)", frozenset({"allocation"})
    )
    assert program is not None


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("40Gi", Fraction(40 * 2**30)),
        ("81920Mi", Fraction(80 * 2**30)),
        ("1.5", Fraction(3, 2)),
        ("100m", Fraction(1, 10)),
        ("2k", Fraction(2000)),
        ("1e3", Fraction(1000)),
        ("-1Ki", Fraction(-1024)),
        ("5E", Fraction(5 * 10**18)),
    ],
)
def test_quantity_parsing(text: str, value: Fraction) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "Gi", "1 Gi", "1GiB", "1.2.3", " 1"])
def test_bad_quantities_are_rejected(text: str) -> None:
    with pytest.raises(ValueError):
        parse_quantity(text)


def test_semver_normalisation() -> None:
    assert str(parse_semver("535.104.05", normalize=True)) == "535.104.5"
    assert str(parse_semver("v8.0", normalize=True)) == "8.0.0"
    with pytest.raises(ValueError):
        parse_semver("535.104.05")

"""The CEL environment of policies, in the Kubernetes DRA dialect, on top of cel-python.

- ``device``: ``driver``, ``attributes[domain][name]``, ``capacity[domain][name]`` (a Quantity).
  An unknown domain is an empty map; an unknown name inside a domain is an evaluation error.
- ``allocation`` (set constraints only): ``devices`` (device maps), ``numaNodes``, ``size``,
  ``linkScore``, ``minPairNVLinks``.
- Extensions as in Kubernetes: ``quantity()``, ``isQuantity()``, ``semver()``, ``isSemver()``,
  ``compareTo``/``isGreaterThan``/``isLessThan``, ``asInteger``/``asApproximateFloat``/``add``/
  ``sub``, ``major``/``minor``/``patch``, ``lowerAscii``/``split``/``replace``, ``cel.bind``.

The parts: :mod:`.quantity` and :mod:`.semver` (the value types), :mod:`.functions` (the
extension functions), :mod:`.limits` (size, nesting, cost and time limits), :mod:`.errors`,
:mod:`.compiler` (``compile_expression``) and :mod:`.values` (``device``, ``allocation``).

The limits live in :mod:`.limits`; reading or setting ``cdigen.policies.cel.COST_LIMIT`` (and the
other names in ``LIMIT_NAMES``) reads or sets them there, so that a caller (or a test) that
tunes ``cdigen.policies.cel.EVAL_TIME_LIMIT_S`` tunes what the evaluator uses.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from cdigen.policies.cel import limits
from cdigen.policies.cel.compiler import ALLOCATION_FACTS, CelProgram, compile_expression
from cdigen.policies.cel.errors import CelCompileError, CelEvaluationError, OperandTypeError
from cdigen.policies.cel.library import FUNCTIONS
from cdigen.policies.cel.quantity import Quantity, parse_quantity
from cdigen.policies.cel.semver import Semver, parse_semver
from cdigen.policies.cel.values import (
    CDIGEN_DOMAIN,
    DRIVER,
    KUBERNETES_DOMAIN,
    DomainMap,
    allocation_value,
    device_value,
)

# The limits, declared for type checkers: their values are the properties of ``_Package`` below,
# over cdigen.policies.cel.limits (annotations alone bind nothing here).
MAX_EXPRESSION_BYTES: int
COST_LIMIT: int
MAX_NESTING: int
MAX_TREE_DEPTH: int
EVAL_TIME_LIMIT_S: float
MAX_VALUE_LENGTH: int
VALUE_SIZE_BOUND: int

LIMIT_NAMES = frozenset(
    {
        "MAX_EXPRESSION_BYTES",
        "COST_LIMIT",
        "MAX_NESTING",
        "MAX_TREE_DEPTH",
        "EVAL_TIME_LIMIT_S",
        "MAX_VALUE_LENGTH",
        "VALUE_SIZE_BOUND",
    }
)

__all__ = [
    "ALLOCATION_FACTS",
    "CDIGEN_DOMAIN",
    "COST_LIMIT",
    "DRIVER",
    "EVAL_TIME_LIMIT_S",
    "FUNCTIONS",
    "KUBERNETES_DOMAIN",
    "LIMIT_NAMES",
    "MAX_EXPRESSION_BYTES",
    "MAX_NESTING",
    "MAX_TREE_DEPTH",
    "MAX_VALUE_LENGTH",
    "VALUE_SIZE_BOUND",
    "CelCompileError",
    "CelEvaluationError",
    "CelProgram",
    "DomainMap",
    "OperandTypeError",
    "Quantity",
    "Semver",
    "allocation_value",
    "compile_expression",
    "device_value",
    "parse_quantity",
    "parse_semver",
]


def _limit(name: str) -> property:
    """A property of the package that reads and sets ``name`` in
    :mod:`cdigen.policies.cel.limits`."""

    def read(_package: types.ModuleType) -> Any:
        return getattr(limits, name)

    def write(_package: types.ModuleType, value: Any) -> None:
        setattr(limits, name, value)

    return property(read, write, doc=f"cdigen.policies.cel.limits.{name}")


class _Package(types.ModuleType):
    """This package's module type: its limits are properties over
    :mod:`cdigen.policies.cel.limits`."""


for _name in sorted(LIMIT_NAMES):
    setattr(_Package, _name, _limit(_name))

sys.modules[__name__].__class__ = _Package

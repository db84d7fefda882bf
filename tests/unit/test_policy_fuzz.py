"""Fuzzed policies (issue 13): ``policy check`` never raises a traceback and never takes long,
whatever CEL or YAML it is given."""

from __future__ import annotations

import json
import time
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdigen.policies.policy import check_policy_file

ATOMS = st.sampled_from(
    [
        "device",
        "allocation",
        'device.attributes["gpu.nvidia.com"].productName',
        'device.attributes["cdigen.dev"].index',
        'device.capacity["gpu.nvidia.com"].memory',
        "allocation.size",
        "allocation.numaNodes",
        "allocation.devices",
        'quantity("1e99999999")',
        'quantity("40Gi")',
        'semver("1.2.3")',
        '"aaaaaaaaaa"',
        "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]",
        "9" * 30,
        "1.5e308",
        "true",
        "null",
        "x",
    ]
)


def _combine(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.tuples(
            children, st.sampled_from([" && ", " || ", " + ", " == ", " < ", " * "]), children
        ).map("".join),
        children.map(lambda c: f"({c})"),
        children.map(lambda c: f"!{c}"),
        children.map(lambda c: f"{c}.size()"),
        children.map(lambda c: f'{c}.replace("a", "aaaaaaaaaa")'),
        st.tuples(children, children).map(lambda t: f"{t[0]}.map(x, {t[1]})"),
        st.tuples(children, children).map(lambda t: f"{t[0]}.all(x, {t[1]})"),
        st.tuples(children, children).map(lambda t: f"cel.bind(x, {t[0]}, {t[1]})"),
        children.map(lambda c: f'{c}.compareTo(quantity("1"))'),
    )


EXPRESSIONS = st.one_of(
    st.recursive(ATOMS, _combine, max_leaves=12),
    st.text(max_size=60),
    st.integers(1, 300).map(lambda n: "(" * n + "true" + ")" * n),
    st.integers(1, 1000).map(lambda n: " + ".join(["1"] * n) + " > 0"),
)


@settings(
    max_examples=40,
    deadline=5000,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(selector=EXPRESSIONS, constraint=EXPRESSIONS)
def test_policy_check_answers_every_policy_in_lines(
    tmp_path: Path, selector: str, constraint: str
) -> None:
    path = tmp_path / "fuzz.yaml"
    path.write_text(
        "apiVersion: cdigen/v1alpha1\nkind: AllocationPolicy\nmetadata: {name: fuzz}\n"
        f"spec:\n  selector: {json.dumps(selector)}\n  constraints: [{json.dumps(constraint)}]\n"
    )
    start = time.thread_time()
    problems = check_policy_file(path)  # raises nothing
    assert time.thread_time() - start < 5
    assert all(isinstance(p, str) and "Traceback" not in p for p in problems)

"""Policy files: loading, the built-in policies, and every kind of bad file."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from cdigen.cli import main
from cdigen.errors import InputError
from cdigen.policies.policy import BUILTIN_NAMES, builtin_policy, check_policy_file, load_policy
from tests.helpers.nodes import dgx_a100

GOOD = """\
apiVersion: cdigen/v1alpha1
kind: AllocationPolicy
metadata: {name: big-gpus-same-numa}
spec:
  resource: nvidia.com/gpu
  selector: >-
    device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0 &&
    device.attributes["gpu.nvidia.com"].productName.startsWith("NVIDIA A100")
  constraints:
    - allocation.numaNodes.size() == 1
    - >-
      allocation.devices.all(d, d.attributes["gpu.nvidia.com"].productName ==
      allocation.devices[0].attributes["gpu.nvidia.com"].productName)
  linkWeights: {NVLINK: 100, PIX: 50, PXB: 40, PHB: 30, NODE: 20, SYS: 10}
"""


def write(tmp_path: Path, text: str, name: str = "policy.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_good_policy_loads_and_checks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, GOOD)
    policy = load_policy(path)
    assert policy.name == "big-gpus-same-numa"
    assert policy.selector is not None and len(policy.constraints) == 2
    assert main(["policy", "check", str(path)]) == 0
    assert "ok" in capsys.readouterr().out


def test_selector_results_on_a_real_node(tmp_path: Path) -> None:
    policy = load_policy(write(tmp_path, GOOD))
    node = dgx_a100()
    assert all(policy.selector_result(g, node) == (True, None) for g in node.gpus)


@pytest.mark.parametrize("name", BUILTIN_NAMES)
def test_builtin_policies_load(name: str) -> None:
    policy = builtin_policy(name)
    assert policy.name == name
    assert load_policy(f"builtin:{name}").name == name


def test_unknown_builtin_is_a_clear_error() -> None:
    with pytest.raises(InputError, match="unknown built-in policy 'fastest'"):
        builtin_policy("fastest")


def _check(tmp_path: Path, text: str) -> list[str]:
    return check_policy_file(write(tmp_path, text))


def test_bad_yaml(tmp_path: Path) -> None:
    problems = _check(tmp_path, "apiVersion: [unclosed\n")
    assert len(problems) == 1
    assert "policy.yaml" in problems[0] and "line" in problems[0] and "YAML" in problems[0]


def test_bad_schema_names_the_field(tmp_path: Path) -> None:
    problems = _check(tmp_path, GOOD.replace("linkWeights: {NVLINK", "linkWeights: {NVLNK"))
    assert any("spec.linkWeights" in p and "NVLNK" in p for p in problems)


def test_missing_file(tmp_path: Path) -> None:
    problems = check_policy_file(tmp_path / "nope.yaml")
    assert problems and "not found" in problems[0]


def test_cel_syntax_error_names_file_field_and_position(tmp_path: Path) -> None:
    text = GOOD.replace("allocation.numaNodes.size() == 1", "allocation.numaNodes.size() == ")
    problems = _check(tmp_path, text)
    assert len(problems) == 1
    assert "policy.yaml: spec.constraints[0] (line 1, column" in problems[0]
    assert "syntax error" in problems[0]


def test_cel_type_error_is_caught_when_compiled_as_the_api_server_does(tmp_path: Path) -> None:
    text = GOOD.replace('memory.compareTo(quantity("40Gi")) >= 0', "memory > 1")
    problems = _check(tmp_path, text)
    assert len(problems) == 1
    assert "spec.selector (line 1, column 42)" in problems[0]
    assert "no matching overload for '_>_' applied to '(kubernetes.Quantity, int)'" in problems[0]


def test_cel_non_bool_result(tmp_path: Path) -> None:
    text = GOOD.replace("allocation.numaNodes.size() == 1", "allocation.numaNodes.size()")
    problems = _check(tmp_path, text)
    assert len(problems) == 1 and "spec.constraints[0]" in problems[0] and "bool" in problems[0]


def test_cel_typo_in_a_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, GOOD.replace("productName.startsWith", "productNmae.startsWith"))
    assert main(["policy", "check", str(path)]) == 1
    err = capsys.readouterr().err
    assert "spec.selector (line 1, column" in err and "productNmae" in err
    assert "policy check failed" in err


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            "productName.startsWith",
            "productNmae.startsWith",
            "spec.selector (line 1, column 114): no attribute 'productNmae' in gpu.nvidia.com (did "
            "you mean 'productName'?) (trial evaluation on a sample A100)",
        ),
        (
            ".startsWith(",
            ".startWith(",
            "spec.selector (line 1, column 126): undeclared reference to 'startWith' (in container "
            "'') (did you mean 'startsWith'?)",
        ),
        (
            "allocation.numaNodes.size() == 1",
            "allocation.numaNode.size() == 1",
            "spec.constraints[0] (line 1, column 12): allocation has no field 'numaNode' (did you "
            "mean 'numaNodes'?); its fields: devices, linkScore, minPairNVLinks, numaNodes, size "
            "(trial evaluation on a sample A100)",
        ),
        (
            '.memory.compareTo(quantity("40Gi"))',
            '.memory.compareTo(quantity("40Gi")',
            "spec.selector (line 1, column 51): syntax error: missing ')' to close this '(': ",
        ),
    ],
    ids=["attribute", "function", "allocation-field", "missing-paren"],
)
def test_cel_mistakes_say_what_was_meant(tmp_path: Path, old: str, new: str, message: str) -> None:
    """Rough edge 6 of issue 26: was 'no attribute ... in that domain (guard with has(...))'
    for every misspelt name, no did-you-mean, and 'syntax error near ...' for a missing ')'."""
    assert old in GOOD
    problems = _check(tmp_path, GOOD.replace(old, new))
    assert len(problems) == 1 and message in problems[0], problems


def test_wrong_variable_for_the_field(tmp_path: Path) -> None:
    problems = _check(
        tmp_path, GOOD.replace("allocation.numaNodes.size() == 1", "device.driver == 'x'")
    )
    assert len(problems) == 1 and "undeclared reference to 'device'" in problems[0]


def test_runtime_error_makes_the_device_not_match(tmp_path: Path) -> None:
    """A check that passes on the sample but errors on a real device: not matching, not fatal."""
    text = GOOD.replace(
        'productName.startsWith("NVIDIA A100")',
        'driverVersion.isGreaterThan(semver("535.0.0"))',
    )
    policy = load_policy(write(tmp_path, text))
    node = dataclasses.replace(dgx_a100(), driver_version="")  # no driverVersion attribute
    passed, reason = policy.selector_result(node.gpus[0], node)
    assert passed is False and reason is not None and "driverVersion" in reason
    good_node = dgx_a100()
    assert policy.selector_result(good_node.gpus[0], good_node) == (True, None)


def test_load_policy_raises_input_error_with_the_first_problem(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace("== 1", "=="))
    with pytest.raises(InputError, match=r"spec\.constraints\[0\]"):
        load_policy(path)


def test_check_several_files_reports_all(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = write(tmp_path, GOOD, "good.yaml")
    bad = write(tmp_path, "kind: Nope\n", "bad.yaml")
    assert main(["policy", "check", str(good), str(bad)]) == 1
    err = capsys.readouterr().err
    assert "bad.yaml" in err and "good.yaml" not in err


def test_constraint_error_at_run_time_falls_back_to_a_valid_answer(tmp_path: Path) -> None:
    from cdigen.policies.allocator import AllocationRequest, Allocator

    text = GOOD.replace(
        "allocation.numaNodes.size() == 1",
        'allocation.devices.all(d, d.attributes["gpu.nvidia.com"].driverVersion.major() > 500)',
    )
    policy = load_policy(write(tmp_path, text))  # passes: the sample has a driverVersion
    node = dataclasses.replace(dgx_a100(), driver_version="")  # this node has none
    answer = Allocator(node, policy).prefer(AllocationRequest(("0", "1", "2"), (), 2))
    assert len(answer.devices) == 2
    assert "no available set satisfies the policy constraints" in (answer.fallback_reason or "")

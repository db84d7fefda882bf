"""CEL bounded the way Kubernetes bounds it (issue 13, point 4), and the checks that said ok too
early (point 8): policy check on every sample node, replay validated like explain."""

from __future__ import annotations

import threading
from fractions import Fraction
from pathlib import Path

import pytest

from cdigen.cli import main
from cdigen.discover import load_node
from cdigen.errors import InputError
from cdigen.plugin.deviceplugin.config import PluginConfig
from cdigen.plugin.deviceplugin.runner import Plugin
from cdigen.policies import cel
from cdigen.policies.cel import (
    CelCompileError,
    CelEvaluationError,
    compile_expression,
    device_value,
    parse_quantity,
)
from cdigen.policies.policy import check_policy_file, load_policy
from tests.helpers.specs import write_spec
from tests.kubelet_sim import KubeletSimulator

RESOURCE = "nvidia.com/gpu"
DEEP_PARENS = "(" * 100 + "true" + ")" * 100
NINE_REPLACES = '"aaaaaaaaaa"' + '.replace("a", "aaaaaaaaaa")' * 9 + ".size() > 0"
TEN = "[1,2,3,4,5,6,7,8,9,10]"
NESTED_MAP = f"{TEN}.map(a, {TEN}.map(b, {TEN}.map(c, {TEN}.map(d, {TEN}.map(e, a+b+c+d+e)))))"


def policy_text(name: str, selector: str | None = None, constraints: list[str] = ()) -> str:  # type: ignore[assignment]
    """A policy document (JSON-quoted CEL, so any expression fits in YAML)."""
    import json

    lines = [
        "apiVersion: cdigen/v1alpha1",
        "kind: AllocationPolicy",
        f"metadata: {{name: {name}}}",
        "spec:",
    ]
    if selector is not None:
        lines.append(f"  selector: {json.dumps(selector)}")
    if constraints:
        lines.append("  constraints:")
        lines.extend(f"    - {json.dumps(c)}" for c in constraints)
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- quantities


def test_quantity_with_a_huge_exponent_is_capped_like_kubernetes() -> None:
    assert parse_quantity("1e99999999") == 2**63 - 1
    assert parse_quantity("-1e99999999") == -(2**63 - 1)
    assert parse_quantity("1e-99999999") == Fraction(1, 10**9)  # rounded up to 1n
    assert parse_quantity("1.5e-10") == Fraction(1, 10**9)
    assert parse_quantity("40Gi") == 40 * 2**30
    with pytest.raises(ValueError, match="does not fit an int32"):
        parse_quantity("1e99999999999")
    with pytest.raises(ValueError, match="more than 64 digits"):
        parse_quantity("1" * 5000)


def test_the_quantity_selector_evaluates_at_once() -> None:
    node = load_node("builtin:dgx-a100")
    program = compile_expression(
        'quantity("1e99999999").isGreaterThan(device.capacity["gpu.nvidia.com"].memory)',
        frozenset({"device"}),
    )
    assert program.evaluate({"device": device_value(node.gpus[0], node)}) is True


# --------------------------------------------------------------------------- compile-time limits


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        (DEEP_PARENS, "nested too deeply"),
        (" + ".join(["1"] * 400) + " > 0", "nested too deeply"),
        ("!" * 400 + "true", "nested too deeply"),
        (NINE_REPLACES, "too complex, exceeds cost limit"),
        (f"{NESTED_MAP}.size() > 0", "too complex, exceeds cost limit"),
        (
            "cel.bind(a, 'xxxxxxxx', "
            + "".join(
                f"cel.bind({v}, {p} + {p}, "
                for v, p in zip("bcdefghijklmnopq", "abcdefghijklmnop", strict=True)
            )
            + "q.size() > 0"
            + ")" * 16
            + ")",
            "too complex, exceeds cost limit",
        ),
    ],
    ids=["parens", "plus-chain", "not-chain", "replace", "map", "bind-doubling"],
)
def test_expressions_past_a_limit_are_refused_at_compile_time(
    expression: str, message: str
) -> None:
    with pytest.raises(CelCompileError, match=message) as info:
        compile_expression(expression, frozenset({"device"}))
    assert info.value.line is not None


def test_ordinary_expressions_stay_well_under_the_cost_limit() -> None:
    for path in sorted(Path("docs/policies").glob("*.yaml")):
        policy = load_policy(path)
        for expression in [policy.selector, *policy.constraints]:
            if expression is not None:
                assert expression.program.cost < cel.COST_LIMIT // 100


def test_policy_check_names_file_field_and_position_of_a_limit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text(policy_text("deep", selector=DEEP_PARENS))
    assert main(["policy", "check", str(path)]) != 0
    err = capsys.readouterr().err
    first = err.splitlines()[0]
    assert first.startswith(f"{path}: spec.selector (line 1, column ")
    assert "nested too deeply" in first
    assert "Traceback" not in err and "RecursionError" not in err


def test_an_expression_over_the_size_limit_is_one_short_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # docs/policies.md, Limits: the size limit's error names the limit, not 10 KiB of CEL
    path = tmp_path / "long.yaml"
    path.write_text(policy_text("long", selector="true && " * 1400 + "true"))
    assert main(["policy", "check", str(path)]) == 1
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith(f"{path}: spec.selector: ")
    assert "11,204 characters, at most 10,240" in first
    assert len(first) < 300, first


def test_plugin_serve_refuses_a_policy_past_a_limit_with_one_line(tmp_path: Path) -> None:
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "r.yaml").write_text(policy_text("r", selector=NINE_REPLACES))
    config = PluginConfig(
        plugin_dir=tmp_path / "plugins", spec_dirs=(tmp_path,), policy_dir=policies
    )
    plugin = Plugin(config, node=load_node("builtin:rtx4090"))
    with pytest.raises(InputError, match="too complex, exceeds cost limit") as info:
        plugin.start()
    plugin.stop()
    assert str(policies / "r.yaml") in str(info.value)


# --------------------------------------------------------------------------- run-time limits


def test_an_evaluation_past_the_time_limit_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    program = compile_expression(f"{TEN}.map(a, {TEN}.map(b, a + b)).size() > 0", frozenset())
    assert program.evaluate({}) is True
    monkeypatch.setattr(cel, "EVAL_TIME_LIMIT_S", 0.0)
    with pytest.raises(CelEvaluationError, match="time limit") as info:
        program.evaluate({})
    assert info.value.over_limit


def test_an_evaluation_past_the_cost_limit_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    program = compile_expression(f"{TEN}.map(a, {TEN}.map(b, a + b)).size() > 0", frozenset())
    monkeypatch.setattr(cel, "COST_LIMIT", 100)
    with pytest.raises(CelEvaluationError, match="exceeds the cost limit"):
        program.evaluate({})


def test_replace_never_builds_a_huge_string(monkeypatch: pytest.MonkeyPatch) -> None:
    program = compile_expression('"ab".replace("", "xxxx").size() > 0', frozenset())
    assert program.evaluate({}) is True
    monkeypatch.setattr(cel, "MAX_VALUE_LENGTH", 8)
    with pytest.raises(CelEvaluationError, match="replace"):
        program.evaluate({})


# --------------------------------------------------------------------------- reload (SIGHUP)


def test_reload_keeps_the_last_good_policy_and_answers_meanwhile(tmp_path: Path) -> None:
    """A policy past a limit on SIGHUP is refused; the one in force keeps answering; the
    quantity("1e99999999") policy is valid (capped as Kubernetes caps) and answers at once."""
    node = load_node("builtin:dgx-a100")
    write_spec(tmp_path / "cdi", [g.uuid for g in node.gpus])
    policies = tmp_path / "policies"
    policies.mkdir()
    good = policy_text("keep-gpu0-free", selector='device.attributes["cdigen.dev"].index != 0')
    (policies / "p.yaml").write_text(good)
    config = PluginConfig(
        plugin_dir=tmp_path / "plugins", spec_dirs=(tmp_path / "cdi",), policy_dir=policies
    )
    plugin = Plugin(config, node=node)
    uuids = [g.uuid for g in node.gpus]
    with KubeletSimulator(config.plugin_dir) as kubelet:
        plugin.start()
        try:
            kubelet.wait_registered(RESOURCE)
            assert kubelet.preferred(RESOURCE, uuids[:2], 1) == [uuids[1]]
            for bad in (DEEP_PARENS, NINE_REPLACES, f"{NESTED_MAP}.size() > 0"):
                (policies / "p.yaml").write_text(policy_text("bad", selector=bad))
                answers: list[list[str]] = []

                def call(answers: list[list[str]] = answers) -> None:
                    answers.append(kubelet.preferred(RESOURCE, uuids[:2], 1))

                caller = threading.Thread(target=call)
                caller.start()
                assert plugin.reload_policies() is False
                caller.join(5)
                assert answers == [[uuids[1]]]
                assert plugin.policy_for(RESOURCE) == "keep-gpu0-free"
                assert kubelet.preferred(RESOURCE, uuids[:2], 1) == [uuids[1]]
            quantity = 'quantity("1e99999999").isGreaterThan(quantity("1")) && '
            selector = quantity + 'device.attributes["cdigen.dev"].index != 1'
            (policies / "p.yaml").write_text(policy_text("quantity", selector=selector))
            assert plugin.reload_policies() is True
            assert plugin.policy_for(RESOURCE) == "quantity"
            assert kubelet.preferred(RESOURCE, uuids[:2], 1) == [uuids[0]]
        finally:
            plugin.stop()


# --------------------------------------------------------------------------- point 8


def test_a_type_error_behind_and_on_the_sample_gpu_is_found_on_another_node(
    tmp_path: Path,
) -> None:
    path = tmp_path / "hidden.yaml"
    selector = (
        'device.attributes["gpu.nvidia.com"].productName.contains("A100") || '
        'device.attributes["cdigen.dev"].index > "x"'
    )
    # (== between an int and a string is false, as in Kubernetes' CEL: ordering them errs)
    constraint = 'allocation.size < 3 || allocation.numaNodes[0] < "zero"'
    path.write_text(policy_text("hidden", selector=selector, constraints=[constraint]))
    problems = check_policy_file(path)
    assert len(problems) == 2
    assert problems[0].startswith(f"{path}: spec.selector (line 1, column ")
    assert "no operator > between int and string" in problems[0]
    assert "trial evaluation on builtin:" in problems[0]
    assert problems[1].startswith(f"{path}: spec.constraints[0]")
    assert "no operator < between int and string" in problems[1]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"available": ["0", 0], "size": 1}', "available lists a device twice: 0"),
        ('{"available": ["0", 1], "mustInclude": [1, "1"], "size": 2}', "mustInclude lists"),
        ('{"available": [true], "size": 1}', "must be a list of IDs"),
        ('{"available": ' + "[" * 100_000 + "]" * 100_000 + ', "size": 1}', "nested too deeply"),
        ('{"available": ["0"], "size": ' + "9" * 5000 + "}", "an integer of more than 4300 digits"),
    ],
    ids=["mixed-duplicate", "must-duplicate", "bool", "deep", "digits"],
)
def test_replay_refuses_what_explain_refuses_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str, message: str
) -> None:
    path = tmp_path / "requests.jsonl"
    path.write_text(line + "\n")
    argv = ["policy", "replay", "--node", "builtin:dgx-a100", "--requests", str(path)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert f"{path}:1" in err and message in err


def test_explain_and_replay_share_the_duplicate_check(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["policy", "explain", "--node", "builtin:dgx-a100", "--available", "0,1,0"]
    assert main([*argv, "--size", "1"]) == 2
    assert "--available lists a device twice: 0" in capsys.readouterr().err


def test_a_request_stops_evaluating_constraints_past_its_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A slow constraint never holds a kubelet call: past the request's CPU budget the sets
    not yet evaluated count as failing, and the answer is still a valid set."""
    from cdigen.policies import allocator as allocator_module
    from cdigen.policies.allocator import AllocationRequest, Allocator
    from cdigen.policies.expression import Expression
    from cdigen.policies.policy import Policy

    node = load_node("builtin:dgx2-v100")
    slow = compile_expression(
        'allocation.devices.all(d, d.attributes["cdigen.dev"].numaNode == 0)',
        frozenset({"allocation"}),
    )
    policy = Policy(name="slow", source="test", constraints=(Expression("c", slow),))
    monkeypatch.setattr(allocator_module, "CONSTRAINT_BUDGET_S", 0.0)
    available = tuple(str(g.index) for g in node.gpus)
    answer = Allocator(node, policy).prefer(AllocationRequest(available, (), 8))
    assert len(set(answer.devices)) == 8 and set(answer.devices) <= set(available)
    assert answer.fallback_reason and "constraint evaluation ran past" in answer.fallback_reason


def test_constraints_on_set_facts_give_the_answers_of_per_set_evaluation() -> None:
    """The facts cache (one evaluation per distinct allocation facts) changes no answer."""
    import random

    from cdigen.policies.allocator import AllocationRequest, Allocator

    node = load_node("builtin:dgx1-v100")
    policy = load_policy("docs/policies/numa-local-nvlink.yaml")
    cached = Allocator(node, policy)
    per_set = Allocator(node, policy)
    per_set.objective.fact_fields = None  # every set evaluated on its own, as before the cache
    rng = random.Random(5)
    ids = [str(g.index) for g in node.gpus]
    for _ in range(150):
        free = tuple(sorted(rng.sample(ids, rng.randint(1, len(ids))), key=int))
        request = AllocationRequest(free, (), rng.randint(1, len(free)))
        assert cached.prefer(request) == per_set.prefer(request)


def test_trial_evaluations_of_a_slow_policy_stop_at_their_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A check (and so a plugin start or reload) never runs for long: past the trial budget
    the expression is refused, naming the field."""
    from cdigen.policies import policy_trial as policy_module

    monkeypatch.setattr(policy_module, "TRIAL_BUDGET_S", 0.0)
    path = tmp_path / "slow.yaml"
    path.write_text(policy_text("slow", selector=f"{TEN}.map(a, {TEN}.map(b, a + b)).size() > 0"))
    problems = check_policy_file(path)
    assert len(problems) == 1
    assert problems[0].startswith(f"{path}: spec.selector (line 1, column 1): its trial")
    assert "took over" in problems[0]

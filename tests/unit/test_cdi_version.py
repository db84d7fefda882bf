"""The minimum cdiVersion a spec's content needs (CDI's specs-go/version.go rules)."""

from __future__ import annotations

from typing import Any

import pytest

from cdigen.cdi.version import minimum_version, version_shortfall
from cdigen.errors import InputError


def spec(*, name: str = "gpu0", kind: str = "nvidia.com/gpu", **edits: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"deviceNodes": [{"path": "/dev/nvidia0"}]}
    return {
        "cdiVersion": "0.3.0",
        "kind": kind,
        "devices": [{"name": name, "containerEdits": {**base, **edits}}],
    }


def test_plain_spec_needs_only_the_floor() -> None:
    assert minimum_version(spec()) == "0.3.0"


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        (spec(mounts=[{"hostPath": "/a", "containerPath": "/a", "type": "bind"}]), "0.4.0"),
        (spec(name="0"), "0.5.0"),
        (spec(deviceNodes=[{"path": "/dev/nvidia0", "hostPath": "/x/dev/nvidia0"}]), "0.5.0"),
        (spec(kind="nvidia.com/gpu.mig"), "0.6.0"),
        ({**spec(), "annotations": {"a": "b"}}, "0.6.0"),
        (spec(additionalGids=[44]), "0.7.0"),
        (spec(intelRdt={"closID": "x"}), "0.7.0"),
        (spec(intelRdt={"schemata": ["L3:0=f"]}), "1.1.0"),
        (spec(netDevices=[{"hostInterfaceName": "eth1", "name": "net0"}]), "1.1.0"),
    ],
)
def test_each_feature_raises_the_version(doc: dict[str, Any], expected: str) -> None:
    assert minimum_version(doc) == expected


def test_spec_level_edits_count_too() -> None:
    doc = {**spec(), "containerEdits": {"additionalGids": [1]}}
    assert minimum_version(doc) == "0.7.0"


def test_shortfall_names_the_feature() -> None:
    problem = version_shortfall(spec(name="0"), "0.4.0")
    assert problem is not None and "starts with a digit" in problem and "0.5.0" in problem
    assert version_shortfall(spec(name="0"), "0.5.0") is None
    assert version_shortfall(spec(name="0"), "1.1.0") is None


def test_unknown_version_is_an_input_error() -> None:
    with pytest.raises(InputError, match=r"unknown cdiVersion '0\.9\.0'"):
        version_shortfall(spec(), "0.9.0")


def test_malformed_documents_do_not_crash() -> None:
    assert minimum_version({"devices": "nope", "containerEdits": {"mounts": 5}}) == "0.3.0"

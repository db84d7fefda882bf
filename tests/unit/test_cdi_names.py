"""CDI naming rules: vendor, class, device names and qualified names."""

from __future__ import annotations

import pytest

from cdigen.cdi import names
from cdigen.errors import InputError


@pytest.mark.parametrize("vendor", ["nvidia.com", "ab", "vendor_1-x.y", "A9"])
def test_valid_vendors(vendor: str) -> None:
    assert names.vendor_problem(vendor) is None


@pytest.mark.parametrize("vendor", ["", "1nvidia", "nvidia.", "nv/idia", "nv idia", "-x", "x_"])
def test_invalid_vendors_say_why(vendor: str) -> None:
    problem = names.vendor_problem(vendor)
    assert problem is not None and repr(vendor) in problem and "start with a letter" in problem


@pytest.mark.parametrize("name", ["0", "1:2", "GPU-5bd4c9a2-aaaa", "MIG-x", "all", "gpu0", "a.b_c"])
def test_valid_device_names(name: str) -> None:
    assert names.device_name_problem(name) is None


@pytest.mark.parametrize("name", ["", "-0", "0-", "a b", "a/b", "a=b", ":0"])
def test_invalid_device_names(name: str) -> None:
    assert names.device_name_problem(name) is not None


def test_parse_qualified_name() -> None:
    assert names.parse_qualified_name("nvidia.com/gpu=GPU-1") == ("nvidia.com", "gpu", "GPU-1")
    assert names.parse_qualified_name("nvidia.com/mig.1g=0:1") == ("nvidia.com", "mig.1g", "0:1")


@pytest.mark.parametrize("text", ["nvidia.com/gpu", "nvidia.com=0", "a/b/c=0", "nvidia.com/gpu=-x"])
def test_parse_qualified_name_rejects(text: str) -> None:
    with pytest.raises(InputError):
        names.parse_qualified_name(text)


def test_make_kind_checks_both_parts() -> None:
    assert names.make_kind("example.com", "net") == "example.com/net"
    with pytest.raises(InputError, match="invalid class 'g pu'"):
        names.make_kind("nvidia.com", "g pu")


def test_spec_file_name() -> None:
    assert names.spec_file_name("nvidia.com", "gpu", "yaml") == "nvidia.com-gpu.yaml"
    assert names.spec_file_name("nvidia.com", "gpu", "json") == "nvidia.com-gpu.json"


@pytest.mark.parametrize("kind", ["v/gpu", "nvidia.com/g"])
def test_one_letter_vendor_or_class_is_refused(kind: str) -> None:
    """The CDI library v1.1.0 panics (slice bounds out of range) on a one-letter vendor or
    class (seen on a.com/g=0), so a spec with one could crash a runtime's CDI cache."""
    from cdigen.cdi.names import kind_problem

    problem = kind_problem(kind)
    assert problem is not None and "at least two characters" in problem

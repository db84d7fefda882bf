"""The spec service (cdigen.cdi.spec_service.node_spec): what generate and the device plugin's
generateSpecs both get, on a fake host in real directories."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from cdigen.cdi.hostfs import HostFS
from cdigen.cdi.spec_service import node_spec
from cdigen.errors import InputError, SpecConflictError
from tests.cdihost import FakeHost, build_host, make_node
from tests.cdihost import spec_options as options


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    return build_host(tmp_path / "host", make_node(2))


def test_it_writes_once_and_leaves_an_unchanged_file_alone(host: FakeHost, tmp_path: Path) -> None:
    out = tmp_path / "cdi"
    first = node_spec(host.node, options(host), source="node.yaml", fs=HostFS("/"), output_dir=out)
    assert first.written is not None and first.written.changed
    assert first.written.path == out / "nvidia.com-gpu.yaml"
    before = first.written.path.stat().st_mtime_ns
    again = node_spec(host.node, options(host), source="node.yaml", fs=HostFS("/"), output_dir=out)
    assert again.written is not None and not again.written.changed
    assert first.written.path.stat().st_mtime_ns == before
    assert again.host_warning is None  # the fake host has the driver's libraries


def test_a_dry_run_writes_nothing(host: FakeHost, tmp_path: Path) -> None:
    made = node_spec(host.node, options(host), source="node.yaml", fs=HostFS("/"))
    assert made.written is None and [d["name"] for d in made.spec["devices"]][-1] == "all"
    assert list(tmp_path.iterdir()) == [tmp_path / "host"]


def test_a_missing_root_is_refused_before_anything_is_written(
    host: FakeHost, tmp_path: Path
) -> None:
    out = tmp_path / "cdi"
    bad = dataclasses.replace(options(host), dev_root=str(tmp_path / "no-dev"))
    with pytest.raises(InputError, match="no-dev"):
        node_spec(host.node, bad, source="node.yaml", fs=HostFS("/"), output_dir=out)
    assert not out.exists()


def test_a_name_another_spec_defines_is_refused_and_the_other_spec_kept(
    host: FakeHost, tmp_path: Path
) -> None:
    out = tmp_path / "cdi"
    out.mkdir()
    other = out / "other.yaml"
    other.write_text(
        'cdiVersion: "0.5.0"\nkind: nvidia.com/gpu\ndevices:\n'
        '- name: "0"\n  containerEdits:\n    deviceNodes:\n    - path: /dev/null\n'
    )
    text = other.read_text()
    with pytest.raises(SpecConflictError, match=r"other\.yaml"):
        node_spec(host.node, options(host), source="node.yaml", fs=HostFS("/"), output_dir=out)
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["other.yaml"]
    assert other.read_text() == text


def test_capabilities_without_files_are_named_not_silently_dropped(host: FakeHost) -> None:
    asked = options(host, capability_devices=("display",))
    made = node_spec(host.node, asked, source="node.yaml", fs=HostFS("/"))
    assert made.missing_capabilities == ("display",)

"""The driver's edits are made once per scan and capability set, and every spec gets its own."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from cdigen.cdi.driveredits import driver_edits
from cdigen.cdi.driverfiles import scan_driver
from cdigen.cdi.hostfs import HOST
from tests.cdihost import build_host, make_node

CAPS = ("compute", "utility")


def test_a_spec_that_changes_its_edits_leaves_the_next_specs_alone(tmp_path: Path) -> None:
    host = build_host(tmp_path, make_node(1))
    driver = scan_driver(str(host.driver_root), host.node.driver_version, HOST)
    first = driver_edits(driver, CAPS, None, [])
    pristine = json.dumps(driver_edits(driver, CAPS, None, []))
    assert json.dumps(first) == pristine
    # what DRA's prepare does to a claim's spec: more env and mounts, a mount changed
    first["env"].append("CUDA_MPS_PIPE_DIRECTORY=/mps")
    first["mounts"].append({"hostPath": "/x", "containerPath": "/x"})
    first["mounts"][0]["containerPath"] = "/elsewhere"
    assert json.dumps(driver_edits(driver, CAPS, None, [])) == pristine


def test_a_new_scan_or_another_capability_set_gets_its_own_edits(tmp_path: Path) -> None:
    host = build_host(tmp_path, make_node(1))
    driver = scan_driver(str(host.driver_root), host.node.driver_version, HOST)
    before = driver_edits(driver, CAPS, None, [])
    fewer = dataclasses.replace(driver, libraries=driver.libraries[:1])
    assert len(driver_edits(fewer, CAPS, None, [])["mounts"]) < len(before["mounts"])
    assert driver_edits(driver, ("utility",), None, [])["mounts"] != before["mounts"]
    assert driver_edits(driver, CAPS, "/usr/bin/nvidia-cdi-hook", []).get("hooks")
    assert "hooks" not in driver_edits(driver, CAPS, None, [])

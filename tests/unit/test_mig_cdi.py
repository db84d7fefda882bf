"""MIG in CDI specs: the issue's acceptance for ``cdigen generate`` and determinism."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest

from cdigen.cdi.cache import load_state
from cdigen.cli import main
from cdigen.discover import load_node
from cdigen.fileio import parse_document
from cdigen.nodefile import dump_node
from tests.cdihost import build_host

SAMPLE = "builtin:dgx-a100-mig-mixed"


def test_dry_run_of_the_mixed_sample_validates_and_has_no_whole_mig_gpus(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["generate", "--node", SAMPLE, "--dry-run"]) == 0
    text = capsys.readouterr().out
    spec = parse_document(text, where="dry run")
    assert spec["cdiVersion"] == "0.5.0"
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    assert main(["validate", str(path)]) == 0

    node = load_node(SAMPLE)
    names = {d["name"] for d in spec["devices"]}
    for gpu in node.gpus:
        whole = {str(gpu.index), gpu.uuid}
        if gpu.mig_enabled:
            assert not whole & names, f"MIG-enabled GPU {gpu.index} has a full-GPU entry"
            for position, mig in enumerate(gpu.mig_devices):
                assert {f"{gpu.index}:{position}", mig.uuid} <= names
        else:
            assert whole <= names
    assert "all" in names
    migs = sum(len(g.mig_devices) for g in node.gpus)
    plain = sum(1 for g in node.gpus if not g.mig_enabled)
    assert len(spec["devices"]) == 2 * (migs + plain) + 1


def test_a_mig_device_gets_its_parent_node_and_its_gi_and_ci_caps(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["generate", "--node", SAMPLE, "--dry-run", "--format", "json"]) == 0
    spec = parse_document(capsys.readouterr().out, where="dry run")
    node = load_node(SAMPLE)
    gpu = node.gpus[1]
    mig = gpu.mig_devices[3]
    entry = next(d for d in spec["devices"] if d["name"] == mig.uuid)
    assert [n["path"] for n in entry["containerEdits"]["deviceNodes"]] == [
        f"/dev/nvidia{gpu.minor}",
        *(f"/dev/nvidia-caps/nvidia-cap{m}" for m in mig.cap_minors),
    ]
    everything = next(d for d in spec["devices"] if d["name"] == "all")
    paths = {n["path"] for n in everything["containerEdits"]["deviceNodes"]}
    assert {
        f"/dev/nvidia-caps/nvidia-cap{m}"
        for g in node.gpus
        for d in g.mig_devices
        for m in d.cap_minors
    } <= paths


def test_generate_is_byte_identical_for_one_layout_in_any_listed_order(tmp_path: Path) -> None:
    node = load_node(SAMPLE)
    host = build_host(tmp_path / "host", node)
    shuffled = dataclasses.replace(
        node,
        gpus=tuple(
            dataclasses.replace(
                g,
                mig_devices=tuple(random.Random(g.index).sample(g.mig_devices, len(g.mig_devices))),
            )
            for g in reversed(node.gpus)
        ),
    )
    assert shuffled != node
    outputs = []
    for i, variant in enumerate((node, shuffled, node)):
        node_file = tmp_path / f"node{i}.yaml"
        node_file.write_text(dump_node(variant))
        out_dir = tmp_path / f"cdi{i}"
        argv = ["generate", "--node", str(node_file), "--output-dir", str(out_dir)]
        argv += ["--driver-root", str(host.driver_root), "--dev-root", str(host.dev_root)]
        argv += ["--sysfs-root", str(host.sysfs_root)]
        assert main(argv) == 0
        outputs.append((out_dir / "nvidia.com-gpu.yaml").read_bytes())
    assert outputs[0] == outputs[1] == outputs[2]
    registry = load_state([tmp_path / "cdi0"])
    assert f"nvidia.com/gpu={node.gpus[0].mig_devices[0].uuid}" in registry.devices

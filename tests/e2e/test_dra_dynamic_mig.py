"""`cdigen dra serve --mig-strategy dynamic` end to end: slices with counters published to the
fake API server as 1.34, 1.35 and 1.36 take them; a claim for a placement makes the MIG device
through NVML (the MIG double, tests/fakes/fake_mig.py) and its spec names it; a create that
fails fails the claim and leaves nothing; a restarted plugin still destroys what it made."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import pynvml
import pytest

from cdigen.model import Node
from cdigen.plugin.dra.checkpoint import checkpoint_bytes, claim_spec_path
from cdigen.plugin.dra.dynamic_mig import MigMaker
from cdigen.policies.device_view import device_views
from tests.cdihost import CAPS_MAJOR, FakeHost, build_host, make_node
from tests.fakes.fake_mig import MigNvml, cap_minor
from tests.helpers.dra import DRIVER, Harness
from tests.helpers.slice_rules import validate_pool

PLACEMENT = "gpu-1-3g-40gb-at-4"


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    """GPU 0 whole, GPU 1 in MIG mode with no MIG devices yet."""
    node = make_node(2, mig_gpu=1)
    gpus = (node.gpus[0], dataclasses.replace(node.gpus[1], mig_devices=()))
    return build_host(tmp_path / "host", dataclasses.replace(node, gpus=gpus))


@pytest.fixture
def nvml(host: FakeHost, tmp_path: Path) -> MigNvml:
    fake = MigNvml(host.node)
    fake.nvmlInit()
    fake.write_mig_minors(tmp_path / "proc")
    return fake


def _start(harness: Harness, nvml: MigNvml, tmp_path: Path, node: Node | None = None) -> None:
    proc = str(tmp_path / "proc")
    harness.start(node, mig_strategy="dynamic", proc_root=proc, mig=MigMaker(nvml, proc))


def _published(harness: Harness) -> set[str]:
    return {d["name"] for s in harness.api.slices.values() for d in s["spec"].get("devices") or []}


def _checkpoint(harness: Harness) -> dict[str, object]:
    path = harness.kubelet_dir / "plugins" / DRIVER / "checkpoint.json"
    if not path.exists():  # never written: nothing was ever prepared
        return {}
    claims: dict[str, object] = json.loads(path.read_text())["claims"]
    return claims


@pytest.mark.parametrize("minor", ["34", "35", "36"])
def test_published_slices_take_the_layout_of_the_servers_version(
    harness: Harness, nvml: MigNvml, tmp_path: Path, minor: str
) -> None:
    harness.api.version = ("1", minor)
    _start(harness, nvml, tmp_path)
    slices = sorted(harness.api.slices.values(), key=lambda s: s["metadata"]["name"])
    validate_pool(slices, f"1.{minor}")
    mixed = [s for s in slices if "sharedCounters" in s["spec"] and "devices" in s["spec"]]
    assert bool(mixed) == (minor == "34")  # 1.35 on: counters in slices of their own
    devices = {d["name"] for s in slices for d in s["spec"].get("devices") or []}
    assert "gpu-0" in devices and PLACEMENT in devices and "gpu-1" not in devices


def test_prepare_makes_the_mig_device_and_unprepare_destroys_it(
    harness: Harness, nvml: MigNvml, tmp_path: Path
) -> None:
    _start(harness, nvml, tmp_path)
    ref = harness.claim("mig", "uid-m", PLACEMENT)
    answer = harness.kubelet.prepare([ref]).claims["uid-m"]
    assert answer.error == ""
    assert [list(d.cdi_device_ids) for d in answer.devices] == [
        [f"k8s.{DRIVER}/claim=uid-m-{PLACEMENT}"]
    ]
    (made,) = nvml.node.gpus[1].mig_devices
    assert made.profile == "3g.40gb"
    spec = json.loads(claim_spec_path(harness.cdi_dir, DRIVER, "uid-m").read_text())
    (device,) = spec["devices"]  # the new MIG device: its GPU and its GI's and CI's caps
    paths = [n["path"] for n in device["containerEdits"]["deviceNodes"]]
    gpu = nvml.node.gpus[1]
    caps = [cap_minor(gpu.minor, made.gi_id), cap_minor(gpu.minor, made.gi_id, 0)]
    assert paths == [f"/dev/nvidia{gpu.minor}", *(f"/dev/nvidia-caps/nvidia-cap{n}" for n in caps)]
    # the host has no node for the new instance's caps: the runtime makes it from these
    for node, minor in zip(device["containerEdits"]["deviceNodes"][1:], caps, strict=True):
        assert (node["type"], node["major"], node["minor"]) == ("c", CAPS_MAJOR, minor)
    plugin = harness.plugin
    assert plugin is not None and plugin.status is not None and plugin.status.wait_idle(5)
    (status,) = harness.api.claims[("default", "mig")]["status"]["devices"]
    assert status["device"] == PLACEMENT and status["data"]["uuid"] == made.uuid
    assert harness.kubelet.unprepare([ref]).claims["uid-m"].error == ""
    assert nvml.instances == {} and nvml.node.gpus[1].mig_devices == ()
    assert not claim_spec_path(harness.cdi_dir, DRIVER, "uid-m").exists()


def test_a_compute_instance_that_fails_fails_the_claim_and_leaves_nothing(
    harness: Harness, nvml: MigNvml, tmp_path: Path
) -> None:
    nvml.fail["nvmlGpuInstanceCreateComputeInstance"] = {
        1: pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES
    }
    _start(harness, nvml, tmp_path)
    ref = harness.claim("mig", "uid-f", PLACEMENT)
    error = harness.kubelet.prepare([ref]).claims["uid-f"].error
    assert "creating MIG 3g.40gb at memory slice 4 of GPU 1" in error
    assert "(NVMLError_InsufficientResources)" in error and "\n" not in error
    assert nvml.instances == {}, "the GPU instance made before the failure is destroyed"
    assert "nvmlGpuInstanceDestroy" in nvml.calls
    assert not claim_spec_path(harness.cdi_dir, DRIVER, "uid-f").exists()
    assert _checkpoint(harness) == {}


def test_a_placement_that_overlaps_a_made_one_fails_only_its_claim(
    harness: Harness, nvml: MigNvml, tmp_path: Path
) -> None:
    _start(harness, nvml, tmp_path)
    first = harness.claim("first", "uid-1", PLACEMENT)
    second = harness.claim("second", "uid-2", "gpu-1-1g-10gb-at-5", "gpu-0")
    assert harness.kubelet.prepare([first]).claims["uid-1"].error == ""
    error = harness.kubelet.prepare([second]).claims["uid-2"].error
    assert "memory slice 5 of GPU 1" in error
    assert len(nvml.instances) == 1 and not _checkpoint(harness).get("uid-2")
    assert not claim_spec_path(harness.cdi_dir, DRIVER, "uid-2").exists()


def test_a_restarted_plugin_destroys_the_mig_device_at_unprepare(
    harness: Harness, nvml: MigNvml, tmp_path: Path
) -> None:
    _start(harness, nvml, tmp_path)
    ref = harness.claim("mig", "uid-r", PLACEMENT, "gpu-0")
    before = harness.kubelet.prepare([ref]).claims["uid-r"]
    assert before.error == ""
    (made,) = nvml.node.gpus[1].mig_devices
    recorded = _checkpoint(harness)["uid-r"]
    assert recorded["migDevices"] == [  # type: ignore[index]
        {"device": PLACEMENT, "gpuUUID": nvml.node.gpus[1].uuid, "gi": made.gi_id, "ci": 0,
         "uuid": made.uuid}
    ]  # fmt: skip
    harness.stop()
    # a new plugin, which discovers the MIG device: the checkpoint says it is the claim's
    _start(harness, nvml, tmp_path, node=nvml.node)
    assert PLACEMENT in _published(harness)
    assert harness.kubelet.prepare([ref]).claims["uid-r"] == before
    assert len(nvml.instances) == 1, "preparing again makes nothing new"
    assert nvml.node.gpus[1].mig_devices == (made,), "nor destroys and makes it again"
    assert harness.kubelet.unprepare([ref]).claims["uid-r"].error == ""
    assert nvml.instances == {} and nvml.node.gpus[1].mig_devices == ()
    assert _checkpoint(harness) == {}


def test_a_destroy_that_fails_keeps_the_claim_for_the_kubelets_retry(
    harness: Harness, nvml: MigNvml, tmp_path: Path
) -> None:
    _start(harness, nvml, tmp_path)
    ref = harness.claim("mig", "uid-d", PLACEMENT)
    assert harness.kubelet.prepare([ref]).claims["uid-d"].error == ""
    nvml.fail["nvmlGpuInstanceDestroy"] = {1: pynvml.NVML_ERROR_IN_USE}
    error = harness.kubelet.unprepare([ref]).claims["uid-d"].error
    assert "destroying MIG device" in error and "NVMLError_InUse" in error
    assert "uid-d" in _checkpoint(harness)
    del nvml.fail["nvmlGpuInstanceDestroy"]
    assert harness.kubelet.unprepare([ref]).claims["uid-d"].error == ""
    assert nvml.instances == {} and _checkpoint(harness) == {}


def test_a_checkpoint_with_a_damaged_mig_record_refuses_the_start(
    harness: Harness, nvml: MigNvml, tmp_path: Path
) -> None:
    from cdigen.errors import InputError

    _start(harness, nvml, tmp_path)
    ref = harness.claim("mig", "uid-c", PLACEMENT)
    assert harness.kubelet.prepare([ref]).claims["uid-c"].error == ""
    harness.stop()
    path = harness.kubelet_dir / "plugins" / DRIVER / "checkpoint.json"
    doc = json.loads(path.read_text())
    doc["claims"]["uid-c"]["migDevices"][0]["gi"] = "one"
    path.write_text(json.dumps(doc))  # edited: the checksum says so
    with pytest.raises(InputError, match=r"its checksum does not match \(damaged or edited\)"):
        _start(harness, nvml, tmp_path)
    path.write_bytes(checkpoint_bytes(doc["claims"], doc["bootId"]))  # checksummed, still bad
    with pytest.raises(InputError, match=r"claims\['uid-c'\]\.migDevices\[0\]\.gi: not an ID"):
        _start(harness, nvml, tmp_path)


def test_a_server_that_drops_the_counters_is_said_once(
    harness: Harness, nvml: MigNvml, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    harness.api.partitionable = False  # the DRAPartitionableDevices gate is off
    _start(harness, nvml, tmp_path)
    said = [r for r in caplog.records if "dropped the MIG counters" in r.message]
    assert len(said) == 1 and "DRAPartitionableDevices" in said[0].message


def test_unprepare_leaves_a_reused_gpu_instance_id_alone(
    harness: Harness, nvml: MigNvml, tmp_path: Path
) -> None:
    """Ours went with a GPU reset and another MIG device got its GI ID: that one stays."""
    _start(harness, nvml, tmp_path)
    ref = harness.claim("mig", "uid-g", PLACEMENT)
    assert harness.kubelet.prepare([ref]).claims["uid-g"].error == ""
    (ours,) = nvml.node.gpus[1].mig_devices
    maker = MigMaker(nvml, tmp_path / "proc")
    assert maker.destroy(_checkpoint(harness)["uid-g"]["migDevices"][0]) == ""  # type: ignore[index]
    assert harness.plugin is not None
    other_view = next(v for v in harness.plugin.views if v.name == "gpu-1-1g-10gb-at-0")
    other = maker.create(other_view)
    assert other.mig.gi_id == ours.gi_id and other.mig.uuid != ours.uuid
    assert harness.kubelet.unprepare([ref]).claims["uid-g"].error == ""
    assert nvml.node.gpus[1].mig_devices == (other.mig,)


def test_a_gpu_instance_made_by_hand_keeps_the_placements_over_it_out(
    harness: Harness, nvml: MigNvml, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    by_hand = next(
        v for v in device_views(nvml.node, mig_strategy="dynamic") if v.name == "gpu-1-3g-40gb-at-0"
    )
    MigMaker(nvml, tmp_path / "proc").create(by_hand)  # as nvidia-smi mig -cgi ... -C would
    _start(harness, nvml, tmp_path, node=nvml.node)
    published = _published(harness)
    assert {"gpu-1-3g-40gb-at-4", "gpu-1-1g-10gb-at-4", "gpu-1-4g-40gb-at-0"} - published == {
        "gpu-1-4g-40gb-at-0"
    }
    assert not {"gpu-1-3g-40gb-at-0", "gpu-1-1g-10gb-at-3", "gpu-1-7g-80gb-at-0"} & published
    assert any("not made for a claim, holds memory slices 0-3" in r.message for r in caplog.records)


def _boot(tmp_path: Path, boot_id: str) -> None:
    where = tmp_path / "proc" / "sys" / "kernel" / "random"
    where.mkdir(parents=True, exist_ok=True)
    (where / "boot_id").write_text(boot_id + "\n")


def test_after_a_reboot_a_claim_with_mig_devices_is_prepared_again(
    harness: Harness, nvml: MigNvml, tmp_path: Path
) -> None:
    """The boot ID in the checkpoint tells a reboot, which took the MIG devices with it: the
    claim's spec goes, and the kubelet's next prepare makes its MIG device again; a claim of a
    whole GPU keeps its spec."""
    _boot(tmp_path, "boot-1")
    _start(harness, nvml, tmp_path)
    ref = harness.claim("mig", "uid-b", PLACEMENT)
    whole = harness.claim("whole", "uid-w", "gpu-0")
    answers = harness.kubelet.prepare([ref, whole]).claims
    assert answers["uid-b"].error == "" and answers["uid-w"].error == ""
    harness.stop()
    nvml.instances.clear()  # the reboot
    nvml.node = dataclasses.replace(
        nvml.node, gpus=(nvml.node.gpus[0], dataclasses.replace(nvml.node.gpus[1], mig_devices=()))
    )
    _boot(tmp_path, "boot-2")
    _start(harness, nvml, tmp_path, node=nvml.node)
    assert not claim_spec_path(harness.cdi_dir, DRIVER, "uid-b").exists()
    assert claim_spec_path(harness.cdi_dir, DRIVER, "uid-w").exists()
    assert _checkpoint(harness)["uid-b"]["migDevices"] == []  # type: ignore[index]
    assert harness.kubelet.prepare([ref]).claims["uid-b"].error == ""
    (made,) = nvml.node.gpus[1].mig_devices
    spec = claim_spec_path(harness.cdi_dir, DRIVER, "uid-b").read_text()
    assert f'nvidia-cap{made.cap_minors[1]}"' in spec and len(nvml.instances) == 1
    assert harness.kubelet.unprepare([ref]).claims["uid-b"].error == ""
    assert nvml.instances == {} and set(_checkpoint(harness)) == {"uid-w"}


def test_a_reboot_after_an_older_cdigen_wrote_the_mig_records_prepares_again_too(
    harness: Harness, nvml: MigNvml, tmp_path: Path
) -> None:
    """A claim recorded by layout 1 has MIG devices and no planned placements."""
    _boot(tmp_path, "boot-1")
    _start(harness, nvml, tmp_path)
    ref = harness.claim("mig", "uid-o", PLACEMENT)
    assert harness.kubelet.prepare([ref]).claims["uid-o"].error == ""
    harness.stop()
    path = harness.kubelet_dir / "plugins" / DRIVER / "checkpoint.json"
    doc = json.loads(path.read_text())
    del doc["claims"]["uid-o"]["placements"]
    path.write_bytes(checkpoint_bytes(doc["claims"], "boot-1"))
    nvml.instances.clear()
    nvml.node = dataclasses.replace(
        nvml.node, gpus=(nvml.node.gpus[0], dataclasses.replace(nvml.node.gpus[1], mig_devices=()))
    )
    _boot(tmp_path, "boot-2")
    _start(harness, nvml, tmp_path, node=nvml.node)
    assert not claim_spec_path(harness.cdi_dir, DRIVER, "uid-o").exists()
    assert harness.kubelet.prepare([ref]).claims["uid-o"].error == ""
    assert len(nvml.instances) == 1


def test_two_calls_for_one_claim_at_once_make_its_mig_device_once(
    harness: Harness, nvml: MigNvml, tmp_path: Path
) -> None:
    """The kubelet may call again while a prepare waits for the API server: the second call
    answers from the first one's checkpoint entry, it does not undo and make it again."""
    import threading

    _start(harness, nvml, tmp_path)
    ref = harness.claim("mig", "uid-t", PLACEMENT)
    harness.api.hang.add("claims")  # both calls wait in the claim read
    answers: list[object] = []
    calls = [
        threading.Thread(target=lambda: answers.append(harness.kubelet.prepare([ref])))
        for _ in range(2)
    ]
    for call in calls:
        call.start()
    deadline = time.monotonic() + 10
    while len([r for r in harness.api.requests if "resourceclaims/mig" in r[1]]) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    harness.api.release.set()
    for call in calls:
        call.join(10)
    assert len(answers) == 2 and answers[0] == answers[1]
    assert nvml.calls.count("nvmlDeviceCreateGpuInstanceWithPlacement") == 1
    assert nvml.calls.count("nvmlGpuInstanceDestroy") == 0


def test_the_same_boot_keeps_the_prepared_claim_as_it_was(
    harness: Harness, nvml: MigNvml, tmp_path: Path
) -> None:
    _boot(tmp_path, "boot-1")
    _start(harness, nvml, tmp_path)
    ref = harness.claim("mig", "uid-s", PLACEMENT)
    before = harness.kubelet.prepare([ref]).claims["uid-s"]
    harness.stop()
    _start(harness, nvml, tmp_path, node=nvml.node)
    assert claim_spec_path(harness.cdi_dir, DRIVER, "uid-s").exists()
    assert harness.kubelet.prepare([ref]).claims["uid-s"] == before and len(nvml.instances) == 1


def test_a_failed_undo_is_kept_logged_and_tried_again_at_the_next_call(
    harness: Harness, nvml: MigNvml, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    nvml.fail["nvmlGpuInstanceCreateComputeInstance"] = {
        1: pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES
    }
    nvml.fail["nvmlGpuInstanceDestroy"] = {1: pynvml.NVML_ERROR_IN_USE}
    _start(harness, nvml, tmp_path)
    ref = harness.claim("mig", "uid-u", PLACEMENT)
    assert "NVMLError_InsufficientResources" in harness.kubelet.prepare([ref]).claims["uid-u"].error
    assert len(nvml.instances) == 1, "the GPU instance could not be destroyed"
    assert _checkpoint(harness)["uid-u"]["state"] == "PrepareStarted"  # type: ignore[index]
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert any("undoing a prepare that failed" in e and "NVMLError_InUse" in e for e in errors)
    del nvml.fail["nvmlGpuInstanceDestroy"]
    other = harness.claim("other", "uid-o", "gpu-0")
    assert harness.kubelet.prepare([other]).claims["uid-o"].error == ""  # retried on the way
    assert nvml.instances == {} and "uid-u" not in _checkpoint(harness)
    del nvml.fail["nvmlGpuInstanceCreateComputeInstance"]
    assert harness.kubelet.prepare([ref]).claims["uid-u"].error == ""  # the kubelet's retry
    assert len(nvml.instances) == 1


def test_a_claim_allocated_a_placement_another_holds_fails_and_leaves_the_other_alone(
    harness: Harness, nvml: MigNvml, tmp_path: Path
) -> None:
    """A stale allocation names a placement with the very memory slices a prepared claim's MIG
    device sits on (3g.40gb and 4g.40gb both take slices 0-3): the create fails, and the undo
    of that claim's plan does not take the other claim's device."""
    _start(harness, nvml, tmp_path)
    first = harness.claim("first", "uid-1", "gpu-1-4g-40gb-at-0")
    assert harness.kubelet.prepare([first]).claims["uid-1"].error == ""
    (held,) = nvml.node.gpus[1].mig_devices
    second = harness.claim("second", "uid-2", "gpu-1-3g-40gb-at-0")
    assert "InsufficientResources" in harness.kubelet.prepare([second]).claims["uid-2"].error
    assert nvml.node.gpus[1].mig_devices == (held,) and "uid-2" not in _checkpoint(harness)


class _SecondComputeInstanceFails(MigNvml):
    """The compute instance of a second GPU instance on a GPU cannot be made."""

    def nvmlGpuInstanceCreateComputeInstance(self, gpuInstance: Any, profileId: int) -> Any:
        if len(self.instances) > 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        return super().nvmlGpuInstanceCreateComputeInstance(gpuInstance, profileId)


def test_unprepare_of_a_half_prepared_claim_undoes_its_unrecorded_gpu_instance_too(
    harness: Harness, host: FakeHost, tmp_path: Path
) -> None:
    """Two placements: the second's compute instance fails and no GPU instance can be destroyed,
    so the claim stays half-prepared with one MIG device recorded and a bare GPU instance at its
    other placement. The kubelet's unprepare, once NVML lets go, takes both."""
    nvml = _SecondComputeInstanceFails(host.node)
    nvml.nvmlInit()
    nvml.write_mig_minors(tmp_path / "proc")
    nvml.fail["nvmlGpuInstanceDestroy"] = {1: pynvml.NVML_ERROR_IN_USE}
    _start(harness, nvml, tmp_path)
    ref = harness.claim("two", "uid-2p", PLACEMENT, "gpu-1-1g-10gb-at-0")
    assert "InsufficientResources" in harness.kubelet.prepare([ref]).claims["uid-2p"].error
    assert len(nvml.instances) == 2
    kept = _checkpoint(harness)["uid-2p"]
    assert kept["state"] == "PrepareStarted" and len(kept["migDevices"]) == 1  # type: ignore[index]
    del nvml.fail["nvmlGpuInstanceDestroy"]
    assert harness.kubelet.unprepare([ref]).claims["uid-2p"].error == ""
    assert nvml.instances == {} and _checkpoint(harness) == {}

"""`cdigen dra serve` through field events: a plugin restart with claims prepared, a CDI dir
wiped by a reboot while the checkpoint survives, a crash between writing a claim's spec and its
checkpoint entry, a damaged checkpoint, and a kubelet restart."""

from __future__ import annotations

import json
import shutil
import stat
from pathlib import Path

import pytest

from cdigen.errors import InputError
from cdigen.plugin.dra.checkpoint import claim_spec_path
from tests.cdihost import FakeHost, build_host, make_node
from tests.dra_kubelet_sim import DraKubeletSim
from tests.helpers.dra import DRIVER, Harness


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    return build_host(tmp_path / "host", make_node(2))


def _checkpoint(harness: Harness) -> Path:
    return harness.kubelet_dir / "plugins" / DRIVER / "checkpoint.json"


def _checkpointed(harness: Harness) -> set[str]:
    return set(json.loads(_checkpoint(harness).read_text())["claims"])


def _ids(response: object, uid: str) -> list[list[str]]:
    answer = response.claims[uid]  # type: ignore[attr-defined]
    assert answer.error == ""
    return [list(d.cdi_device_ids) for d in answer.devices]


def test_after_a_restart_prepare_answers_the_same_and_unprepare_clears_spec_and_checkpoint(
    harness: Harness,
) -> None:
    harness.start()
    ref = harness.claim("keep", "uid-k", "gpu-1")
    before = _ids(harness.kubelet.prepare([ref]), "uid-k")
    path = claim_spec_path(harness.cdi_dir, DRIVER, "uid-k")
    spec = path.read_bytes()
    harness.stop()
    harness.start()
    assert _ids(harness.kubelet.prepare([ref]), "uid-k") == before
    assert path.read_bytes() == spec
    assert _checkpointed(harness) == {"uid-k"}
    assert harness.kubelet.unprepare([ref]).claims["uid-k"].error == ""
    assert not path.exists()
    assert _checkpointed(harness) == set()


def test_a_wiped_cdi_dir_gets_the_spec_of_a_claim_prepared_again(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """/var/run/cdi is a tmpfs: after a reboot the checkpoint (under /var/lib/kubelet) still
    lists the claim, and the kubelet prepares it again for the restarted pod. Answering from the
    checkpoint alone would hand the runtime CDI IDs it cannot resolve."""
    harness.start()
    ref = harness.claim("keep", "uid-k", "gpu-0")
    before = _ids(harness.kubelet.prepare([ref]), "uid-k")
    path = claim_spec_path(harness.cdi_dir, DRIVER, "uid-k")
    spec = json.loads(path.read_text())
    harness.stop()
    shutil.rmtree(harness.cdi_dir)
    harness.start()
    assert _ids(harness.kubelet.prepare([ref]), "uid-k") == before
    assert any("is gone; preparing it again" in r.getMessage() for r in caplog.records)
    assert json.loads(path.read_text()) == spec
    assert harness.kubelet.unprepare([ref]).claims["uid-k"].error == ""
    assert not path.exists()
    assert _checkpointed(harness) == set()


def test_a_spec_without_a_checkpoint_entry_is_removed_by_unprepare(harness: Harness) -> None:
    """A crash between writing a claim's spec and its checkpoint entry leaves the spec behind;
    the kubelet, which got no answer, unprepares the claim when its pod goes."""
    harness.start()
    ref = harness.claim("lost", "uid-l", "gpu-0")
    assert harness.kubelet.prepare([ref]).claims["uid-l"].error == ""
    path = claim_spec_path(harness.cdi_dir, DRIVER, "uid-l")
    spec = path.read_bytes()
    harness.stop()
    _checkpoint(harness).unlink()
    path.write_bytes(spec)
    other = claim_spec_path(harness.cdi_dir, DRIVER, "uid-other")
    other.write_bytes(spec)
    harness.start()
    assert harness.plugin is not None and harness.plugin.preparer.prepared() == {}
    assert harness.kubelet.unprepare([ref]).claims["uid-l"].error == ""
    assert not path.exists()
    assert other.exists(), "only the named claim's spec goes"
    # never prepared, no spec: a success too, and a UID that is not a file name touches nothing
    never = ("default", "uid-never", "never")
    assert harness.kubelet.unprepare([never]).claims["uid-never"].error == ""
    odd = ("default", "../run-cdi/k8s.gpu.cdigen.dev-claim_uid-other", "odd")
    assert harness.kubelet.unprepare([odd]).claims[odd[1]].error == ""
    assert other.exists()


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "Expecting value"),  # truncated to nothing (a crash before the data reached disk)
        ('{"version": 1, "claims": {"uid-a": {"namesp', "Unterminated string"),
        ('{"version": 3, "claims": {}}', "unknown layout"),  # a newer cdigen's layout
        ('{"version": 2, "claims": {}, "checksum": "sha256:00"}', "checksum does not match"),
    ],
)
def test_a_damaged_or_newer_checkpoint_refuses_the_start(
    harness: Harness, text: str, why: str
) -> None:
    checkpoint = _checkpoint(harness)
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_text(text)
    with pytest.raises(InputError) as raised:
        harness.start()
    line = str(raised.value)
    assert "\n" not in line
    assert str(checkpoint) in line and why in line
    assert checkpoint.read_text() == text, "the checkpoint is left as it was"


def test_a_restarted_kubelet_registers_the_running_plugin_again(harness: Harness) -> None:
    plugin = harness.start()
    ref = harness.claim("a", "uid-a", "gpu-0")
    assert harness.kubelet.prepare([ref]).claims["uid-a"].error == ""
    kubelet = DraKubeletSim(harness.kubelet_dir)  # a new kubelet finds the socket still there
    assert kubelet.register().driver == DRIVER
    assert plugin.registration.calls == 2 and plugin.registration.registered
    assert kubelet.unprepare([ref]).claims["uid-a"].error == ""


def test_a_checkpoint_that_cannot_be_written_fails_the_claim_and_holds_nothing(
    harness: Harness,
) -> None:
    """A claim the checkpoint does not keep would be forgotten by the next start (its device
    free for another claim): the kubelet must get the error, and its retry must prepare again."""
    plugin = harness.start()
    checkpoint = _checkpoint(harness)
    checkpoint.mkdir(parents=True)  # in the way of the rename, even for root
    ref = harness.claim("a", "uid-a", "gpu-0")
    error = harness.kubelet.prepare([ref]).claims["uid-a"].error
    assert str(checkpoint) in error
    assert plugin.preparer.prepared() == {}
    assert not claim_spec_path(harness.cdi_dir, DRIVER, "uid-a").exists()
    assert "write failed" in harness.kubelet.prepare([ref]).claims["uid-a"].error, "not answered"
    checkpoint.rmdir()
    assert _ids(harness.kubelet.prepare([ref]), "uid-a") == [[f"k8s.{DRIVER}/claim=uid-a-gpu-0"]]
    assert _checkpointed(harness) == {"uid-a"}
    assert stat.S_IMODE(checkpoint.stat().st_mode) == 0o600  # root's alone, whatever the umask
    # unprepare whose checkpoint write fails: the kubelet hears it and retries
    checkpoint.unlink()
    checkpoint.mkdir()
    assert "write failed" in harness.kubelet.unprepare([ref]).claims["uid-a"].error
    checkpoint.rmdir()
    assert harness.kubelet.unprepare([ref]).claims["uid-a"].error == ""
    assert _checkpointed(harness) == set()


def test_a_prepared_claim_is_answered_from_the_checkpoint_without_reading_it_again(
    harness: Harness,
) -> None:
    """With its spec there (or none needed: no device of ours), a prepared claim's second
    prepare answers from the checkpoint: no claim read, no spec written again."""
    from tests.fake_apiserver import allocated_claim

    harness.start()
    ref = harness.claim("a", "uid-a", "gpu-0")
    foreign = {"request": "nic", "driver": "net.example.com", "pool": "p", "device": "nic-0"}
    harness.api.add_claim(allocated_claim("n", "uid-n", [foreign]))
    none = ("default", "uid-n", "n")
    first = harness.kubelet.prepare([ref, none])
    assert first.claims["uid-a"].error == "" and first.claims["uid-n"].error == ""
    spec = claim_spec_path(harness.cdi_dir, DRIVER, "uid-a")
    written = spec.stat().st_ino

    def reads() -> int:
        return len([r for r in harness.api.requests if r[0] == "GET" and "resourceclaims/" in r[1]])

    before = reads()
    assert harness.kubelet.prepare([ref, none]) == first
    assert reads() == before
    assert spec.stat().st_ino == written

"""The DRA plugin against hostile claims and files: UIDs that climb out of the CDI dir or split
log lines, claims of the wrong shape, absurd consumed memory, checkpoints that are not ours,
a umask of 000 and the temp files a kill -9 leaves. Real gRPC from the kubelet simulator, the
fake API server, real files in real dirs."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cdigen.errors import InputError
from cdigen.nodefile import dump_node
from cdigen.plugin.dra.checkpoint import checkpoint_bytes
from tests.cdihost import FakeHost, build_host, make_node
from tests.fake_apiserver import FakeApiServer, allocated_claim
from tests.helpers.dra import DRIVER, NODE_NAME, Harness

REPO_ROOT = Path(__file__).resolve().parents[2]
SPEC_PREFIX = f"k8s.{DRIVER}-claim_"
MAX_ERROR = 300


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    return build_host(tmp_path / "host", make_node(2))


def _tree(root: Path, skip: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every file and directory under ``root`` outside ``skip``: (mode, mtime, content)."""
    out: dict[str, tuple[int, int, bytes]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        if here == skip or skip in here.parents:
            dirnames[:] = []
            continue
        for name in dirnames + filenames:
            path = here / name
            if path == skip:
                continue
            st = path.lstat()
            data = path.read_bytes() if stat.S_ISREG(st.st_mode) else b""
            out[str(path)] = (st.st_mode, st.st_mtime_ns, data)
    return out


def _one_line(error: str) -> None:
    assert error, "an error was expected"
    assert "\n" not in error and "\0" not in error and len(error) <= MAX_ERROR, repr(error[:400])


def _put_claim(api: FakeApiServer, name: str, doc: Any) -> tuple[str, str, str]:
    """Store ``doc`` as claim default/``name`` whatever its shape (the kubelet names the UID)."""
    with api.lock:
        api.claims[("default", name)] = doc
    uid = doc["metadata"]["uid"] if isinstance(doc.get("metadata"), dict) else f"uid-{name}"
    return ("default", uid, name)


def _specs(cdi_dir: Path) -> list[str]:
    """The files in the CDI dir, less the spec dir's lock file (a dot-file runtimes skip)."""
    return sorted(p.name for p in cdi_dir.iterdir() if p.name != ".cdigen.lock")


def _result(device: str, **extra: Any) -> dict[str, Any]:
    return {"request": "gpu", "driver": DRIVER, "pool": NODE_NAME, "device": device, **extra}


# --------------------------------------------------------------------------- claim UIDs (3, 10)

HOSTILE_UIDS = {
    "climb": "../../../escape/victim",  # run-cdi/k8s...claim_../../../escape/victim.yaml
    "dirs-anywhere": "a/../../../made/here",
    "absolute": "/etc/passwd",
    "dot-dot": "..",
    "empty": "",
    "newline": "u-a\nINFO prepared claim default/x (forged)",
    "nul": "u-a\0x",
    "10-KiB": "u" * 10240,
    "tab": "u\ta",
}


@pytest.mark.parametrize("uid", list(HOSTILE_UIDS.values()), ids=list(HOSTILE_UIDS))
def test_a_hostile_claim_uid_is_that_claims_error_and_touches_no_file_outside_the_cdi_dir(
    harness: Harness, tmp_path: Path, uid: str, caplog: pytest.LogCaptureFixture
) -> None:
    victim = tmp_path / "escape" / "victim.yaml"
    victim.parent.mkdir()
    victim.write_text("a file the claim must not reach\n")
    harness.start()
    before = _tree(tmp_path, harness.cdi_dir)
    bad = harness.claim("bad", uid, "gpu-0")
    good = harness.claim("good", "uid-good", "gpu-1")
    answer = harness.kubelet.prepare([bad, good])
    _one_line(answer.claims[uid].error)
    assert "is not a Kubernetes UID" in answer.claims[uid].error
    assert answer.claims["uid-good"].error == ""
    assert [d.device_name for d in answer.claims["uid-good"].devices] == ["gpu-1"]
    unprepared = harness.kubelet.unprepare([bad, good])
    assert unprepared.claims[uid].error == ""  # never prepared: an unknown claim, nothing done
    assert unprepared.claims["uid-good"].error == ""
    assert _tree(tmp_path, harness.cdi_dir) == before, "a file outside the CDI dir changed"
    assert victim.read_text() == "a file the claim must not reach\n"
    assert _specs(harness.cdi_dir) == []
    assert not any("\n" in r.getMessage() for r in caplog.records), "a log line was split"


def test_a_checkpoint_entry_naming_a_file_outside_the_cdi_dir_is_refused_at_load(
    harness: Harness, tmp_path: Path
) -> None:
    victim = tmp_path / "escape" / "victim.yaml"
    victim.parent.mkdir()
    victim.write_text("keep me\n")
    harness.start()
    ref = harness.claim("a", "uid-a", "gpu-0")
    assert harness.kubelet.prepare([ref]).claims["uid-a"].error == ""
    plugin = harness.plugin
    assert plugin is not None
    checkpoint = plugin.options.checkpoint
    harness.stop()
    doc = json.loads(checkpoint.read_text())
    doc["claims"]["uid-a"]["specPath"] = str(harness.cdi_dir / ".." / "escape" / "victim.yaml")
    # checksummed again, as a hostile writer would: the field check is what refuses it
    checkpoint.write_bytes(checkpoint_bytes(doc["claims"], doc["bootId"]))
    before = _tree(tmp_path, harness.cdi_dir)
    with pytest.raises(InputError) as caught:
        harness.start()
    message = str(caught.value)
    assert str(checkpoint) in message and "specPath" in message and "\n" not in message
    assert _tree(tmp_path, harness.cdi_dir) == before
    assert victim.read_text() == "keep me\n"


# --------------------------------------------------------------------------- umask 000 (4)


def test_under_umask_000_dirs_are_0755_and_files_have_their_modes(
    harness: Harness, tmp_path: Path, umask_000: None
) -> None:
    harness.cdi_dir = tmp_path / "var" / "run" / "cdi"
    state = tmp_path / "state" / "dra"
    harness.start(state_dir=state)
    ref = harness.claim("a", "uid-a", "gpu-0")
    assert harness.kubelet.prepare([ref]).claims["uid-a"].error == ""
    modes = {
        str(p.relative_to(tmp_path)): oct(stat.S_IMODE(p.stat().st_mode))
        for p in (
            tmp_path / "var",
            tmp_path / "var" / "run",
            harness.cdi_dir,
            tmp_path / "state",
            state,
            state / "checkpoint.json",
            harness.cdi_dir / f"{SPEC_PREFIX}uid-a.json",
        )
    }
    assert modes == {
        "var": "0o755",
        "var/run": "0o755",
        "var/run/cdi": "0o755",
        "state": "0o755",
        "state/dra": "0o755",
        "state/dra/checkpoint.json": "0o600",
        f"var/run/cdi/{SPEC_PREFIX}uid-a.json": "0o644",
    }


# --------------------------------------------------------------------------- malformed claims (5)


def test_each_malformed_claim_is_its_own_one_line_error_and_the_others_are_answered(
    harness: Harness,
) -> None:
    harness.start()
    good = harness.claim("good", "uid-good", "gpu-0")
    status_str = allocated_claim("s", "uid-s", [_result("gpu-1")])
    status_str["status"] = "allocated"
    meta_list = allocated_claim("m", "uid-m", [_result("gpu-1")])
    meta_list["metadata"] = ["uid-m"]
    devices_list = allocated_claim("d", "uid-d", [_result("gpu-1")])
    devices_list["status"]["allocation"]["devices"] = [_result("gpu-1")]
    lots = allocated_claim("l", "uid-l", [_result("gpu-1", consumedCapacity={"memory": "lots"})])
    config_str = allocated_claim("c", "uid-c", [_result("gpu-1")])
    config_str["status"]["allocation"]["devices"]["config"] = "all"
    device_num = allocated_claim("n", "uid-n", [_result("gpu-1")])
    device_num["status"]["allocation"]["devices"]["results"][0]["device"] = 7
    refs = [
        good,
        _put_claim(harness.api, "s", status_str),
        ("default", "uid-m", "m"),
        _put_claim(harness.api, "d", devices_list),
        _put_claim(harness.api, "l", lots),
        _put_claim(harness.api, "c", config_str),
        _put_claim(harness.api, "n", device_num),
        harness.claim("nul", "uid-\0nul", "gpu-1"),
    ]
    _put_claim(harness.api, "m", meta_list)
    answer = harness.kubelet.prepare(refs)
    assert answer.claims["uid-good"].error == ""
    assert [d.device_name for d in answer.claims["uid-good"].devices] == ["gpu-0"]
    expected = {
        "uid-s": "status is a string, not a mapping",
        "uid-m": "metadata is a list, not a mapping",
        "uid-d": "status.allocation.devices is a list, not a mapping",
        "uid-l": "invalid quantity 'lots'",
        "uid-c": "status.allocation.devices.config is a string, not a list",
        "uid-n": "results[0].device is a number, not a string",
        "uid-\0nul": "is not a Kubernetes UID",
    }
    for uid, words in expected.items():
        error = answer.claims[uid].error
        _one_line(error)
        assert words in error, (uid, error)
    assert _specs(harness.cdi_dir) == [f"{SPEC_PREFIX}uid-good.json"]


# --------------------------------------------------------------------------- bounded errors (10)


def test_a_1_mib_device_name_is_cut_short_in_the_error(harness: Harness) -> None:
    harness.start()
    ref = harness.claim("big", "uid-big", "g" * (1 << 20))
    error = harness.kubelet.prepare([ref]).claims["uid-big"].error
    _one_line(error)
    assert "is not offered by this node" in error or "..." in error


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ({"request": "r" * (1 << 20)}, "is not a request name"),
        ({"request": "gpu\nx"}, "is not a request name"),
        ({"shareID": "s" * (1 << 20)}, "is not a UID"),
    ],
    ids=["1-MiB-request", "newline-request", "1-MiB-shareID"],
)
def test_a_huge_or_odd_request_or_share_id_is_refused_and_never_checkpointed(
    harness: Harness, extra: dict[str, str], words: str
) -> None:
    harness.start()
    ref = harness.claim("r", "uid-r", "gpu-0", **extra)
    error = harness.kubelet.prepare([ref]).claims["uid-r"].error
    _one_line(error)
    assert words in error, error
    plugin = harness.plugin
    assert plugin is not None and "uid-r" not in plugin.preparer.prepared()


@pytest.mark.parametrize("memory", ["-1Gi", "0", "512Ki", "1"])
def test_consumed_memory_below_1_mib_is_refused_not_written_as_a_limit(
    harness: Harness, memory: str
) -> None:
    harness.start()
    ref = harness.claim("m", "uid-m", "gpu-0", consumedCapacity={"memory": memory})
    error = harness.kubelet.prepare([ref]).claims["uid-m"].error
    _one_line(error)
    assert "consumedCapacity.memory" in error and "1Mi" in error, error
    assert not list(harness.cdi_dir.glob("*.json")), "no spec with a 0M or negative limit"


def test_consumed_memory_of_1_mib_or_more_is_the_limit(harness: Harness) -> None:
    harness.start()
    ref = harness.claim("m", "uid-m", "gpu-0", consumedCapacity={"memory": "1Mi"})
    assert harness.kubelet.prepare([ref]).claims["uid-m"].error == ""
    spec = json.loads((harness.cdi_dir / f"{SPEC_PREFIX}uid-m.json").read_text())
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1M" in spec["containerEdits"]["env"]


# --------------------------------------------------------------------------- temp files (7)


def test_our_temp_files_left_by_a_kill_are_removed_at_start_and_nobody_elses(
    harness: Harness, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    harness.cdi_dir.mkdir()
    state.mkdir()
    ours = [
        harness.cdi_dir / f".{SPEC_PREFIX}uid-a.yaml.ab12_xyz.tmp",
        state / ".checkpoint.json.k3j4h5g6.tmp",
    ]
    others = [
        harness.cdi_dir / ".nvidia.com-gpu.yaml.ab12_xyz.tmp",  # another writer's, maybe live
        harness.cdi_dir / f".{SPEC_PREFIX}uid-a.yaml.tmp",  # not a name atomic_write makes
        harness.cdi_dir / "notes.tmp",
        state / ".other.json.k3j4h5g6.tmp",
    ]
    for path in ours + others:
        path.write_text("partial")
    harness.start(state_dir=state)
    assert [p for p in ours if p.exists()] == []
    assert [p for p in others if not p.exists()] == []


# --------------------------------------------------------------------------- checkpoints (6)


def _wrong(doc: dict[str, Any], *path: Any, value: Any) -> dict[str, Any]:
    out = json.loads(json.dumps(doc))
    target = out
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return out


GOOD_ENTRY = {
    "namespace": "default",
    "name": "a",
    "devices": [
        {
            "requestNames": ["gpu"],
            "poolName": NODE_NAME,
            "deviceName": "gpu-0",
            "cdiDeviceIds": [f"k8s.{DRIVER}/claim=uid-a-gpu-0"],
            "shareId": None,
        }
    ],
    "shareable": {"gpu-0": False},
    "specPath": "",
}
GOOD = {"version": 1, "claims": {"uid-a": GOOD_ENTRY}}
BAD_SHAPES = {
    "shareable-missing": (_wrong(GOOD, "claims", "uid-a", "shareable", value=None), "shareable"),
    "devices-string": (_wrong(GOOD, "claims", "uid-a", "devices", value="gpu-0"), "devices"),
    "device-list": (_wrong(GOOD, "claims", "uid-a", "devices", 0, value=["gpu-0"]), "devices[0]"),
    "pool-number": (
        _wrong(GOOD, "claims", "uid-a", "devices", 0, "poolName", value=3),
        "poolName: a number",
    ),
    "ids-string": (
        _wrong(GOOD, "claims", "uid-a", "devices", 0, "cdiDeviceIds", value="x"),
        "cdiDeviceIds",
    ),
    "entry-list": (_wrong(GOOD, "claims", "uid-a", value=[]), "a list, not an object"),
    "uid-climbs": ({"version": 1, "claims": {"../x": GOOD_ENTRY}}, "not a Kubernetes UID"),
    "spec-elsewhere": (
        _wrong(GOOD, "claims", "uid-a", "specPath", value="/etc/cdi/k8s.x-claim_uid-a.yaml"),
        "specPath",
    ),
    "claims-list": ({"version": 1, "claims": []}, "claims is a list"),
    "version-3": ({"version": 3, "claims": {}}, "unknown layout (version 3, not 1 or 2)"),
    "version-2-unsummed": ({"version": 2, "claims": {}}, "its checksum does not match"),
    "state-unknown": (_wrong(GOOD, "claims", "uid-a", "state", value="Done"), ".state: 'Done'"),
    "placement-start": (
        _wrong(GOOD, "claims", "uid-a", "placements", value=[{"device": "d", "gpuUUID": "G"}]),
        ".placements[0].start: null",
    ),
    "top-list": ([], "a list, not an object"),
}


@pytest.mark.parametrize(("doc", "words"), list(BAD_SHAPES.values()), ids=list(BAD_SHAPES))
def test_a_checkpoint_entry_of_the_wrong_shape_is_one_line_at_load(
    tmp_path: Path, doc: Any, words: str
) -> None:
    from cdigen.plugin.dra.checkpoint import load_checkpoint

    path = tmp_path / "checkpoint.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError) as caught:
        load_checkpoint(path, spec_dir=tmp_path / "cdi", driver=DRIVER)
    message = str(caught.value)
    assert message.startswith(f"{path}: the checkpoint is not one cdigen wrote"), message
    assert words in message and "\n" not in message and len(message) < 500, message


def test_a_good_checkpoint_loads(tmp_path: Path) -> None:
    from cdigen.plugin.dra.checkpoint import load_checkpoint

    path = tmp_path / "checkpoint.json"
    path.write_text(json.dumps(GOOD))
    loaded = load_checkpoint(path, spec_dir=tmp_path / "cdi", driver=DRIVER)
    assert loaded.claims == {"uid-a": {**GOOD_ENTRY, "state": "PrepareCompleted"}}


@pytest.fixture
def serve_args(api: FakeApiServer, host: FakeHost, tmp_path: Path, kubelet_dir: Path) -> list[str]:
    kubeconfig = api.kubeconfig(tmp_path / "kubeconfig")
    node_file = tmp_path / "node.yaml"
    node_file.write_text(dump_node(host.node, "yaml"))
    return [
        sys.executable, "-m", "cdigen.cli", "dra", "serve",
        "--node", str(node_file), "--node-name", NODE_NAME, "--driver-name", DRIVER,
        "--kubelet-dir", str(kubelet_dir), "--cdi-dir", str(tmp_path / "run-cdi"),
        "--state-dir", str(tmp_path / "state"), "--kubeconfig", str(kubeconfig),
        "--driver-root", str(host.driver_root), "--dev-root", str(host.dev_root),
        "--sysfs-root", str(host.sysfs_root),
    ]  # fmt: skip


def _nested(depth: int) -> bytes:
    return b'{"version": 1, "claims": ' + b"[" * depth + b"]" * depth + b"}"


CHECKPOINT_FILES = {
    "not-utf8": (b'{"version": 1, "claims": {"\xff\xfe": 1}}', "not UTF-8"),
    "nested-100000": (_nested(100_000), "nested too deeply"),
    "entry-shape": (json.dumps({"version": 1, "claims": {"uid-a": {"x": 1}}}).encode(), "uid-a"),
    "too-big": (b" " * (5 << 20) + json.dumps(GOOD).encode(), "larger than 4194304 bytes"),
    "fifo": (None, "found a pipe"),
}


@pytest.mark.parametrize(("data", "words"), list(CHECKPOINT_FILES.values()), ids=CHECKPOINT_FILES)
def test_dra_serve_with_a_bad_checkpoint_says_one_line_naming_it_and_exits_2(
    serve_args: list[str], tmp_path: Path, data: bytes | None, words: str
) -> None:
    checkpoint = tmp_path / "state" / "checkpoint.json"
    checkpoint.parent.mkdir()
    if data is None:
        os.mkfifo(checkpoint)
    else:
        checkpoint.write_bytes(data)
    result = subprocess.run(
        serve_args,
        capture_output=True,
        text=True,
        timeout=60,  # a FIFO must not hang the start
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if str(checkpoint) in line]
    assert len(lines) == 1, result.stderr
    assert words in lines[0], lines[0]

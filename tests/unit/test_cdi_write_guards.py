"""The spec service's guards that the mutation run found unpinned (tests/README.md): claim specs
read back as written, every distinct spec-wide edit checked, the check cache bounded, the
lock's fall-back when the lock file cannot be created, the wait it reports, and how a conflict
with three files is worded."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from cdigen.cdi import write
from cdigen.cdi.write import LOCK_NAME, is_ours, spec_dir_lock, write_claim_spec
from cdigen.cli import main
from cdigen.errors import SchemaError
from cdigen.fileio import dump_document
from cdigen.nodefile import dump_node
from tests.cdihost import build_host, make_node

DEVICE = {"name": "uid-a-gpu-0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}}


def _claim_spec(edits: dict[str, Any] | None = None, device: dict[str, Any] = DEVICE) -> Any:
    spec: dict[str, Any] = {"cdiVersion": "0.5.0", "kind": "k8s.gpu.cdigen.dev/claim"}
    if edits is not None:
        spec["containerEdits"] = edits
    spec["devices"] = [device]
    return spec


def _env(value: str) -> dict[str, Any]:
    return {"env": [f"CDIGEN_TEST={value}"]}


@pytest.mark.parametrize("edits", [None, _env("a")], ids=["no-spec-edits", "spec-edits"])
def test_a_claim_spec_reads_back_as_written(tmp_path: Path, edits: dict[str, Any] | None) -> None:
    spec = _claim_spec(edits)
    result = write_claim_spec(spec, tmp_path / "a.json", within=tmp_path)
    assert result.changed and result.path == tmp_path / "a.json"
    assert json.loads((tmp_path / "a.json").read_text()) == spec


def test_every_distinct_spec_wide_edit_is_checked_and_a_bad_one_never_remembered(
    tmp_path: Path,
) -> None:
    good = _claim_spec(_env("good"))
    write_claim_spec(good, tmp_path / "good.json", within=tmp_path)
    bad = _claim_spec({"mounts": [{"hostPath": "/lib"}]})  # no containerPath
    for _ in range(2):  # refused again: a failed check is not cached as checked
        with pytest.raises(SchemaError):
            write_claim_spec(bad, tmp_path / "bad.json", within=tmp_path)
    assert not (tmp_path / "bad.json").exists()
    # the good spec-wide edits again, with a bad device: the devices are checked every time
    broken = _claim_spec(_env("good"), {**DEVICE, "containerEdits": {"deviceNodes": [{}]}})
    with pytest.raises(SchemaError):
        write_claim_spec(broken, tmp_path / "broken.json", within=tmp_path)


def test_the_check_cache_holds_at_most_64_spec_wide_edits(tmp_path: Path) -> None:
    write._CHECKED_EDITS.clear()
    for k in range(70):
        write_claim_spec(_claim_spec(_env(str(k))), tmp_path / f"{k}.json", within=tmp_path)
    assert len(write._CHECKED_EDITS) == 64
    assert json.dumps(_env("69")) in write._CHECKED_EDITS  # the newest stay
    assert json.dumps(_env("0")) not in write._CHECKED_EDITS


def test_json_text_that_is_not_json_is_not_ours() -> None:
    assert not is_ours("{not json", "json")
    assert is_ours(dump_document({"a": 1}, "json"), "json")


def test_a_lock_file_that_cannot_be_created_is_never_followed_through_a_symlink(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a read-only spec dir the lock file is opened read-only; a symlink planted there is
    refused (O_NOFOLLOW) and the caller goes on unlocked, never locking the link's target."""
    target = tmp_path / "elsewhere"
    target.write_text("")
    (tmp_path / LOCK_NAME).symlink_to(target)
    real_open = os.open

    def read_only_fs(path: Any, flags: int, *args: Any) -> int:
        if flags & os.O_CREAT:
            raise OSError(30, "Read-only file system")  # EROFS
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", read_only_fs)
    with spec_dir_lock(tmp_path):
        probe = real_open(target, os.O_RDONLY)
        try:
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free: nobody locked it
        finally:
            os.close(probe)


def test_waiting_for_the_lock_says_how_long(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    holder = os.open(tmp_path / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(holder, fcntl.LOCK_EX)
    done = threading.Event()

    def wait_for_it() -> None:
        with spec_dir_lock(tmp_path):
            done.set()

    caplog.set_level(logging.INFO)
    waiter = threading.Thread(target=wait_for_it)
    waiter.start()
    time.sleep(0.3)
    assert not done.is_set()
    os.close(holder)  # releases the lock
    waiter.join(5)
    assert done.is_set()
    (line,) = [r.getMessage() for r in caplog.records if "waited" in r.getMessage()]
    waited = float(line.split()[1])
    assert 0.2 <= waited < 5, line


def test_a_conflict_with_three_files_names_them_all(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = build_host(tmp_path / "host", make_node(2))
    out = tmp_path / "cdi"
    out.mkdir()
    foreign = {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": [{"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}}],
    }
    for name in ("a.yaml", "b.yaml", "c.yaml"):
        (out / name).write_text(dump_document(foreign, "yaml"))
    node_file = fake.base / "node.yaml"
    node_file.write_text(dump_node(fake.node, "yaml"))
    argv = ["generate", "--node", str(node_file), "--output-dir", str(out)]
    argv += ["--driver-root", str(fake.driver_root), "--dev-root", str(fake.dev_root)]
    argv += ["--sysfs-root", str(fake.sysfs_root)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"remove or move {out / 'a.yaml'}, {out / 'b.yaml'} and {out / 'c.yaml'} (" in err

"""Spec directories under faults and hostile neighbours (issue 13, points 2, 3, 9 and 11).

Modes that do not depend on the umask, foreign specs that fail to load, a failed directory fsync,
temp files left by a killed run, dangling links, and concurrent ``cdigen generate`` runs.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import multiprocessing
import os
import re
import signal
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cdigen.cdi.cache import SpecCache, load_state
from cdigen.cdi.write import LOCK_NAME
from cdigen.cli import main
from cdigen.nodefile import dump_node
from cdigen.plugin.agent.health import HealthBoard
from cdigen.plugin.agent.health_watchers import SpecDirWatcher
from tests.cdihost import FakeHost, build_host, make_node
from tests.helpers.cdi_runtime import CdiRuntime, cdi_runtime

OURS = "nvidia.com-gpu.yaml"
HEAD = "cdiVersion: 0.5.0\nkind: "
OTHER_DEVICE = "devices:\n- name: d0\n  containerEdits:\n    env: [A=1]\n"  # valid on its own
# Foreign specs that fail to load, each as the probe made it (kinds of two or more letters:
# the CDI library v1.1.0 panics on a one-letter class name).
MALFORMED = {
    "date.yaml": HEAD + "2001-01-01\n" + OTHER_DEVICE,
    "date-field.yaml": HEAD + "acme.com/tpu\n" + OTHER_DEVICE + "  when: 2001-01-01\n",
    "huge-int.yaml": HEAD + "acme.com/fpga\nsize: " + "9" * 5000 + "\n" + OTHER_DEVICE,
    "mixed-keys.yaml": HEAD + "acme.com/npu\n1: one\nb: two\n" + OTHER_DEVICE,
    "binary.yaml": HEAD + "acme.com/dsp\ndevices:\n- name: x\n"
    "  containerEdits:\n    env: [!!binary aGVsbG8=]\n",
    "set.yaml": HEAD + "acme.com/vpu\ndevices: !!set {a, b}\n",
    "list.yaml": "- just\n- a list\n",
    "bad-yaml.yaml": "kind: [\n",
}  # fmt: skip


@pytest.fixture
def fake(tmp_path: Path) -> FakeHost:
    return build_host(tmp_path / "host", make_node(2))


def generate_args(fake: FakeHost, out: Path, *extra: str) -> list[str]:
    node_file = fake.base / "node.yaml"
    if not node_file.exists():
        node_file.write_text(dump_node(fake.node, "yaml"))
    return [
        "generate", "--node", str(node_file),
        "--driver-root", str(fake.driver_root),
        "--dev-root", str(fake.dev_root),
        "--sysfs-root", str(fake.sysfs_root),
        "--output-dir", str(out),
        *extra,
    ]  # fmt: skip


def defined_devices(directory: Path) -> dict[str, list[str]]:
    """Qualified device name -> the files in ``directory`` that define it."""
    out: dict[str, list[str]] = {}
    for spec in load_state([directory]).files:
        for name in spec.device_names:
            out.setdefault(name, []).append(spec.path.name)
    return out


# --- point 2: modes that do not depend on the umask ----------------------------------------


@pytest.mark.usefixtures("umask_000")
def test_directories_and_files_generate_creates_ignore_the_umask(
    fake: FakeHost, tmp_path: Path
) -> None:
    out = tmp_path / "etc" / "cdi"
    assert main(generate_args(fake, out)) == 0
    for d in (tmp_path / "etc", out):
        assert stat.S_IMODE(d.stat().st_mode) == 0o755, d
    for f in (out / OURS, out / LOCK_NAME):
        assert stat.S_IMODE(f.stat().st_mode) == 0o644, f


# --- point 3: a malformed foreign spec is skipped and reported, never fatal ------------------


@pytest.fixture
def hostile_dir(fake: FakeHost, tmp_path: Path) -> Path:
    """Our spec, written by generate, beside every malformed foreign spec."""
    out = tmp_path / "cdi"
    assert main(generate_args(fake, out)) == 0
    for name, text in MALFORMED.items():
        (out / name).write_text(text)
    return out


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_each_malformed_spec_fails_to_load_with_a_reason(tmp_path: Path, name: str) -> None:
    (tmp_path / name).write_text(MALFORMED[name])
    registry = load_state([tmp_path])
    assert list(registry.errors) == [tmp_path / name]
    reason = registry.errors[tmp_path / name]
    assert "\n" not in reason and "Traceback" not in reason and len(reason) < 300
    assert registry.devices == {}


def test_list_reports_malformed_foreign_specs_and_still_lists_ours(
    hostile_dir: Path, fake: FakeHost, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["list", "--spec-dir", str(hostile_dir)]) == 1
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    failed = {
        Path(line.split("\t")[0]).name for line in out.splitlines() if "FAILED TO LOAD" in line
    }
    assert failed == set(MALFORMED)  # and never the lock file
    for gpu in fake.node.gpus:
        assert f"nvidia.com/gpu={gpu.uuid}\t{hostile_dir / OURS}" in out


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CdiRuntime]:
    yield from cdi_runtime(tmp_path_factory)


def test_cdi_library_rejects_the_same_files(hostile_dir: Path, podman: CdiRuntime) -> None:
    """podman's CDI library fails to load each malformed file (one load error each in its debug
    log, which names the file where parsing failed, not where validation did) and still resolves
    every device of ours beside them."""
    ours = sorted(load_state([hostile_dir]).devices)
    seen = podman.run(hostile_dir, ours)
    assert not seen.unresolvable(), seen.error  # resolved (plain-file nodes then fail to stat)
    refused = podman.run(hostile_dir, ["nvidia.com/gpu=none"], debug=True)
    assert refused.unresolvable(), refused.error
    failed = {Path(m).name for e in refused.load_errors for m in re.findall(r'Spec "([^"]+)"', e)}
    assert len(refused.load_errors) == len(MALFORMED), refused.load_errors
    assert failed <= set(MALFORMED) and len(failed) >= len(MALFORMED) - 2, refused.load_errors
    assert any('invalid environment variable "hello"' in e for e in refused.load_errors)  # binary
    assert any("invalid (empty) vendor name" in e for e in refused.load_errors)  # the date kind


def test_generate_writes_our_spec_beside_malformed_foreign_specs(
    fake: FakeHost, tmp_path: Path
) -> None:
    out = tmp_path / "cdi"
    out.mkdir()
    for name, text in MALFORMED.items():
        (out / name).write_text(text)
    assert main(generate_args(fake, out)) == 0
    assert len(load_state([out]).devices) == len(fake.node.gpus) * 2 + 1  # index, uuid, all


def test_plugin_keeps_every_gpu_healthy_beside_malformed_foreign_specs(
    hostile_dir: Path, fake: FakeHost, caplog: pytest.LogCaptureFixture
) -> None:
    uuids = [g.uuid for g in fake.node.gpus]
    board = HealthBoard(uuids)
    names = {u: [f"nvidia.com/gpu={u}"] for u in uuids}
    watcher = SpecDirWatcher(SpecCache([hostile_dir]), names, board)
    with caplog.at_level(logging.WARNING, logger="cdigen"):
        watcher.poll()
    assert all(board.healthy(u) for u in uuids), board.snapshot()
    skipped = {r.getMessage().split()[2] for r in caplog.records if "is skipped" in r.getMessage()}
    assert skipped == {str(hostile_dir / n) for n in MALFORMED}


def test_a_fault_in_the_spec_check_leaves_health_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    board = HealthBoard(["GPU-a"])
    good = tmp_path / "a.yaml"
    good.write_text(HEAD + "nvidia.com/gpu\n" + OTHER_DEVICE.replace("d0", "GPU-a"))
    cache = SpecCache([tmp_path])
    real = cache.state
    fault = RuntimeError("loader fault")
    steps: list[str] = ["ok", "fault", "gone", "fault"]

    def state() -> object:
        step = steps.pop(0)
        if step == "fault":
            raise fault
        if step == "gone":
            good.unlink()
        return real()

    monkeypatch.setattr(cache, "state", state)
    watcher = SpecDirWatcher(cache, {"GPU-a": ["nvidia.com/gpu=GPU-a"]}, board)
    healthy = []
    for _ in range(4):
        watcher.check()
        healthy.append(board.healthy("GPU-a"))
    assert healthy == [True, True, False, False]  # a fault is no evidence either way
    assert "missing from the spec dirs" in board.snapshot()[1]["GPU-a"][0]


# --- point 9: leftovers and edges ---------------------------------------------------------


def test_failed_directory_fsync_after_the_rename_is_a_warning(
    fake: FakeHost,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.EIO, "Input/output error")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    out = tmp_path / "cdi"
    with caplog.at_level(logging.WARNING, logger="cdigen"):
        assert main(generate_args(fake, out)) == 0  # no exception: the spec is written
    assert capsys.readouterr().out.startswith(f"wrote {out / OURS}")
    [warning] = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert warning.levelno == logging.WARNING
    assert f"{out / OURS}: written, but syncing {out} failed (Input/output error)" in (
        warning.getMessage()
    )
    assert main(["validate", str(out / OURS)]) == 0


def _killed_generate(args: list[str]) -> int:
    """Run generate in a child that SIGKILLs itself between writing its temp file and the rename;
    the child's exit status."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.replace = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)  # type: ignore[assignment]
            main(args)
        finally:
            os._exit(3)
    return os.waitpid(pid, 0)[1]


def test_temp_files_left_by_a_killed_run_are_removed_by_the_next(
    fake: FakeHost, tmp_path: Path
) -> None:
    out = tmp_path / "cdi"
    out.mkdir()
    strangers = [out / ".notes.tmp", out / "mine.yaml.tmp", out / ".x.yaml.short.tmp"]
    for p in strangers:
        p.write_text("not ours")
    status = _killed_generate(generate_args(fake, out))
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    [left] = [p for p in out.glob(".*.tmp") if p not in strangers]
    assert left.name.startswith(f".{OURS}.")
    # the next run, killed too, writing another name: removes the first one's temp file
    status = _killed_generate(generate_args(fake, out, "--output", str(out / "other.json")))
    assert os.WIFSIGNALED(status)
    [left] = [p for p in out.glob(".*.tmp") if p not in strangers]
    assert left.name.startswith(".other.json.")
    assert main(generate_args(fake, out)) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [LOCK_NAME, OURS, *(p.name for p in strangers)]
    )


def test_dangling_spec_symlink_is_named_as_such(
    fake: FakeHost, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cdi"
    out.mkdir()
    link = out / OURS
    link.symlink_to(tmp_path / "gone.yaml")
    expected = f"{link}: dangling symbolic link to '{tmp_path / 'gone.yaml'}'"

    assert main(["validate", str(link)]) == 2  # a file that cannot be read: bad input
    assert expected in capsys.readouterr().err

    assert main(generate_args(fake, out)) == 2
    err = capsys.readouterr().err
    assert expected in err and "not found" not in err and err.count("\n") == 1
    assert link.is_symlink()  # untouched

    assert main(["list", "--spec-dir", str(out)]) == 1
    assert f"{link}\tFAILED TO LOAD: dangling symbolic link" in capsys.readouterr().out


def test_read_only_spec_dir_unchanged_is_fine_and_a_change_is_one_line(
    fake: FakeHost,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "cdi"
    assert main(generate_args(fake, out)) == 0
    (out / LOCK_NAME).unlink()  # as an older cdigen left it: no lock file to open either
    real_open = os.open

    def read_only_open(path: str | os.PathLike[str], flags: int, *a: int, **k: int) -> int:
        if flags & os.O_CREAT and Path(path).parent == out:
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, flags, *a, **k)

    monkeypatch.setattr(os, "open", read_only_open)
    capsys.readouterr()
    assert main(generate_args(fake, out)) == 0
    assert capsys.readouterr().out.startswith(f"unchanged {out / OURS}")
    assert main(generate_args(fake, out, "--device-name-strategy", "uuid")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Read-only file system" in err


@pytest.mark.parametrize("thing", ["directory", "symlink"])
def test_something_in_the_way_of_the_lock_file_is_one_line_and_changes_nothing(
    fake: FakeHost, tmp_path: Path, capsys: pytest.CaptureFixture[str], thing: str
) -> None:
    out = tmp_path / "cdi"
    assert main(generate_args(fake, out)) == 0
    before = (out / OURS).read_bytes()
    lock = out / LOCK_NAME
    lock.unlink()
    if thing == "directory":
        lock.mkdir()
    else:
        lock.symlink_to(tmp_path / "elsewhere")  # never followed: it is not created there
    capsys.readouterr()
    assert main(generate_args(fake, out, "--device-name-strategy", "uuid")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{lock}: cannot open the lock file" in err
    assert "remove what is there" in err
    assert (out / OURS).read_bytes() == before and not (tmp_path / "elsewhere").exists()
    assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME, OURS]  # no temp file


# --- point 11: concurrent generate ---------------------------------------------------------


def _racer(args: list[str], barrier: multiprocessing.synchronize.Barrier) -> None:
    barrier.wait()
    os._exit(main(args))


def test_concurrent_generate_runs_never_define_a_device_twice(
    fake: FakeHost, tmp_path: Path
) -> None:
    ctx = multiprocessing.get_context("fork")
    for round_ in range(3):
        out = tmp_path / f"cdi{round_}"
        barrier = ctx.Barrier(10)
        runs = [
            ctx.Process(
                target=_racer,
                args=(generate_args(fake, out, "--output", str(out / f"s{i}.yaml")), barrier),
            )
            for i in range(10)
        ]
        for p in runs:
            p.start()
        for p in runs:
            p.join(60)
        codes = sorted(p.exitcode for p in runs)
        twice = {n: files for n, files in defined_devices(out).items() if len(files) > 1}
        assert twice == {}, f"round {round_}: {twice}"
        assert codes == [0] + [2] * 9, codes  # one wrote; the others saw its spec and refused


def test_a_run_that_waits_for_the_lock_says_so(
    fake: FakeHost, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "cdi"
    out.mkdir()
    codes: list[int] = []
    with open(out / LOCK_NAME, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with caplog.at_level(logging.INFO, logger="cdigen"):
            run = threading.Thread(target=lambda: codes.append(main(generate_args(fake, out))))
            run.start()
            time.sleep(0.3)
            assert not (out / OURS).exists()  # blocked on the lock
            fcntl.flock(held, fcntl.LOCK_UN)
            run.join(30)
    assert codes == [0] and (out / OURS).exists()
    waited = [r.getMessage() for r in caplog.records if "waited" in r.getMessage()]
    assert len(waited) == 1 and f"another cdigen run writing {out}" in waited[0]

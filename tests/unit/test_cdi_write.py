"""``cdigen generate`` writing into a spec directory: atomic, unchanged-aware, conflict-refusing."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from cdigen.cdi.write import HEADER_MARK, LOCK_NAME, is_ours
from cdigen.cli import main
from cdigen.fileio import dump_document
from cdigen.nodefile import dump_node
from tests.cdihost import FakeHost, build_host, make_node

FOREIGN = {
    "cdiVersion": "0.5.0",
    "kind": "nvidia.com/gpu",
    "devices": [{"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}}],
}


@pytest.fixture
def fake(tmp_path: Path) -> FakeHost:
    return build_host(tmp_path / "host", make_node(2))


def generate(fake: FakeHost, out: Path, *extra: str) -> int:
    node_file = fake.base / "node.yaml"
    node_file.write_text(dump_node(fake.node, "yaml"))
    return main(
        [
            "generate", "--node", str(node_file),
            "--driver-root", str(fake.driver_root),
            "--dev-root", str(fake.dev_root),
            "--sysfs-root", str(fake.sysfs_root),
            "--output-dir", str(out),
            *extra,
        ]
    )  # fmt: skip


def snapshot(directory: Path) -> dict[str, tuple[bytes, int, int]]:
    """name -> (content, inode, mtime_ns) of every file in ``directory`` but the (empty) lock."""
    out = {}
    for p in sorted(directory.iterdir()):
        if p.name == LOCK_NAME:
            continue
        st = p.stat()
        out[p.name] = (p.read_bytes(), st.st_ino, st.st_mtime_ns)
    return out


def test_writes_a_valid_spec_with_mode_0644(
    fake: FakeHost, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cdi"
    assert generate(fake, out) == 0
    target = out / "nvidia.com-gpu.yaml"
    assert capsys.readouterr().out == f"wrote {target} (5 devices, cdiVersion 0.5.0)\n"
    assert target.read_text().startswith(HEADER_MARK)
    assert (target.stat().st_mode & 0o777) == 0o644
    assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME, "nvidia.com-gpu.yaml"]  # no temp
    assert main(["validate", str(target)]) == 0


def test_second_run_leaves_the_file_untouched(
    fake: FakeHost, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cdi"
    assert generate(fake, out) == 0
    before = snapshot(out)
    capsys.readouterr()
    assert generate(fake, out) == 0
    assert capsys.readouterr().out.startswith(f"unchanged {out / 'nvidia.com-gpu.yaml'}")
    assert snapshot(out) == before


def test_a_change_is_written(fake: FakeHost, tmp_path: Path) -> None:
    out = tmp_path / "cdi"
    assert generate(fake, out) == 0
    before = (out / "nvidia.com-gpu.yaml").read_text()
    assert generate(fake, out, "--device-name-strategy", "uuid") == 0
    after = (out / "nvidia.com-gpu.yaml").read_text()
    assert after != before and "name: '0'" not in after


def test_failing_rename_leaves_the_previous_file(
    fake: FakeHost,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "cdi"
    assert generate(fake, out) == 0
    before = snapshot(out)

    def failing_replace(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", failing_replace)
    assert generate(fake, out, "--device-name-strategy", "uuid") == 2
    err = capsys.readouterr().err
    assert "previous file is unchanged" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert snapshot(out) == before  # and the temp file is gone


def test_foreign_spec_defining_our_device_is_a_conflict(
    fake: FakeHost, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cdi"
    assert generate(fake, out) == 0
    foreign = out / "nvidia.yaml"
    foreign.write_text(dump_document(FOREIGN, "yaml"))
    before = snapshot(out)
    assert generate(fake, out, "--device-name-strategy", "uuid,index") == 2
    err = capsys.readouterr().err.strip()
    assert f"{foreign} already defines nvidia.com/gpu=0" in err
    assert "\n" not in err
    assert snapshot(out) == before


def test_a_conflict_with_two_files_names_both_to_move(
    fake: FakeHost, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # moving only the file the hint named used to leave the run refused by the other one
    out = tmp_path / "cdi"
    out.mkdir()
    first, second = out / "a.yaml", out / "b.yaml"
    first.write_text(dump_document(FOREIGN, "yaml"))
    second.write_text(dump_document(FOREIGN, "yaml"))
    assert generate(fake, out) == 2
    err = capsys.readouterr().err.strip()
    assert f"remove or move {first} and {second} (" in err
    assert "\n" not in err


def test_a_conflict_counts_devices_not_file_device_pairs(
    fake: FakeHost, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # two copies of one 2-device spec said "(and 3 more)" for 2 names (it counted the pairs)
    out = tmp_path / "cdi"
    out.mkdir()
    two = {**FOREIGN, "devices": [*FOREIGN["devices"], {**FOREIGN["devices"][0], "name": "1"}]}
    for name in ("a.yaml", "b.yaml"):
        (out / name).write_text(dump_document(two, "yaml"))
    assert generate(fake, out) == 2
    err = capsys.readouterr().err.strip()
    assert f"{out / 'a.yaml'} already defines nvidia.com/gpu=0 (and 1 more);" in err, err


def test_our_own_other_format_file_is_named_as_ours(
    fake: FakeHost, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the hint said "for example an nvidia-ctk spec" about cdigen's own --format json file
    out = tmp_path / "cdi"
    assert generate(fake, out, "--format", "json") == 0
    before = snapshot(out)
    capsys.readouterr()
    assert generate(fake, out) == 2
    err = capsys.readouterr().err.strip()
    own = out / "nvidia.com-gpu.json"
    assert f"{own} is cdigen's own spec for this kind in the other --format: delete it" in err
    assert "nvidia-ctk" not in err and "\n" not in err
    assert snapshot(out) == before
    own.unlink()
    assert generate(fake, out) == 0


def test_foreign_spec_for_other_devices_is_fine(fake: FakeHost, tmp_path: Path) -> None:
    out = tmp_path / "cdi"
    out.mkdir()
    other = {**FOREIGN, "kind": "example.com/net"}
    (out / "example.yaml").write_text(dump_document(other, "yaml"))
    (out / "notes.txt").write_text("kind: nvidia.com/gpu\n")  # runtimes ignore it; so do we
    assert generate(fake, out) == 0


def test_existing_file_not_written_by_cdigen_is_not_clobbered(
    fake: FakeHost, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cdi"
    out.mkdir()
    target = out / "nvidia.com-gpu.yaml"
    target.write_text(dump_document(FOREIGN, "yaml"))
    before = snapshot(out)
    assert generate(fake, out) == 2
    assert "was not written by cdigen" in capsys.readouterr().err
    assert snapshot(out) == before


@pytest.mark.parametrize("fmt", ["yaml", "json"])
@pytest.mark.parametrize("blank", ["", "\n \n"])
def test_an_empty_spec_file_is_taken_over(
    fake: FakeHost, tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str, blank: str
) -> None:
    """What a power loss under a writer that does not fsync leaves, or a ``touch``: the file
    defines nothing (runtimes fail to load it), so refusing it would only leave the node
    without GPUs until someone deletes it by hand."""
    out = tmp_path / "cdi"
    out.mkdir()
    target = out / f"nvidia.com-gpu.{fmt}"
    target.write_text(blank)
    assert generate(fake, out, "--format", fmt) == 0
    assert capsys.readouterr().out.startswith(f"wrote {target}")
    assert is_ours(target.read_text(), fmt)
    assert main(["validate", str(target)]) == 0


def test_json_output_and_its_ownership(
    fake: FakeHost, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cdi"
    assert generate(fake, out, "--format", "json") == 0
    target = out / "nvidia.com-gpu.json"
    text = target.read_text()
    assert is_ours(text, "json")
    before = snapshot(out)
    assert generate(fake, out, "--format", "json") == 0
    assert snapshot(out) == before
    target.write_text(text.replace("\n  ", "\n    "))  # hand-edited: no longer canonical
    assert not is_ours(target.read_text(), "json")
    assert generate(fake, out, "--format", "json") == 2
    assert "was not written by cdigen" in capsys.readouterr().err


def test_dry_run_and_stdout_write_nothing(
    fake: FakeHost, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cdi"
    assert generate(fake, out, "--dry-run") == 0
    assert capsys.readouterr().out.startswith(HEADER_MARK)
    assert generate(fake, out, "--output", "-", "--format", "json") == 0
    assert capsys.readouterr().out.startswith('{\n  "cdiVersion": "0.5.0"')
    assert not out.exists()


def test_output_to_a_named_file(fake: FakeHost, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere" / "gpus.yaml"
    assert generate(fake, tmp_path / "unused", "--output", str(target)) == 0
    assert target.read_text().startswith(HEADER_MARK)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--vendor", "nvidia com"], "invalid vendor 'nvidia com'"),
        (["--class", "gpu/"], "invalid class 'gpu/'"),
        (["--cdi-version", "0.4.0"], "--cdi-version: cdiVersion 0.4.0 is too low"),
        (["--cdi-version", "2.0.0"], "unknown cdiVersion '2.0.0'"),
        (["--device-name-strategy", "minor"], "unknown device name strategy 'minor'"),
        (["--hook-path", "nvidia-cdi-hook"], "--hook-path: 'nvidia-cdi-hook' is not an absolute"),
    ],
)
def test_bad_flags_are_one_line_errors(
    fake: FakeHost,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    flags: list[str],
    message: str,
) -> None:
    assert generate(fake, tmp_path / "cdi", *flags) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err
    assert not (tmp_path / "cdi").exists()


def test_hook_found_under_the_driver_root(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = build_host(tmp_path, make_node(1), hook=True)
    assert generate(fake, tmp_path / "cdi", "--dry-run") == 0
    assert f"path: {fake.driver_root}/usr/bin/nvidia-cdi-hook" in capsys.readouterr().out


def test_write_spec_refuses_an_invalid_spec(tmp_path: Path) -> None:
    from cdigen.cdi.write import write_spec
    from cdigen.errors import SchemaError

    bad: Any = {**FOREIGN, "containerEdits": {"env": ["NOEQUALS"]}}
    with pytest.raises(SchemaError, match="invalid environment variable 'NOEQUALS'"):
        write_spec(bad, tmp_path / "nvidia.com-gpu.yaml", "yaml")
    assert list(tmp_path.iterdir()) == []


def test_acceptance_builtin_rtx4090_dry_run_on_this_host(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The issue's example, with the default roots: works with no driver on the machine."""
    from cdigen.fileio import parse_document

    assert main(["generate", "--node", "builtin:rtx4090", "--dry-run"]) == 0
    spec = parse_document(capsys.readouterr().out, where="stdout")
    assert spec["cdiVersion"] == "0.5.0"
    names = [d["name"] for d in spec["devices"]]
    assert names[0] == "0" and names[1].startswith("GPU-") and names[2:] == ["all"]


def test_output_dir_that_is_a_file(
    fake: FakeHost, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("keep me\n")
    assert generate(fake, not_a_dir) == 2
    assert f"{not_a_dir} is not a directory" in capsys.readouterr().err
    assert not_a_dir.read_text() == "keep me\n"


def _uninstall_commands() -> list[str]:
    """The shell commands docs/install.md's Uninstall section gives for the spec dirs."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "install.md").read_text()
    section = text.split("## 8. Uninstall", 1)[1].split("\n## ", 1)[0]
    found = re.findall(r"^\s*\$ (.*)$", section, re.M) + re.findall(r"`(sudo rm [^`]*)`", section)
    return [c for c in found if "/etc/cdi" in c or "/var/run/cdi" in c]


def test_the_documented_uninstall_removes_only_what_cdigen_wrote(
    fake: FakeHost, tmp_path: Path
) -> None:
    etc, run = tmp_path / "etc-cdi", tmp_path / "run-cdi"
    assert generate(fake, etc) == 0
    assert generate(fake, run, "--vendor", "example.com") == 0  # ours, of another kind
    hand_written = run / "nvidia.com-gpu.yaml"  # cdigen refuses to overwrite it: not ours
    hand_written.write_text(dump_document(FOREIGN, "yaml"))
    other_tool = etc / "nvidia.yaml"
    other_tool.write_text("# Generated by nvidia-ctk\n" + dump_document(FOREIGN, "yaml"))
    commands = _uninstall_commands()
    assert commands, "docs/install.md gives no command that cleans the spec dirs"
    for command in commands:
        local = command.replace("sudo ", "").replace("/etc/cdi", str(etc))
        subprocess.run(["bash", "-c", local.replace("/var/run/cdi", str(run))], check=True)
    assert sorted(p.name for p in etc.iterdir()) == [other_tool.name]
    assert sorted(p.name for p in run.iterdir()) == [hand_written.name]
    assert hand_written.read_text() == dump_document(FOREIGN, "yaml")

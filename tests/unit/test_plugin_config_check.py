"""``cdigen plugin config check FILE``: a config loaded as ``plugin serve`` loads it, what the
kubelet would see printed; exit 1 for a config serve would refuse, 2 for bad input. And the
one-line errors a config file gets (issue 35 f)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cdigen.cli import main

RTX = "builtin:rtx4090"
EIGHT = "builtin:pcie-8x4090"


def check(
    tmp_path: Path, text: str | None, capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[int, str, str]:
    path = tmp_path / "plugin.yaml"
    if text is not None:
        path.write_text(text)
    code = main(["plugin", "config", "check", str(path), *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_first_recipe_shows_four_replicas_each_with_its_mps_limit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = (
        "resources:\n  - name: nvidia.com/gpu\n    sharing:\n      replicas: 4\n"
        "      mps: {pipeDirectory: /run/nvidia/mps, shmDirectory: /run/nvidia/mps-shm}\n"
    )
    code, out, err = check(tmp_path, text, capsys, "--node", RTX)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[1] == "resource nvidia.com/gpu: 4 devices (4 replicas per GPU, MPS; policy spread)"
    assert "4 devices; one share gets CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=6141M" in lines[2]
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25" in lines[2]
    assert lines[-1] == "ok: plugin serve would start with this config"


def test_split_gpus_show_per_resource_and_what_is_left_unadvertised(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = (
        "resources:\n  - {name: nvidia.com/gpu, gpus: [0, 1]}\n"
        "  - {name: nvidia.com/gpu-memory, gpus: [7], sharing: {memorySliceMiB: 4096}}\n"
    )
    code, out, _ = check(tmp_path, text, capsys, "--node", EIGHT)
    assert code == 0
    assert "resource nvidia.com/gpu: 2 devices (whole GPUs; policy default)" in out
    assert "resource nvidia.com/gpu-memory: 5 devices (4096 MiB memory slices" in out
    assert "=0=4096M" in out
    assert out.count("not advertised: GPU 2 ") == 1  # GPUs 2-6 have no owner
    assert "warning: nvidia.com/gpu-memory: memory slices without sharing.mps" in out


@pytest.mark.parametrize(
    ("text", "node", "message"),
    [
        # the config: whole GPUs and slices of the same GPUs
        (
            "resources: [{name: nvidia.com/gpu}, "
            "{name: nvidia.com/gpu-memory, sharing: {memorySliceMiB: 1024}}]\n",
            RTX,
            "resources nvidia.com/gpu and nvidia.com/gpu-memory would both advertise every GPU",
        ),
        # only the node shows it: index 0 is a 4090
        (
            "resources: [{name: nvidia.com/gpu, gpus: [0]}, "
            "{name: a.com/r, gpus: ['*4090*'], sharing: {replicas: 2}}]\n",
            EIGHT,
            "resources nvidia.com/gpu and a.com/r would both advertise GPU 0 (NVIDIA GeForce",
        ),
        # issue 35 f: the --resource line, not a regex
        (
            "resources: [{name: gpu}]\n",
            RTX,
            "resources[0].name: resource name 'gpu' has no domain (DOMAIN/NAME); use "
            "DOMAIN/NAME, e.g. nvidia.com/gpu",
        ),
        # issue 35 f: a did-you-mean for a misspelt field
        (
            "resources: [{name: a.com/s, sharing: {memorySliceMib: 1024}}]\n",
            RTX,
            "resources[0].sharing: unknown field 'memorySliceMib': did you mean 'memorySliceMiB'?",
        ),
        ("resources: [{name: a.com/s, gpus: [-1]}]\n", RTX, "resources[0].gpus"),
        ("resources: [{name: a.com/s, gpus: [0, 0]}]\n", RTX, "0 is listed twice"),
        ("resources: [{name: a.com/s, policy: nope}]\n", RTX, "nope"),
    ],
)
def test_a_config_serve_would_refuse_is_one_line_exit_1(
    text: str, node: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = check(tmp_path, text, capsys, "--node", node)
    assert code == 1 and out == ""
    assert message in err and str(tmp_path / "plugin.yaml") in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize(
    ("text", "args", "message"),
    [
        (None, ("--node", RTX), "plugin config file not found"),
        ("resources: [\n", ("--node", RTX), "plugin.yaml"),
        ("resources: [{name: a.com/x}]\n", ("--node", "builtin:nope"), "builtin:nope"),
        ("resources: [{name: a.com/x}]\n", ("--policy-dir", "/nonexistent"), "--policy-dir"),
    ],
)
def test_bad_input_is_one_line_exit_2(
    text: str | None,
    args: tuple[str, ...],
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = check(tmp_path, text, capsys, *args)
    assert code == 2 and message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_serve_refuses_what_check_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "plugin.yaml"
    path.write_text(
        "resources: [{name: nvidia.com/gpu}, {name: a.com/r, sharing: {replicas: 2}}]\n"
    )
    args = ["plugin", "serve", "--node", RTX, "--config", str(path)]
    assert main([*args, "--plugin-dir", str(tmp_path / "dp")]) == 2
    err = capsys.readouterr().err
    assert "resources nvidia.com/gpu and a.com/r would both advertise every GPU" in err
    assert len(err.strip().splitlines()) == 1


def test_an_error_is_put_under_the_file_whatever_the_file_is_called(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 36 point 4: which errors name the file is known, not guessed from their text (a
    file called ``CDI`` once hid itself behind the field ``CDI kind``)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CDIGEN_CDI_KIND", "no-slash")
    (tmp_path / "CDI").write_text("resources: [{name: nvidia.com/gpu}]\n")
    assert main(["plugin", "config", "check", "CDI", "--node", RTX]) == 1
    err = capsys.readouterr().err
    assert err.startswith("cdigen: error: CDI: CDI kind: ") and err.count("\n") == 1, err


def test_a_rename_the_config_cannot_take_is_bad_usage_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CDIGEN_RESOURCE", "example.com/accel")
    text = (
        "resources: [{name: a.com/s, sharing: {replicas: 2}, gpus: [0]}, "
        "{name: a.com/t, sharing: {replicas: 2}, gpus: [1]}]\n"
    )
    code, _, err = check(tmp_path, text, capsys, "--node", EIGHT)
    assert code == 2 and "--resource/CDIGEN_RESOURCE: the config lists 2 resources" in err
    assert err.count("\n") == 1


_OPENED: list[str] = []  # what the audit hook saw opened while a test listened
_HOOKED: list[bool] = []  # an audit hook stays for the process: it is added once


def _listen(event: str, args: tuple[object, ...]) -> None:
    if event == "open" and _OPENED and isinstance(args[0], str | Path):
        _OPENED.append(str(args[0]))


def test_the_config_file_is_read_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One read: what is checked is what was parsed, even when the file is replaced meanwhile
    (a ConfigMap update); seen as the OS sees it, by Python's audit hook on open."""
    if not _HOOKED:
        sys.addaudithook(_listen)
        _HOOKED.append(True)
    path = tmp_path / "plugin.yaml"
    path.write_text("resources: [{name: nvidia.com/gpu, sharing: {replicas: 2}}]\n")
    _OPENED.append("")  # listening
    try:
        code = main(["plugin", "config", "check", str(path), "--node", RTX])
    finally:
        opened, _OPENED[:] = _OPENED[1:], []
    assert code == 0, capsys.readouterr().err
    assert opened.count(str(path)) == 1, opened

"""NVIDIA's device-plugin config and environment names, read as cdigen's.

The configs below are the examples of NVIDIA's k8s-device-plugin documentation (time-slicing,
MPS, MIG, renamed resources), written here as data.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cdigen.cli import main
from plugin.config import load_config
from plugin.nvidia_config import nvidia_env
from tests.helpers.nvidia_configs import MIG_MIXED, MPS, RENAMED, RESOURCES, TIME_SLICING

# (NVIDIA's config, our resources, our top-level settings, a note that must be there)
CASES = {
    "time-slicing": (
        TIME_SLICING,
        [{"name": "nvidia.com/gpu", "sharing": {"replicas": 10}}],
        {"migStrategy": "none", "driverRoot": "/", "deviceListStrategy": "envvar"},
        "flags.failOnInitError: no equivalent",
    ),
    "renameByDefault": (
        RENAMED,
        [
            {
                "name": "nvidia.com/gpu.shared",
                "sharing": {"replicas": 4, "failRequestsGreaterThanOne": True},
            }
        ],
        {},
        None,
    ),
    "mps": (
        MPS,
        [
            {
                "name": "nvidia.com/gpu",
                "sharing": {
                    "replicas": 10,
                    "mps": {
                        "pipeDirectory": "/run/nvidia/mps",
                        "shmDirectory": "/run/nvidia/mps-shm",
                    },
                },
            }
        ],
        {},
        "sharing.mps: needs an MPS control daemon",
    ),
    "mig-mixed": (MIG_MIXED, [], {"migStrategy": "mixed"}, None),
    "resources": (
        RESOURCES,
        [{"name": "nvidia.com/gpu.ts", "sharing": {"replicas": 2}}],
        {"deviceListStrategy": "cdi-cri"},
        "volume-mounts dropped",
    ),
}


def _convert(tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]) -> tuple[dict, str]:
    source = tmp_path / "nvidia.yaml"
    source.write_text(text)
    out = tmp_path / "cdigen.yaml"
    assert main(["plugin", "config", "convert", str(source), "--output", str(out)]) == 0
    return yaml.safe_load(out.read_text()), capsys.readouterr().err


@pytest.mark.parametrize("case", CASES)
def test_nvidia_documented_configs_convert_to_configs_that_load(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text, resources, settings, note = CASES[case]
    doc, err = _convert(tmp_path, text, capsys)
    assert doc["apiVersion"] == "cdigen/v1alpha1"
    assert doc.get("resources", []) == resources
    assert {k: doc[k] for k in settings} == settings
    if note:
        assert (
            note in err
            and f"# note: {err.split('note: ', 1)[1].splitlines()[0]}"
            in (tmp_path / "cdigen.yaml").read_text()
        )
    config = load_config(tmp_path / "cdigen.yaml", env={})  # loads as the plugin would
    names = [r["name"] for r in resources] or ["nvidia.com/gpu"]
    assert [r.name for r in config.resources] == names


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("version: v2\n", "unknown NVIDIA config version 'v2'"),
        ("version: v1\nflags: {migStrategy: some}\n", "unknown MIG strategy 'some'"),
        (MPS + "flags: {migStrategy: mixed}\n", "sharing.mps with migStrategy mixed"),
        (
            "version: v1\nsharing: {timeSlicing: {resources: [{name: gpu, replicas: 0}]}}\n",
            "replicas must be a positive integer, got 0",
        ),
        ("version: v1\nflags: [1]\n", "flags must be a mapping"),
        ("resources:\n  - name: nvidia.com/gpu\n", "not NVIDIA's device-plugin config format"),
    ],
)
def test_bad_or_foreign_input_is_one_line_exit_2(
    text: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "in.yaml"
    source.write_text(text)
    assert main(["plugin", "config", "convert", str(source)]) == 2
    err = capsys.readouterr().err
    assert message in err and str(source) in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_plugin_serve_given_nvidia_config_names_the_convert_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "nvidia.yaml"
    source.write_text(TIME_SLICING)
    args = ["plugin", "serve", "--node", "builtin:rtx4090", "--config", str(source)]
    assert main([*args, "--plugin-dir", str(tmp_path / "dp")]) == 2
    err = capsys.readouterr().err.strip()
    assert "NVIDIA's device-plugin config format" in err
    assert f"cdigen plugin config convert {source}" in err
    assert len(err.splitlines()) == 1


def test_nvidia_env_names_mean_ours_with_a_deprecation_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = {"MIG_STRATEGY": "mixed", "NVIDIA_DRIVER_ROOT": "/run/nvidia/driver"}
    config = load_config(env=env)
    assert (config.mig_strategy, config.driver_root) == ("mixed", "/run/nvidia/driver")
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert "MIG_STRATEGY is NVIDIA's name for CDIGEN_MIG_STRATEGY" in warned[0]
    assert len(warned) == 2


def test_our_env_name_wins_over_nvidias() -> None:
    mapped, lines = nvidia_env({"MIG_STRATEGY": "mixed", "CDIGEN_MIG_STRATEGY": "single"})
    assert mapped == {}
    assert lines == ("MIG_STRATEGY is NVIDIA's name; CDIGEN_MIG_STRATEGY is set too and wins",)
    assert (
        load_config(env={"MIG_STRATEGY": "mixed", "CDIGEN_MIG_STRATEGY": "single"}).mig_strategy
        == "single"
    )


def test_a_list_strategy_we_lack_is_ignored_with_a_line() -> None:
    mapped, lines = nvidia_env({"DEVICE_LIST_STRATEGY": "volume-mounts"})
    assert mapped == {} and "has no equivalent here" in lines[0]
    mapped, _ = nvidia_env({"DEVICE_LIST_STRATEGY": "volume-mounts,cdi-annotations"})
    assert mapped == {"CDIGEN_DEVICE_LIST_STRATEGY": "cdi-annotations"}


def test_the_install_docs_conversion_runs_as_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import re

    doc = (Path(__file__).resolve().parents[2] / "docs" / "install.md").read_text()
    source = next(b for b in re.findall(r"```yaml\n(.*?)```", doc, re.S) if "# nvidia-config" in b)
    session = next(b for b in re.findall(r"```console\n(.*?)```", doc, re.S) if "convert" in b)
    convert, _, shown = session.partition("$ grep -v '^#' cdigen-config.yaml\n")
    command, *printed = convert.splitlines()
    (tmp_path / "nvidia-config.yaml").write_text(source)
    monkeypatch.chdir(tmp_path)
    assert main(command.split()[2:]) == 0
    assert capsys.readouterr().err.splitlines() == printed
    written = (tmp_path / "cdigen-config.yaml").read_text().splitlines()
    assert [line for line in written if not line.startswith("#")] == shown.splitlines()

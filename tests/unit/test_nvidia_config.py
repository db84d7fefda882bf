"""NVIDIA's device-plugin config and environment names, read as cdigen's.

The configs below are the examples of NVIDIA's k8s-device-plugin documentation (time-slicing,
MPS, MIG, renamed resources), written here as data.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cdigen.cli import main
from cdigen.plugin.deviceplugin.config import load_config
from cdigen.plugin.deviceplugin.nvidia_env import nvidia_env
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
        ("version: v1\nflags: [1]\n", "flags: expected a mapping, got [1]"),
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


SHARED_4 = "  timeSlicing:\n    {key}\n    resources: [{{name: nvidia.com/gpu, replicas: 4}}]\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # issue 35: a misspelt key is refused with a did-you-mean, at every level
        (
            "version: v1\nsharing:\n" + SHARED_4.format(key="renameByDefalt: true"),
            "sharing.timeSlicing.renameByDefalt: unknown key 'renameByDefalt'; "
            "did you mean 'renameByDefault'?",
        ),
        ("verison: v1\nflags: {}\n", "verison: unknown key 'verison'; did you mean 'version'?"),
        ("version: v1\nflags: {migStrategey: none}\n", "did you mean 'migStrategy'?"),
        (
            "version: v1\nflags: {plugin: {passDeviceSpec: true}}\n",
            "did you mean 'passDeviceSpecs'?",
        ),
        ("version: v1\nresources: {gpu: []}\n", "resources.gpu: unknown key 'gpu'"),
        # issue 36: values of the wrong type are not read as something else
        (
            "version: v1\nsharing:\n" + SHARED_4.format(key="renameByDefault: 'false'"),
            'renameByDefault: expected true or false, got "false" (a string',
        ),
        (
            "version: v1\nsharing:\n" + SHARED_4.format(key="failRequestsGreaterThanOne: 'false'"),
            'failRequestsGreaterThanOne: expected true or false, got "false"',
        ),
        (
            "version: v1\nflags: {nvidiaDriverRoot: {path: /run/nvidia/driver}}\n",
            'flags.nvidiaDriverRoot: expected a string, got {"path"',
        ),
        # issue 36: unknown keys inside blocks are refused, not dropped
        (
            "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
            "    - {name: nvidia.com/gpu, replicas: 4, memoryLimit: 3Gi}\n",
            "sharing.timeSlicing.resources[0].memoryLimit: unknown key 'memoryLimit'",
        ),
        (
            "version: v1\nsharing:\n" + SHARED_4.format(key="oversubscribe: true"),
            "sharing.timeSlicing.oversubscribe: unknown key 'oversubscribe'",
        ),
        (
            "version: v1\nresources:\n  gpus: [{pattern: '*', name: gpu, count: 2}]\n",
            "resources.gpus[0].count: unknown key 'count'",
        ),
        # issue 36: two entries for one resource: one clear error
        (
            "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
            "    - {name: nvidia.com/gpu, replicas: 4}\n"
            "    - {name: nvidia.com/gpu, replicas: 2}\n",
            "resources[0] and resources[1] both give resource nvidia.com/gpu",
        ),
        (
            "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
            "    - {name: nvidia.com/gpu, rename: a, replicas: 2}\n"
            "    - {name: nvidia.com/gpu, rename: b, replicas: 4, devices: [1]}\n",
            "resources[0] and resources[1] both share nvidia.com/gpu, and resources[0] every GPU",
        ),
        # issue 36: no tracebacks on values of the wrong shape
        ("version: v1\nflags: {plugin: {deviceListStrategy: 5}}\n", "expected a strategy name"),
        ("version: v1\nflags: {plugin: {deviceListStrategy: cdi}}\n", "unknown device list"),
        (
            "version: v1\nsharing: {timeSlicing: yes-please}\n",
            'sharing.timeSlicing: expected a mapping, got "yes-please"',
        ),
        (
            "version: v1\nsharing: {timeSlicing: [1, 2]}\n",
            "sharing.timeSlicing: expected a mapping, got [1, 2]",
        ),
        ("version: v1\nsharing: {mps: 3}\n", "sharing.mps: expected a mapping, got 3"),
        (
            "version: v1\nsharing:\n  timeSlicing:\n    resources: [{name: nvidia.com/gpu, "
            "replicas: 2, devices: [MIG-1]}]\n",
            "'MIG-1' is a MIG device",
        ),
        # a setting cdigen cannot express is refused unless dropping it is asked for
        (
            "version: v1\nflags: {gdsEnabled: true}\n",
            "cannot express flags.gdsEnabled: true (no GDS injection",
        ),
        (
            "version: v1\nflags: {plugin: {deviceIDStrategy: index}, mofedEnabled: true}\n",
            'cannot express flags.plugin.deviceIDStrategy: "index" (the kubelet gets GPU '
            "UUIDs) (and 1 more); change or remove it, or pass --drop-unsupported",
        ),
        (
            "version: v1\nresources:\n  gpus: [{pattern: '*A100*', name: a100}, "
            "{pattern: '*', name: other}]\n",
            "cannot express resources.gpus[1] (cdigen serves one whole-GPU resource",
        ),
    ],
)
def test_convert_refuses_what_it_would_otherwise_change_or_drop(
    text: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "in.yaml"
    source.write_text(text)
    assert main(["plugin", "config", "convert", str(source)]) == 2
    err = capsys.readouterr().err
    assert message in err and str(source) in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_dropping_what_cannot_be_expressed_names_each_dropped_setting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "in.yaml"
    source.write_text(
        "version: v1\nflags: {gdsEnabled: true, plugin: {deviceListStrategy: volume-mounts}}\n"
        "sharing:\n  timeSlicing:\n    resources: [{name: nvidia.com/gpu, replicas: 4, "
        "devices: [0, GPU-8f6e0a2c-0000-1111-2222-333344445555]}]\n"
    )
    out = tmp_path / "out.yaml"
    args = ["plugin", "config", "convert", str(source), "-o", str(out), "--drop-unsupported"]
    assert main(args) == 0
    dropped = [line for line in capsys.readouterr().err.splitlines() if "dropped:" in line]
    assert [line.split(":")[2].strip() for line in dropped] == [
        "flags.plugin.deviceListStrategy",
        "flags.gdsEnabled",
        "sharing.timeSlicing.resources[0] devices",
    ]
    written = out.read_text()
    assert written.count("# dropped: ") == 3
    doc = yaml.safe_load(written)
    # what could be kept is kept: the devices list became the resource's gpus
    assert doc["resources"] == [
        {
            "name": "nvidia.com/gpu",
            "gpus": [0, "GPU-8f6e0a2c-0000-1111-2222-333344445555"],
            "sharing": {"replicas": 4},
        }
    ]
    assert load_config(out, env={}).resources[0].gpus is not None


def test_a_gpu_pattern_becomes_the_resources_gpus(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc, _ = _convert(
        tmp_path, "version: v1\nresources:\n  gpus: [{pattern: '*4090*', name: gpu}]\n", capsys
    )
    assert doc["resources"] == [{"name": "nvidia.com/gpu", "gpus": ["*4090*"]}]

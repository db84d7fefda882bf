"""Plugin settings: flag > CDIGEN_* environment > config file > default, schema-checked."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdigen.errors import InputError, SchemaError
from cdigen.plugin.agent.xid import DEFAULT_IGNORED_XIDS
from cdigen.plugin.deviceplugin.config import ResourceConfig, load_config


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "plugin.yaml"
    path.write_text(text)
    return path


def test_defaults() -> None:
    config = load_config(env={})
    assert config.node == "nvml"
    assert config.plugin_dir == Path("/var/lib/kubelet/device-plugins")
    assert config.device_list_strategy == "cdi-cri"
    assert config.cdi_kind == "nvidia.com/gpu"
    assert config.resources == (ResourceConfig("nvidia.com/gpu", None),)
    assert config.health.ignored_xids == DEFAULT_IGNORED_XIDS
    assert (config.log_level, config.log_format) == ("info", "text")


def test_file_then_env_then_flag(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
apiVersion: cdigen/v1alpha1
kind: PluginConfig
node: builtin:dgx-a100
pluginDir: /file/plugins
specDir: [/file/cdi, /file/run-cdi]
deviceListStrategy: envvar
health: {ignoredXids: [13, 43], pollIntervalSeconds: 2}
log: {level: debug, format: json}
resources:
  - {name: example.com/gpu, policy: single-numa}
""",
    )
    from_file = load_config(path, env={})
    assert from_file.node == "builtin:dgx-a100"
    assert from_file.spec_dirs == (Path("/file/cdi"), Path("/file/run-cdi"))
    assert from_file.device_list_strategy == "envvar"
    assert from_file.health.ignored_xids == (13, 43)
    assert from_file.health.poll_interval_s == 2
    assert from_file.resources == (ResourceConfig("example.com/gpu", "single-numa"),)
    assert from_file.log_format == "json"

    env = {
        "CDIGEN_PLUGIN_DIR": "/env/plugins",
        "CDIGEN_DEVICE_LIST_STRATEGY": "native",
        "CDIGEN_IGNORED_XIDS": "13,31",
    }
    from_env = load_config(path, env=env)
    assert from_env.plugin_dir == Path("/env/plugins")
    assert from_env.device_list_strategy == "native"
    assert from_env.health.ignored_xids == (13, 31)
    assert from_env.node == "builtin:dgx-a100"  # not overridden: the file's value stays

    flags = {"plugin_dir": "/flag/plugins", "spec_dirs": ["/flag/cdi"], "node": None}
    from_flags = load_config(path, env=env, flags=flags)
    assert from_flags.plugin_dir == Path("/flag/plugins")
    assert from_flags.spec_dirs == (Path("/flag/cdi"),)
    assert from_flags.device_list_strategy == "native"  # env still beats the file
    assert from_flags.node == "builtin:dgx-a100"  # an unset flag overrides nothing


def test_resource_flag_keeps_the_file_policy(tmp_path: Path) -> None:
    path = write(tmp_path, "resources: [{name: example.com/gpu, policy: pack}]\n")
    config = load_config(path, env={}, flags={"resource": "example.com/accel"})
    assert config.resources == (ResourceConfig("example.com/accel", "pack"),)


def test_unknown_key_is_a_one_line_schema_error(tmp_path: Path) -> None:
    path = write(tmp_path, "pluginDri: /x\n")
    with pytest.raises(SchemaError) as info:
        load_config(path, env={})
    message = str(info.value)
    assert str(path) in message and "pluginDri" in message and "\n" not in message


def test_bad_strategy_in_file_names_the_field(tmp_path: Path) -> None:
    path = write(tmp_path, "deviceListStrategy: magic\n")
    with pytest.raises(SchemaError, match="deviceListStrategy"):
        load_config(path, env={})


def test_bad_env_values_are_input_errors() -> None:
    with pytest.raises(InputError, match="CDIGEN_IGNORED_XIDS"):
        load_config(env={"CDIGEN_IGNORED_XIDS": "13,abc"})
    with pytest.raises(InputError, match="device list strategy"):
        load_config(env={"CDIGEN_DEVICE_LIST_STRATEGY": "magic"})
    with pytest.raises(InputError, match="CDIGEN_HEALTH_POLL_INTERVAL"):
        load_config(env={"CDIGEN_HEALTH_POLL_INTERVAL": "0"})


@pytest.mark.parametrize(
    "name", ["gpu", "kubernetes.io/gpu", "example.com/", "Example.com/gpu", "example.com/-gpu"]
)
def test_resource_names_the_kubelet_would_refuse(name: str) -> None:
    with pytest.raises(InputError, match="resource name"):
        load_config(env={}, flags={"resource": name})


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not found"):
        load_config(tmp_path / "nope.yaml", env={})


def test_two_resources_would_double_book_the_gpus(tmp_path: Path) -> None:
    path = write(tmp_path, "resources: [{name: example.com/gpu}, {name: example.com/gpu2}]\n")
    with pytest.raises(InputError, match="would both advertise every GPU"):
        load_config(path, env={})


def test_capabilities_of_the_generated_spec_from_file_and_env(tmp_path: Path) -> None:
    head = "apiVersion: cdigen/v1alpha1\nkind: PluginConfig\n"
    path = write(tmp_path, head + "capabilities: [compute, utility, video]\n")
    assert load_config(str(path), env={}).capabilities == ("compute", "utility", "video")
    from_env = load_config(str(path), env={"CDIGEN_CAPABILITIES": "all"})
    assert from_env.capabilities == ("compute", "utility", "video", "graphics", "display")
    assert load_config(env={}).capabilities == ("compute", "utility")
    with pytest.raises(InputError, match="unknown driver capability 'vulkan'"):
        load_config(env={"CDIGEN_CAPABILITIES": "compute,vulkan"})
    with pytest.raises(SchemaError):
        load_config(str(write(tmp_path, head + "capabilities: [vulkan]\n")), env={})


def test_generated_spec_follows_the_capabilities(tmp_path: Path) -> None:
    from dataclasses import replace

    from cdigen.plugin.deviceplugin.generate_specs import write_specs
    from tests.cdihost import build_host, make_node

    host = build_host(tmp_path / "host", make_node(1), merged=True, graphics=True)
    base = replace(load_config(env={}), spec_dirs=(tmp_path / "cdi",), host_root=str(host.base))
    default = write_specs(host.node, base).read_text()
    graphics = write_specs(
        host.node, replace(base, capabilities=("compute", "utility", "graphics"))
    )
    assert "vulkan" not in default.lower()
    assert "vulkan" in graphics.read_text().lower()


def test_a_sharing_mistake_names_the_file_and_the_field(tmp_path: Path) -> None:
    # docs/plugin.md: "any mistake is one line naming the file and field"
    path = write(tmp_path, "resources:\n  - name: example.com/gpu.shared\n    sharing: {}\n")
    with pytest.raises(InputError) as info:
        load_config(path, env={})
    message = str(info.value)
    assert message.startswith(f"{path}: resources[0].sharing: sharing needs exactly one of")
    assert "\n" not in message


def test_a_bad_value_names_the_variable_or_flag_it_came_from() -> None:
    with pytest.raises(InputError) as info:
        load_config(env={"CDIGEN_CAPABILITIES": "compute,vulkan"})
    assert str(info.value).startswith("CDIGEN_CAPABILITIES: unknown driver capability 'vulkan'")
    with pytest.raises(InputError) as info:
        load_config(env={}, flags={"health_poll_interval": 0.0})
    assert str(info.value).startswith("--health-poll-interval: expected seconds in (0, 3600]")


def test_resource_flag_renames_the_whole_gpu_resource_and_keeps_the_others(
    tmp_path: Path,
) -> None:
    # docs/plugin.md: `- name: nvidia.com/gpu  # CDIGEN_RESOURCE, --resource` beside a sharing one
    path = write(
        tmp_path,
        "resources:\n"
        "  - {name: example.com/gpu.shared, gpus: [1], sharing: {replicas: 4}}\n"
        "  - {name: example.com/gpu, gpus: [0], policy: single-numa}\n",
    )
    config = load_config(path, env={}, flags={"resource": "example.com/accel"})
    assert [(r.name, r.policy) for r in config.resources] == [
        ("example.com/gpu.shared", None),
        ("example.com/accel", "single-numa"),
    ]
    assert config.resources[0].sharing is not None
    from_env = load_config(path, env={"CDIGEN_RESOURCE": "example.com/accel"})
    assert from_env.resources == config.resources


def test_resource_flag_with_only_sharing_resources_is_an_error(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "resources:\n"
        "  - {name: example.com/gpu.shared, sharing: {replicas: 4}}\n"
        "  - {name: example.com/gpu-memory, sharing: {memorySliceMiB: 1024}}\n",
    )
    with pytest.raises(InputError, match="no whole-GPU resource to rename") as info:
        load_config(path, env={}, flags={"resource": "example.com/accel"})
    assert "\n" not in str(info.value)


def test_resource_flag_beside_mig_policy_entries_names_the_whole_gpus(tmp_path: Path) -> None:
    path = write(tmp_path, "migStrategy: mixed\nresources: [{name: nvidia.com/mig-1g.10gb}]\n")
    config = load_config(path, env={}, flags={"resource": "example.com/accel"})
    assert [r.name for r in config.resources] == ["example.com/accel", "nvidia.com/mig-1g.10gb"]
    assert config.gpu_resource == "example.com/accel"

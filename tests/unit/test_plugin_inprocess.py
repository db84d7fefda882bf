"""The whole plugin in-process (NVML Xid events from a double), seen through the simulator."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdigen.discover import load_node
from cdigen.plugin.deviceplugin.config import HealthConfig, PluginConfig
from cdigen.plugin.deviceplugin.runner import Plugin
from tests.fakes.event_nvml import EventNvml
from tests.helpers.specs import write_spec
from tests.kubelet_sim import KubeletSimulator

RESOURCE = "nvidia.com/gpu"


def nvml_plugin(
    tmp_path: Path, *, recover_after_s: float
) -> tuple[list[str], EventNvml, PluginConfig, Plugin]:
    """A dgx-a100 plugin whose health comes from an NVML event double, with a spec for it."""
    node = load_node("builtin:dgx-a100")
    uuids = [g.uuid for g in node.gpus]
    write_spec(tmp_path / "cdi", uuids)
    nvml = EventNvml(uuids)
    config = PluginConfig(
        node="nvml",
        plugin_dir=tmp_path / "plugins",
        spec_dirs=(tmp_path / "cdi",),
        health=HealthConfig(poll_interval_s=0.05, recover_after_s=recover_after_s),
    )
    return uuids, nvml, config, Plugin(config, node=node, nvml=nvml)


def test_critical_xid_reaches_list_and_watch_and_recovers(tmp_path: Path) -> None:
    uuids, nvml, config, plugin = nvml_plugin(tmp_path, recover_after_s=0.5)
    with KubeletSimulator(config.plugin_dir) as kubelet:
        plugin.start()
        try:
            kubelet.wait_registered(RESOURCE)
            kubelet.wait_devices(RESOURCE, lambda d: all(x.health == "Healthy" for x in d))
            nvml.xid(uuids[6], 13)  # an application error: ignored (handled first, in order)
            nvml.xid(uuids[5], 79)  # fallen off the bus
            sick = kubelet.wait_devices(RESOURCE, lambda d: d[5].health == "Unhealthy")
            assert [x.ID for x in sick if x.health == "Unhealthy"] == [uuids[5]]
            healed = kubelet.wait_devices(
                RESOURCE, lambda d: all(x.health == "Healthy" for x in d), timeout_s=5
            )
            assert len(healed) == 8
            assert all(lst[6].health == "Healthy" for lst in kubelet.device_lists(RESOURCE))
        finally:
            plugin.stop()
    assert nvml.freed
    assert not (config.plugin_dir / "cdigen-nvidia.com-gpu.sock").exists()


def test_lost_gpu_is_unhealthy_through_the_periodic_probe(tmp_path: Path) -> None:
    uuids, nvml, config, plugin = nvml_plugin(tmp_path, recover_after_s=60)
    with KubeletSimulator(config.plugin_dir) as kubelet:
        plugin.start()
        try:
            kubelet.wait_registered(RESOURCE)
            nvml.lost.add(uuids[0])
            kubelet.wait_devices(RESOURCE, lambda d: d[0].health == "Unhealthy")
            nvml.lost.clear()
            kubelet.wait_devices(RESOURCE, lambda d: d[0].health == "Healthy")
        finally:
            plugin.stop()


def test_spec_check_follows_the_strategy(tmp_path: Path) -> None:
    """cdi-cri needs the names in the spec; envvar hands out none, so an empty spec dir is fine."""
    node = load_node("builtin:rtx4090")
    (tmp_path / "cdi").mkdir()
    health: dict[str, list[str]] = {}
    for strategy in ("cdi-cri", "envvar"):
        config = PluginConfig(
            plugin_dir=tmp_path / strategy,
            spec_dirs=(tmp_path / "cdi",),
            device_list_strategy=strategy,
        )
        plugin = Plugin(config, node=node)
        with KubeletSimulator(config.plugin_dir) as kubelet:
            plugin.start()
            try:
                kubelet.wait_registered(RESOURCE)
                health[strategy] = [d.health for d in kubelet.wait_devices(RESOURCE)]
            finally:
                plugin.stop()
    assert health == {"cdi-cri": ["Unhealthy"], "envvar": ["Healthy"]}


def test_unknown_policy_name_is_a_clear_input_error(tmp_path: Path) -> None:
    from cdigen.errors import InputError
    from cdigen.plugin.deviceplugin.config import ResourceConfig

    config = PluginConfig(
        plugin_dir=tmp_path / "plugins",
        spec_dirs=(tmp_path,),
        resources=(ResourceConfig("nvidia.com/gpu", "no-such-policy"),),
    )
    plugin = Plugin(config, node=load_node("builtin:rtx4090"))
    with pytest.raises(InputError, match="no policy named 'no-such-policy'"):
        plugin.start()
    plugin.stop()
    assert not list((tmp_path / "plugins").glob("*.sock"))  # nothing left serving

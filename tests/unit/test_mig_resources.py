"""MIG in the plugin: resources per strategy, health through the parent GPU, configuration."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from cdigen.cli import main
from cdigen.discover import load_node
from cdigen.errors import InputError
from cdigen.plugin.agent.health import SOURCE_NODE, SOURCE_XID, HealthBoard
from cdigen.plugin.agent.health_watchers import NodeWatcher
from cdigen.plugin.agent.xid import xid_reason
from cdigen.plugin.deviceplugin.config import PluginConfig, ResourceConfig, load_config
from cdigen.plugin.deviceplugin.resources import (
    cdi_names,
    device_parents,
    mig_resource_name,
    plan_resources,
)
from cdigen.plugin.deviceplugin.runner import Plugin
from tests.helpers.clock import FakeClock

GPU = "nvidia.com/gpu"
MIXED = load_node("builtin:dgx-a100-mig-mixed")
SINGLE = load_node("builtin:h100-mig-single")


def plan(node: object, strategy: str) -> dict[str, list[str]]:
    """Resource name -> device IDs."""
    resources = plan_resources(node, strategy, gpu_resource=GPU, cdi_kind=GPU)  # type: ignore[arg-type]
    return {r.name: [d.id for d in r.devices] for r in resources}


def test_none_advertises_only_gpus_without_mig() -> None:
    assert plan(MIXED, "none") == {GPU: [g.uuid for g in MIXED.gpus if not g.mig_enabled]}
    assert plan(SINGLE, "none") == {GPU: []}  # every GPU is MIG-enabled: nothing whole


def test_mixed_has_one_resource_per_profile_plus_the_plain_gpus() -> None:
    resources = plan(MIXED, "mixed")
    expected: dict[str, set[str]] = {}
    for gpu in MIXED.gpus:
        for mig in gpu.mig_devices:
            expected.setdefault(f"nvidia.com/mig-{mig.profile}", set()).add(mig.uuid)
    assert set(resources) == {GPU} | set(expected)
    for name, ids in expected.items():
        assert sorted(resources[name]) == sorted(ids)
    assert len(resources[GPU]) == 4
    assert list(resources) == sorted(resources)  # a stable order: gpu, then profiles sorted


def test_mixed_devices_carry_parent_numa_and_mig_cdi_names() -> None:
    resources = plan_resources(MIXED, "mixed", gpu_resource=GPU, cdi_kind="example.com/gpu")
    parents = device_parents(resources)
    names = cdi_names(resources)
    for gpu in MIXED.gpus:
        for mig in gpu.mig_devices:
            assert parents[mig.uuid] == (gpu.uuid,)
            assert names[mig.uuid] == [f"example.com/gpu={mig.uuid}"]
    device = next(
        d for r in resources for d in r.devices if d.id == MIXED.gpus[3].mig_devices[0].uuid
    )
    assert device.numa_node == MIXED.gpus[3].numa_node


def test_single_advertises_all_mig_devices_under_the_gpu_resource() -> None:
    resources = plan(SINGLE, "single")
    assert list(resources) == [GPU]
    assert sorted(resources[GPU]) == sorted(m.uuid for g in SINGLE.gpus for m in g.mig_devices)


def test_single_refuses_mixed_profiles_and_gpus_without_mig() -> None:
    with pytest.raises(InputError, match=r"needs every GPU MIG-enabled.*GPU 4") as exc:
        plan(MIXED, "single")
    assert "mixed" in str(exc.value)
    all_mig = dataclasses.replace(MIXED, gpus=tuple(g for g in MIXED.gpus if g.mig_enabled))
    with pytest.raises(InputError, match=r"one MIG profile, but the node has 1g\.10gb, 2g\.20gb"):
        plan(all_mig, "single")


def test_single_without_any_mig_gpu_advertises_whole_gpus() -> None:
    node = load_node("builtin:dgx-a100")
    assert plan(node, "single") == {GPU: [g.uuid for g in node.gpus]}


def test_mig_resource_names_follow_the_gpu_resource_domain() -> None:
    assert mig_resource_name("nvidia.com/gpu", "1g.10gb") == "nvidia.com/mig-1g.10gb"
    assert mig_resource_name("example.com/accel", "3g.40gb") == "example.com/mig-3g.40gb"


def test_a_parent_gpu_reason_marks_every_mig_device_on_it() -> None:
    resources = plan_resources(MIXED, "mixed", gpu_resource=GPU, cdi_kind=GPU)
    board = HealthBoard([d.id for r in resources for d in r.devices], device_parents(resources))
    gpu0, gpu4 = MIXED.gpus[0], MIXED.gpus[4]
    assert board.set_reasons(SOURCE_XID, {gpu0.uuid: xid_reason(79), gpu4.uuid: None})
    _, reasons = board.snapshot()
    assert {d for d, r in reasons.items() if r} == {m.uuid for m in gpu0.mig_devices}
    assert not board.healthy(gpu0.mig_devices[2].uuid)
    board.set_reasons(SOURCE_XID, {gpu0.uuid: None})
    assert all(board.healthy(m.uuid) for m in gpu0.mig_devices)


def test_a_new_layout_keeps_reasons_and_passes_gpu_reasons_to_new_mig_devices() -> None:
    old = plan_resources(MIXED, "mixed", gpu_resource=GPU, cdi_kind=GPU)
    board = HealthBoard([d.id for r in old for d in r.devices], device_parents(old))
    gpu0 = MIXED.gpus[0]
    board.set_reasons(SOURCE_XID, {gpu0.uuid: xid_reason(48)})
    kept = MIXED.gpus[1].mig_devices[0].uuid
    board.set_reasons(SOURCE_NODE, {kept: "marked unhealthy"})
    version = board.version
    new_mig = dataclasses.replace(gpu0.mig_devices[0], uuid="MIG-new")
    new_node = dataclasses.replace(
        MIXED, gpus=(dataclasses.replace(gpu0, mig_devices=(new_mig,)), *MIXED.gpus[1:])
    )
    new = plan_resources(new_node, "mixed", gpu_resource=GPU, cdi_kind=GPU)
    board.reset_devices([d.id for r in new for d in r.devices], device_parents(new))
    assert board.version > version
    _, reasons = board.snapshot()
    assert reasons["MIG-new"] == ("critical Xid 48",)  # GPU 0 is still sick
    assert reasons[kept] == ("marked unhealthy",)
    assert gpu0.mig_devices[1].uuid not in reasons  # gone from the layout


def test_mig_strategy_from_file_env_and_flag(tmp_path: Path) -> None:
    path = tmp_path / "plugin.yaml"
    path.write_text(
        "migStrategy: mixed\ngenerateSpecs: true\ndriverRoot: /host\ndevRoot: /host\n"
        "rescanIntervalSeconds: 5\nsysfsRoot: /host/sys\nprocRoot: /host/proc\n"
        "resources:\n- name: nvidia.com/gpu\n"
        "- {name: nvidia.com/mig-1g.10gb, policy: spread}\n"
    )
    config = load_config(path, env={})
    assert config.mig_strategy == "mixed" and config.generate_specs
    assert (config.driver_root, config.dev_root, config.rescan_interval_s) == ("/host", "/host", 5)
    assert config.gpu_resource == GPU
    assert (config.sysfs_root, config.proc_root) == ("/host/sys", "/host/proc")
    assert not load_config(path, env={"CDIGEN_GENERATE_SPECS": "no"}).generate_specs
    assert load_config(None, env={"CDIGEN_MIG_STRATEGY": "single"}).mig_strategy == "single"
    assert load_config(None, env={}, flags={"mig_strategy": "mixed"}).mig_strategy == "mixed"
    assert load_config(None, env={}).mig_strategy == "none"


def test_bad_mig_settings_are_one_line_input_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"unknown MIG strategy .half.*none, single, mixed"):
        load_config(None, env={"CDIGEN_MIG_STRATEGY": "half"})
    with pytest.raises(InputError, match="expected true or false"):
        load_config(None, env={"CDIGEN_GENERATE_SPECS": "maybe"})
    path = tmp_path / "plugin.yaml"
    path.write_text("migStrategy: half\n")
    with pytest.raises(InputError, match="migStrategy"):
        load_config(path, env={})
    path.write_text("resources:\n- name: nvidia.com/mig-1g.10gb\n")
    with pytest.raises(InputError, match="migStrategy is 'none'") as exc:
        load_config(path, env={})
    assert "\n" not in str(exc.value)


def test_serve_with_single_on_a_mixed_node_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "plugin",
            "serve",
            "--node",
            "builtin:dgx-a100-mig-mixed",
            "--mig-strategy",
            "single",
            "--plugin-dir",
            str(tmp_path / "plugins"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "migStrategy 'single' needs every GPU MIG-enabled" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "plugins").exists() or not list((tmp_path / "plugins").iterdir())


def test_mig_resources_default_to_the_pack_policy_unless_configured(tmp_path: Path) -> None:
    config = PluginConfig(
        node="builtin:dgx-a100-mig-mixed",
        plugin_dir=tmp_path,
        mig_strategy="mixed",
        resources=(ResourceConfig(GPU), ResourceConfig("nvidia.com/mig-1g.10gb", "spread")),
    )
    plugin = Plugin(config)
    assert plugin.reload_policies()
    policies = {r.name: plugin.policy_for(r.name) for r in plugin.resources}
    assert policies[GPU] == "default"
    assert policies["nvidia.com/mig-1g.10gb"] == "spread"
    assert policies["nvidia.com/mig-3g.40gb"] == "pack"


def test_node_watcher_applies_a_changed_file_and_keeps_the_layout_on_a_bad_one(
    tmp_path: Path,
) -> None:
    path = tmp_path / "node.yaml"
    path.write_text("one")
    seen: list[str] = []
    results = iter(["A", RuntimeError("half-written file"), "B"])

    def load() -> str:
        result = next(results)
        if isinstance(result, Exception):
            raise result
        return result

    watcher = NodeWatcher(load, seen.append, path=path)  # type: ignore[arg-type]
    watcher.poll()
    assert seen == []  # unchanged since the start
    path.write_text("two")
    watcher.poll()
    path.write_text("three!")
    watcher.poll()  # fails: nothing applied
    path.write_text("four!!!")
    watcher.poll()
    assert seen == ["A", "B"]


def test_node_watcher_rescans_on_its_interval() -> None:
    clock = FakeClock(100.0)
    calls: list[str] = []
    watcher = NodeWatcher(
        lambda: "node",  # type: ignore[arg-type,return-value]
        calls.append,
        interval_s=10,
        clock=clock,
    )
    watcher.poll()
    assert calls == []
    clock.now = 110.0
    watcher.poll()
    watcher.poll()
    assert calls == ["node"]


def test_a_retired_mig_resource_no_longer_holds_readiness_down() -> None:
    from cdigen.plugin.deviceplugin.metrics import PluginMetrics

    metrics = PluginMetrics()
    for name in (GPU, "nvidia.com/mig-7g.80gb", "nvidia.com/mig-4g.40gb"):
        metrics.declare_resource(name)
    metrics.mark_registered(GPU)
    metrics.mark_registered("nvidia.com/mig-7g.80gb")
    metrics.set_devices("nvidia.com/mig-7g.80gb", healthy=1, unhealthy=0)
    metrics.retire_resource("nvidia.com/mig-7g.80gb")
    assert metrics.unregistered_resources() == ["nvidia.com/mig-4g.40gb"]
    metrics.mark_registered("nvidia.com/mig-4g.40gb")
    assert metrics.ready()
    text = metrics.exposition().decode()
    gone = [
        line
        for line in text.splitlines()
        if 'resource="nvidia.com/mig-7g.80gb"' in line and line.startswith("cdigen_plugin_devices")
    ]
    assert gone and all(line.endswith(" 0.0") for line in gone)


def test_allocate_returns_each_devices_own_cdi_name_once() -> None:
    import threading

    from cdigen.plugin.deviceplugin.servicer import DevicePluginService
    from tests.helpers.devices import mig as mig_device
    from tests.helpers.devices import replica
    from tests.helpers.servicer import first

    shares = [replica("GPU-a", k) for k in range(2)]
    mig = mig_device("MIG-x", parent="GPU-b", index=1)
    service = DevicePluginService(
        resource=GPU,
        devices=[*shares, mig],
        board=HealthBoard([d.id for d in (*shares, mig)]),
        cdi_kind=GPU,
        strategy="cdi-cri",
        prefer=lambda: first,
        stop=threading.Event(),
    )
    response = service.container_response([*shares, mig])
    assert [d.name for d in response.cdi_devices] == [
        "nvidia.com/gpu=GPU-a",
        "nvidia.com/gpu=MIG-x",
    ]

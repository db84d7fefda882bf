"""Registration with the kubelet (as the simulator checks it) and watching the plugin directory."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from plugin.health import HealthBoard
from plugin.kubelet import (
    Backoff,
    PluginDirWatcher,
    Registrar,
    RegistrationError,
    register,
    resource_name_problem,
)
from plugin.serve import ResourceServer
from plugin.service import AdvertisedDevice, DevicePluginService, Preference
from tests.kubelet_sim import KubeletSimulator, extended_resource_problem

RESOURCE = "example.com/gpu"


def serve(plugin_dir: Path, resource: str = RESOURCE) -> ResourceServer:
    board = HealthBoard(["GPU-x"])

    def make(stop: threading.Event) -> DevicePluginService:
        return DevicePluginService(
            resource=resource,
            devices=[AdvertisedDevice("GPU-x", 0)],
            board=board,
            cdi_kind="nvidia.com/gpu",
            strategy="cdi-cri",
            prefer=lambda: lambda a, m, s: Preference(a[:s]),
            stop=stop,
        )

    server = ResourceServer(plugin_dir, make)
    server.start()
    return server


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[KubeletSimulator]:
    with KubeletSimulator(tmp_path) as sim:
        yield sim


@pytest.mark.parametrize(
    "name",
    ["nvidia.com/gpu", "example.com/a.b_c-d", "x/" + "a" * 63],
)
def test_names_both_sides_accept(name: str) -> None:
    assert resource_name_problem(name) is None
    assert extended_resource_problem(name) is None


@pytest.mark.parametrize(
    "name",
    ["gpu", "kubernetes.io/gpu", "example.com/", "example.com/-gpu", "x/" + "a" * 64, "Ex.com/gpu"],
)
def test_names_both_sides_refuse(name: str) -> None:
    assert resource_name_problem(name) is not None
    assert extended_resource_problem(name) is not None


def test_register_dials_back_before_answering(kubelet: KubeletSimulator, tmp_path: Path) -> None:
    server = serve(tmp_path)
    try:
        register(tmp_path, endpoint=server.socket_path.name, resource_name=RESOURCE)
        reg = kubelet.registrations[0]  # recorded before Register returned
        assert reg.options.get_preferred_allocation_available
        assert [d.ID for d in kubelet.wait_devices(RESOURCE)] == ["GPU-x"]
    finally:
        server.stop()


def test_register_without_a_listening_plugin_is_refused(
    kubelet: KubeletSimulator, tmp_path: Path
) -> None:
    kubelet.dial_timeout_s = 0.3
    with pytest.raises(RegistrationError, match="failed to dial"):
        register(tmp_path, endpoint="nobody.sock", resource_name=RESOURCE)
    assert not kubelet.registrations


def test_bad_resource_name_is_refused_by_the_kubelet(
    kubelet: KubeletSimulator, tmp_path: Path
) -> None:
    server = serve(tmp_path, resource="gpu")
    try:
        with pytest.raises(RegistrationError, match="extended resource"):
            register(tmp_path, endpoint=server.socket_path.name, resource_name="gpu")
    finally:
        server.stop()


def test_no_kubelet_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(RegistrationError, match="kubelet not reachable"):
        register(tmp_path, endpoint="x.sock", resource_name=RESOURCE, timeout_s=0.2)


def registrar_for(server: ResourceServer, restarts: list[int]) -> Registrar:
    def restart() -> None:
        restarts.append(1)
        server.stop()
        server.start()

    return Registrar(
        server.plugin_dir,
        lambda: [(server.resource, server.socket_path)],
        restart,
        interval_s=0.02,
        backoff=Backoff(0.02, 0.1),
    )


def test_registration_retries_until_the_kubelet_comes_up(tmp_path: Path) -> None:
    server = serve(tmp_path)
    restarts: list[int] = []
    registrar = registrar_for(server, restarts)
    registrar.start()
    try:
        time.sleep(0.3)
        assert not registrar.registered.is_set()  # no kubelet yet: still waiting
        with KubeletSimulator(tmp_path) as sim:
            sim.wait_registered(RESOURCE, timeout_s=3)
            assert registrar.registered.wait(3)
        assert restarts == []  # the first kubelet needs no restart of ours
    finally:
        registrar.stop()
        server.stop()


def test_refused_registration_backs_off_and_retries(tmp_path: Path) -> None:
    server = serve(tmp_path)
    restarts: list[int] = []
    registrar = registrar_for(server, restarts)
    with KubeletSimulator(tmp_path) as sim:
        sim.dial_timeout_s = 0.2
        server.stop()  # the kubelet cannot dial back: registration is refused
        (tmp_path / server.socket_path.name).touch()  # a dead socket file stays in place
        registrar.step()
        assert not registrar.registered.is_set() and sim.rejections
        server.start()
        deadline = time.monotonic() + 3
        while not registrar.registered.is_set() and time.monotonic() < deadline:
            registrar.step()
            time.sleep(0.02)
        assert registrar.registered.is_set()
        assert len(sim.registrations) == 1
    server.stop()


def test_kubelet_restart_restarts_the_server_and_registers_again(tmp_path: Path) -> None:
    server = serve(tmp_path)
    restarts: list[int] = []
    registrar = registrar_for(server, restarts)
    with KubeletSimulator(tmp_path) as first:
        registrar.start()
        first.wait_registered(RESOURCE)
    try:
        with KubeletSimulator(tmp_path) as second:
            started = time.monotonic()
            reg = second.wait_registered(RESOURCE, timeout_s=3)
            assert reg.at - started < 1.0
            assert restarts == [1]
            assert [d.ID for d in second.wait_devices(RESOURCE)] == ["GPU-x"]
    finally:
        registrar.stop()
        server.stop()


def test_watcher_sees_recreated_kubelet_socket_and_removed_own_socket(tmp_path: Path) -> None:
    ours = tmp_path / "cdigen-example.com-gpu.sock"
    ours.touch()
    kubelet_sock = tmp_path / "kubelet.sock"
    kubelet_sock.touch()
    watcher = PluginDirWatcher(tmp_path, lambda: [ours])
    assert watcher.check() is None
    kubelet_sock.unlink()
    assert watcher.check() is None  # gone is not yet a restart
    kubelet_sock.touch()
    assert watcher.check() == "kubelet.sock was re-created"
    assert watcher.check() is None
    ours.unlink()
    assert "removed" in (watcher.check() or "")

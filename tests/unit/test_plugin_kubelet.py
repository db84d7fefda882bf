"""Registration with the kubelet (as the simulator checks it), either boot order, socket modes."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from cdigen.errors import CdigenError, InputError
from cdigen.plugin.agent.health import HealthBoard
from cdigen.plugin.agent.sockets import make_plugin_dir, socket_in_use
from cdigen.plugin.deviceplugin.kubelet import Backoff, Registrar
from cdigen.plugin.deviceplugin.registration import (
    KubeletRefused,
    KubeletUnreachable,
    RegistrationCancelled,
    RegistrationTimeout,
    register,
    resource_name_problem,
)
from cdigen.plugin.deviceplugin.runner import ResourceServer
from cdigen.plugin.deviceplugin.servicer import DevicePluginService
from tests.helpers.clock import FakeClock
from tests.helpers.devices import whole
from tests.helpers.servicer import first
from tests.kubelet_sim import KubeletSimulator, extended_resource_problem

RESOURCE = "example.com/gpu"


def serve(plugin_dir: Path, resource: str = RESOURCE) -> ResourceServer:
    board = HealthBoard(["GPU-x"])

    def make(stop: threading.Event) -> DevicePluginService:
        return DevicePluginService(
            resource=resource,
            devices=[whole("GPU-x")],
            board=board,
            cdi_kind="nvidia.com/gpu",
            strategy="cdi-cri",
            prefer=lambda: first,
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
    with pytest.raises(KubeletRefused, match="failed to dial"):
        register(tmp_path, endpoint="nobody.sock", resource_name=RESOURCE)
    assert not kubelet.registrations


def test_bad_resource_name_is_refused_by_the_kubelet(
    kubelet: KubeletSimulator, tmp_path: Path
) -> None:
    server = serve(tmp_path, resource="gpu")
    try:
        with pytest.raises(KubeletRefused, match="extended resource"):
            register(tmp_path, endpoint=server.socket_path.name, resource_name="gpu")
    finally:
        server.stop()


def test_no_kubelet_is_unreachable_not_refused(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(KubeletUnreachable, match="kubelet not reachable") as info:
        register(tmp_path, endpoint="x.sock", resource_name=RESOURCE, timeout_s=5)
    assert time.monotonic() - started < 2  # fails at once, it does not wait out the deadline
    assert "refused registration" not in str(info.value)


def _silent_socket(path: Path) -> socket.socket:
    """A unix socket that accepts connections and never speaks gRPC (a hung plugin)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen(8)
    return sock


def test_our_deadline_is_a_timeout_not_a_refusal(kubelet: KubeletSimulator, tmp_path: Path) -> None:
    kubelet.dial_timeout_s = 2.0  # the kubelet keeps dialing back longer than we wait
    hung = _silent_socket(tmp_path / "hung.sock")
    try:
        with pytest.raises(RegistrationTimeout, match="no answer to Register") as info:
            register(tmp_path, endpoint="hung.sock", resource_name=RESOURCE, timeout_s=0.3)
        assert "refused" not in str(info.value)
    finally:
        hung.close()


def test_a_registration_in_flight_is_cancelled_by_stop(
    kubelet: KubeletSimulator, tmp_path: Path
) -> None:
    kubelet.dial_timeout_s = 3.0
    hung = _silent_socket(tmp_path / "hung.sock")
    cancel = threading.Event()
    threading.Timer(0.2, cancel.set).start()
    started = time.monotonic()
    try:
        with pytest.raises(RegistrationCancelled):
            register(tmp_path, endpoint="hung.sock", resource_name=RESOURCE, cancel=cancel)
        assert time.monotonic() - started < 1.0
    finally:
        hung.close()


class Recorder:
    """The registrar's observer, recording what it was told."""

    def __init__(self) -> None:
        self.waiting: list[str | None] = []
        self.registered: list[str] = []

    def observe_registration(self, resource: str, *, ok: bool) -> None:
        if ok:
            self.registered.append(resource)

    def mark_registered(self, resource: str | None = None) -> None:
        pass

    def mark_unregistered(self, resource: str | None = None) -> None:
        pass

    def set_waiting(self, kubelet_socket: str | None) -> None:
        self.waiting.append(kubelet_socket)


def registrar_for(
    servers: Sequence[ResourceServer],
    restarts: list[list[str]],
    *,
    clock: object = time.monotonic,
    observer: Recorder | None = None,
) -> Registrar:
    def restart(resources: Sequence[str]) -> None:
        restarts.append(list(resources))
        for server in servers:
            if server.resource in resources:
                server.stop()
                server.start()

    return Registrar(
        servers[0].plugin_dir,
        lambda: list(servers),
        restart,
        interval_s=0.02,
        backoff=Backoff(0.02, 0.1),
        clock=clock,  # type: ignore[arg-type]
        observer=observer,
    )


def start_kubelet_like_the_kubelet(plugin_dir: Path) -> KubeletSimulator:
    """What a starting kubelet does: delete every socket in the plugin dir, then listen on
    kubelet.sock (the kubelet's device manager does the same; so does
    ``KubeletSimulator(clean_start=True)``)."""
    for entry in plugin_dir.iterdir():
        if not entry.is_dir():
            entry.unlink()
    return KubeletSimulator(plugin_dir).start()


def test_plugin_first_registers_once_after_the_kubelet_deleted_its_socket(tmp_path: Path) -> None:
    server = serve(tmp_path)
    restarts: list[list[str]] = []
    observer = Recorder()
    clock = FakeClock()
    registrar = registrar_for([server], restarts, clock=clock, observer=observer)
    try:
        for _ in range(3):
            registrar.step()
            clock.advance(0.1)
        assert registrar.waiting and not registrar.registered.is_set()
        assert observer.waiting == [str(tmp_path / "kubelet.sock")]
        sim = start_kubelet_like_the_kubelet(tmp_path)
        try:
            registrar.step()  # the first round that sees kubelet.sock registers, no back-off
            assert len(sim.registrations) == 1
            sim.wait_registered(RESOURCE, timeout_s=3)
            assert [d.ID for d in sim.wait_devices(RESOURCE)] == ["GPU-x"]
            for _ in range(5):  # no second registration follows
                clock.advance(1.0)
                registrar.step()
            assert len(sim.registrations) == 1 and not sim.rejections
            assert restarts == [[RESOURCE]]  # the deleted socket was re-created before Register
            assert observer.waiting[-1] is None and not registrar.waiting
        finally:
            sim.stop()
    finally:
        server.stop()


def test_kubelet_first_registers_once_without_a_restart(kubelet: KubeletSimulator) -> None:
    server = serve(kubelet.plugin_dir)
    restarts: list[list[str]] = []
    registrar = registrar_for([server], restarts)
    registrar.start()
    try:
        kubelet.wait_registered(RESOURCE, timeout_s=3)
        time.sleep(0.3)
        assert len(kubelet.registrations) == 1 and restarts == []
    finally:
        registrar.stop()
        server.stop()


def test_kubelet_restart_registers_every_resource_once_again(tmp_path: Path) -> None:
    servers = [serve(tmp_path, r) for r in (RESOURCE, "example.com/mig-1g.10gb")]
    restarts: list[list[str]] = []
    clock = FakeClock()
    registrar = registrar_for(servers, restarts, clock=clock)
    first = start_kubelet_like_the_kubelet(tmp_path)
    try:
        registrar.step()
        for server in servers:
            first.wait_registered(server.resource, timeout_s=3)
        first.stop()
        clock.advance(0.2)
        registrar.step()
        second = start_kubelet_like_the_kubelet(tmp_path)
        try:
            registrar.step()  # the first round that sees the new kubelet registers everything
            assert len(second.registrations) == len(servers)
            for server in servers:
                second.wait_registered(server.resource, timeout_s=3)
            for _ in range(5):
                clock.advance(1.0)
                registrar.step()
            assert sorted(r.resource for r in second.registrations) == sorted(
                s.resource for s in servers
            )
            assert not second.rejections
        finally:
            second.stop()
    finally:
        for server in servers:
            server.stop()


def test_nothing_is_registered_or_restarted_while_the_kubelet_is_absent(tmp_path: Path) -> None:
    server = serve(tmp_path)
    restarts: list[list[str]] = []
    registrar = registrar_for([server], restarts)
    try:
        server.socket_path.unlink()  # deleted while no kubelet is there: not our business yet
        for _ in range(5):
            registrar.step()
        assert restarts == [] and registrar.waiting
    finally:
        server.stop()


def test_waiting_is_said_once_then_every_30_s(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = serve(tmp_path)
    clock = FakeClock(100.0)
    observer = Recorder()
    registrar = registrar_for([server], [], clock=clock, observer=observer)
    caplog.set_level(logging.INFO, logger="cdigen.plugin")
    try:
        for _ in range(3):
            registrar.step()
            clock.advance(10.0)  # 100, 110, 120: one line
        lines = [m for m in caplog.messages if m.startswith(("waiting", "still waiting"))]
        assert lines == [
            f"waiting for the kubelet at {tmp_path / 'kubelet.sock'} (it does not exist yet)"
        ]
        registrar.step()  # 130 s: 30 s since the first line
        lines = [m for m in caplog.messages if m.startswith(("waiting", "still waiting"))]
        assert len(lines) == 2 and lines[1].startswith("still waiting for the kubelet at")
        assert "(it does not exist yet, 30 s)" in lines[1]
        assert observer.waiting == [str(tmp_path / "kubelet.sock")]  # said once to /healthz
    finally:
        server.stop()


def test_stale_kubelet_socket_is_waited_for_then_a_new_kubelet_gets_one_registration(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = serve(tmp_path)
    stale = _silent_socket(tmp_path / "kubelet.sock")
    stale.close()  # a kubelet.sock left by a kubelet that died (node reboot): refuses connections
    restarts: list[list[str]] = []
    registrar = registrar_for([server], restarts)
    caplog.set_level(logging.INFO, logger="cdigen.plugin")
    registrar.start()
    try:
        time.sleep(0.3)
        assert registrar.waiting and not registrar.registered.is_set()
        sim = start_kubelet_like_the_kubelet(tmp_path)
        try:
            sim.wait_registered(RESOURCE, timeout_s=3)
            time.sleep(0.3)
            assert len(sim.registrations) == 1
        finally:
            sim.stop()
    finally:
        registrar.stop()
        server.stop()
    messages = [r.getMessage() for r in caplog.records]
    assert not [m for m in messages if "refused registration" in m]
    assert [m for m in messages if "refuses connections" in m]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_refused_registration_backs_off_and_retries(tmp_path: Path) -> None:
    server = serve(tmp_path)
    restarts: list[list[str]] = []
    registrar = registrar_for([server], restarts)
    with KubeletSimulator(tmp_path) as sim:
        sim.dial_timeout_s = 0.2
        hung = _silent_socket(tmp_path / "elsewhere.sock")
        try:
            # the kubelet dials back to a socket that does not answer gRPC: it refuses
            server.socket_path.unlink()
            os.symlink(tmp_path / "elsewhere.sock", server.socket_path)
            original = server.socket_intact
            server.socket_intact = lambda: True  # type: ignore[method-assign]
            registrar.step()
            assert not registrar.registered.is_set() and sim.rejections
            server.socket_intact = original  # type: ignore[method-assign]
            deadline = time.monotonic() + 3
            while not registrar.registered.is_set() and time.monotonic() < deadline:
                registrar.step()
                time.sleep(0.02)
            assert registrar.registered.is_set()
            assert len(sim.registrations) == 1
        finally:
            hung.close()
    server.stop()


def test_replaced_socket_is_restarted_and_registered_again(kubelet: KubeletSimulator) -> None:
    server = serve(kubelet.plugin_dir)
    restarts: list[list[str]] = []
    registrar = registrar_for([server], restarts)
    registrar.start()
    try:
        kubelet.wait_registered(RESOURCE, timeout_s=3)
        server.socket_path.unlink()
        server.socket_path.touch()  # someone put another file at our path
        started = time.monotonic()
        reg = kubelet.wait_registered(RESOURCE, timeout_s=3, count=2)
        assert reg.at - started < 1.0 and restarts == [[RESOURCE]]
        assert stat.S_ISSOCK(os.stat(server.socket_path).st_mode)
    finally:
        registrar.stop()
        server.stop()


def test_registrar_stop_is_bounded_while_a_registration_hangs(
    kubelet: KubeletSimulator, tmp_path: Path
) -> None:
    kubelet.dial_timeout_s = 5.0
    server = serve(tmp_path)
    hung = _silent_socket(tmp_path / "hung.sock")
    server.socket_path.unlink()
    os.symlink(tmp_path / "hung.sock", server.socket_path)
    server.socket_intact = lambda: True  # type: ignore[method-assign]
    registrar = registrar_for([server], [])
    registrar.start()
    try:
        time.sleep(0.3)  # Register is in flight, the kubelet dials a socket that never answers
        started = time.monotonic()
        registrar.stop()
        assert time.monotonic() - started < 1.0
    finally:
        hung.close()
        with contextlib.suppress(FileNotFoundError):
            server.socket_path.unlink()
        server.stop()


# --- modes and paths (issue 13) -----------------------------------------------------------------


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def test_plugin_dir_and_socket_modes_do_not_depend_on_the_umask(tmp_path: Path) -> None:
    plugin_dir = tmp_path / "a" / "b" / "dp"
    with umask(0o000):
        make_plugin_dir(plugin_dir)
        server = serve(plugin_dir)
    try:
        for path in (plugin_dir, plugin_dir.parent, plugin_dir.parent.parent):
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o755, path
        st = os.stat(server.socket_path)
        assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
        assert sorted(p.name for p in plugin_dir.iterdir()) == [server.socket_path.name]
    finally:
        server.stop()


def test_existing_plugin_dir_keeps_its_mode(tmp_path: Path) -> None:
    plugin_dir = tmp_path / "plugins"
    plugin_dir.mkdir()
    os.chmod(plugin_dir, 0o750)
    make_plugin_dir(plugin_dir)
    assert stat.S_IMODE(os.stat(plugin_dir).st_mode) == 0o750


def test_socket_path_that_is_a_directory_is_a_one_line_error(tmp_path: Path) -> None:
    (tmp_path / "cdigen-example.com-gpu.sock").mkdir()
    with pytest.raises(InputError, match="socket path is a directory") as info:
        serve(tmp_path)
    assert "\n" not in str(info.value) and str(tmp_path) in str(info.value)


def test_serve_with_a_directory_at_the_socket_path_exits_2_with_one_line(tmp_path: Path) -> None:
    plugin_dir = tmp_path / "plugins"
    (plugin_dir / "cdigen-nvidia.com-gpu.sock").mkdir(parents=True)
    serve_args = ["plugin", "serve", "--node", "builtin:rtx4090", "--plugin-dir", str(plugin_dir)]
    result = subprocess.run(
        [sys.executable, "-m", "cdigen.cli", *serve_args, "--spec-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    said = [line for line in result.stderr.splitlines() if "socket path is a directory" in line]
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "IsADirectoryError" not in result.stderr
    assert len(said) == 1 and "remove that directory" in said[0]
    assert result.stderr.strip().splitlines()[-1] == said[0]


def test_a_socket_another_process_serves_on_is_not_taken_over(tmp_path: Path) -> None:
    """Two plugins for one resource on a node (the DaemonSet beside a systemd unit): each took
    the socket path from the other and re-registered, several times a second, for ever."""
    first = serve(tmp_path)
    try:
        with pytest.raises(CdigenError, match="another process serves on that socket") as info:
            serve(tmp_path)
        assert "\n" not in str(info.value) and "stop the other plugin" in str(info.value)
        assert first.socket_intact()  # still the first one's, and it still answers
        assert socket_in_use(first.socket_path)
    finally:
        first.stop()
    stale = tmp_path / "cdigen-example.com-gpu.sock"
    with contextlib.closing(socket.socket(socket.AF_UNIX)) as dead:
        dead.bind(str(stale))  # a plugin killed with SIGKILL: nothing listens any more
    again = serve(tmp_path)
    try:
        assert again.socket_intact()  # a stale socket is replaced
    finally:
        again.stop()


def test_a_foreign_plugins_socket_is_left_alone(tmp_path: Path) -> None:
    with contextlib.closing(socket.socket(socket.AF_UNIX)) as other:
        other.bind(str(tmp_path / "nvidia-gpu.sock"))  # NVIDIA's device plugin, say
        other.listen()
        make_plugin_dir(tmp_path)
        server = serve(tmp_path)
        server.stop()
        assert [p.name for p in tmp_path.iterdir()] == ["nvidia-gpu.sock"]
        assert socket_in_use(tmp_path / "nvidia-gpu.sock")


def test_healthz_says_it_waits_for_the_kubelet() -> None:
    from cdigen.plugin.deviceplugin.metrics import PluginMetrics

    metrics = PluginMetrics()
    metrics.declare_resource(RESOURCE)
    metrics.set_waiting("/var/lib/kubelet/device-plugins/kubelet.sock")
    assert metrics.health_problem() == (
        "waiting for kubelet at /var/lib/kubelet/device-plugins/kubelet.sock"
    )
    metrics.set_waiting(None)
    assert metrics.health_problem() == f"not registered with the kubelet: {RESOURCE}"
    metrics.mark_registered(RESOURCE)
    assert metrics.health_problem() is None


# A plugin whose shutdown hangs (as a gRPC worker stuck in a call would make it hang).
HANGING_STOP = """
import sys, time
import cdigen.plugin.deviceplugin.runner
real_stop = cdigen.plugin.deviceplugin.runner.Plugin.stop
def stop(self):
    real_stop(self)
    if HANG:
        time.sleep(30)
cdigen.plugin.deviceplugin.runner.Plugin.stop = stop
from cdigen.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("hang", [False, True])
def test_sigterm_ends_the_plugin_within_2_s(tmp_path: Path, hang: bool) -> None:
    log = tmp_path / "plugin.log"
    args = ["plugin", "serve", "--node", "builtin:rtx4090", "--plugin-dir", str(tmp_path / "dp")]
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", f"HANG = {hang}\n" + HANGING_STOP, *args, "--spec-dir", "/"],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 60
            while "waiting for the kubelet" not in log.read_text():
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
            started = time.monotonic()
            proc.terminate()
            assert proc.wait(timeout=10) == 0
            assert time.monotonic() - started < 2.0
        finally:
            if proc.poll() is None:
                proc.kill()
    said = log.read_text()
    assert "Traceback" not in said
    assert ("exiting without waiting further" in said) == hang
    assert not (tmp_path / "dp" / "cdigen-nvidia.com-gpu.sock").exists()

"""The DRA plugin as a process of its own, for the crash tests (tests/e2e/test_dra_crash.py):
``python -m tests.helpers.dra_child CONFIG`` serves one node with ``--mig-strategy dynamic``
through the MIG double, whose state lives in a file as the driver's survives the plugin.

Test-only crash points: with ``kill_after`` N in the config, the process SIGKILLs itself right
after the Nth side effect made while serving (a MIG create or destroy in the double, a
checkpoint write, a claim spec written or removed), so that a test stops it deterministically
at every step; none of this is in the plugin's own code. The config (JSON): ``node`` (a pickle
of the Node), ``host`` (driver_root, dev_root, sysfs_root), ``kubelet_dir``, ``cdi_dir``,
``kubeconfig``, ``proc_root``, ``mig_state``, ``kill_after`` (null: never), ``fail`` (NVML
failures, as MigNvml takes them), ``steps`` (a file each side effect's name is appended to).
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import sys
import threading
from pathlib import Path
from typing import Any


def main(config_path: str) -> None:
    config = json.loads(Path(config_path).read_text())
    from cdigen.plugin.agent.kubeapi import api_client
    from cdigen.plugin.dra import prepare
    from cdigen.plugin.dra.dynamic_mig import MigMaker
    from cdigen.plugin.dra.kube import KubeApi
    from cdigen.plugin.dra.kubelet_plugin import DraPlugin
    from cdigen.plugin.dra.options import DraOptions
    from tests.fakes.fake_mig import MigNvml

    armed = threading.Event()
    count = [0]
    steps = Path(config["steps"])

    def step(name: str) -> None:
        if not armed.is_set():
            return
        count[0] += 1
        with steps.open("a") as f:
            f.write(f"{count[0]} {name}\n")
        if count[0] == config["kill_after"]:
            os.kill(os.getpid(), signal.SIGKILL)

    def after(name: str, call: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            out = call(*args, **kwargs)
            step(name)
            return out

        return wrapped

    # the preparer's file side effects, seen where it calls them
    prepare.atomic_write = after("checkpoint", prepare.atomic_write)  # type: ignore[assignment]
    prepare.write_claim_spec = after("spec written", prepare.write_claim_spec)  # type: ignore[assignment]
    prepare.remove_spec = after("spec removed", prepare.remove_spec)  # type: ignore[assignment]

    node = pickle.loads(Path(config["node"]).read_bytes())
    fail = {name: {int(k): v for k, v in by.items()} for name, by in config["fail"].items()}
    nvml = MigNvml(node, state=Path(config["mig_state"]), on_change=step, fail=fail)
    nvml.nvmlInit()
    host = config["host"]
    options = DraOptions(
        node_name="node-a",
        driver="gpu.cdigen.dev",
        kubelet_dir=Path(config["kubelet_dir"]),
        cdi_dir=Path(config["cdi_dir"]),
        driver_root=host["driver_root"],
        dev_root=host["dev_root"],
        sysfs_root=host["sysfs_root"],
        mig_strategy="dynamic",
        proc_root=config["proc_root"],
    )
    kube = KubeApi(api_client(config["kubeconfig"]), timeout_s=5.0)
    # the node as discovery finds it now: with the MIG devices that survived the last process
    plugin = DraPlugin(
        options,
        nvml.node,
        slices=kube,
        claims=kube,
        node_owner=kube.node_owner,
        mig=MigMaker(nvml, config["proc_root"]),
    )
    plugin.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    armed.set()
    Path(config["ready"]).write_text("ready\n")
    stop.wait()
    plugin.stop()


def zygote() -> None:
    """``python -m tests.helpers.dra_child --zygote``: import once, then fork a plugin process
    per config path read on stdin (its pid answered on stdout, its exit status written to
    ``<config>.exit`` when it ends): a start in a few milliseconds instead of seconds of
    imports, each plugin still a process of its own that SIGKILL stops."""
    # what a start imports, imported once
    import kubernetes.client  # noqa: F401

    import cdigen.plugin.agent.kubeapi
    import cdigen.plugin.dra.kube
    import cdigen.plugin.dra.kubelet_plugin  # noqa: F401
    import tests.fakes.fake_mig  # noqa: F401

    for line in sys.stdin:
        config = line.strip()
        if not config:
            continue
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                main(config)
            except BaseException:
                import traceback

                traceback.print_exc()
                code = 1
            os._exit(code)
        print(pid, flush=True)
        threading.Thread(target=_reap, args=(pid, config), daemon=True).start()


def _reap(pid: int, config: str) -> None:
    _, status = os.waitpid(pid, 0)
    code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    temp = Path(config + ".exit.tmp")
    temp.write_text(f"{code}\n")
    temp.rename(config + ".exit")  # whole, or not there


if __name__ == "__main__":
    if sys.argv[1] == "--zygote":
        zygote()
    else:
        main(sys.argv[1])

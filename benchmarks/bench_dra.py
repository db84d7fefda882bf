"""The DRA plugin's two performance goals, each against a baseline measured in the same run.

    python benchmarks/bench_dra.py [--calls N] [--part prepare|claim|slices]

prepare: NodePrepareResources for one claim with one GPU over the real unix socket (goal: p99
    <= 5 ms). ``cdigen dra serve`` in-process on a fake host (8 GPUs, a driver with ~60
    libraries), registered by the kubelet simulator; specs go to a tmpfs (as /var/run/cdi on a
    node), the checkpoint (fsynced) to disk, then, in a second run, to the tmpfs too (what is
    left without the disk flushes); the claim is read from an in-process dict,
    so the API server is not in the figure. Each call prepares a fresh claim (a new UID: a spec
    written, the checkpoint saved); unprepare follows, measured too. Baseline: a do-nothing
    DRAPlugin servicer on a socket of the same kind, same messages (gRPC and Python alone).
claim: the claim read that prepare does first, through the official kubernetes client against
    the fake API server on loopback. Baseline: the same GET with http.client.
slices: building (device view, engine order, slice dicts) and publishing (list, then replace)
    one node's ResourceSlices through the kubernetes client to the fake API server, for 16 GPUs
    (builtin:dgx2-v100) and MIG nodes (builtin:h100-mig-single, builtin:dgx-a100-mig-mixed)
    (goal: <= 100 ms). Baseline: publishing an empty pool (the same requests, no devices).
    A second line per node publishes through the client's generated methods instead (each body
    validated against its models first), which KubeApi skips: the before/after of that change.

Prints p50 and p99 in milliseconds and the ratio to the baseline at each.
"""

from __future__ import annotations

import argparse
import http.client
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from concurrent import futures
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import grpc  # noqa: E402

from benchmarks.common import percentile  # noqa: E402
from cdigen.plugin.dra.api import dra_v1_pb2 as pb  # noqa: E402
from cdigen.plugin.dra.api import dra_v1_pb2_grpc as pb_grpc  # noqa: E402

DRIVER = "gpu.cdigen.dev"
NODE_NAME = "bench-node"
PREPARE_GOAL_MS = 5.0
SLICES_GOAL_MS = 100.0


def timed(call: Callable[[int], Any], count: int, warm: int = 20) -> list[float]:
    """Milliseconds per call of ``call(i)``, after ``warm`` unmeasured calls."""
    for i in range(warm):
        call(-1 - i)
    out = []
    for i in range(count):
        t0 = time.perf_counter()
        call(i)
        out.append((time.perf_counter() - t0) * 1000)
    return out


def report(label: str, ours: list[float], base: list[float], goal_ms: float | None) -> bool:
    """One line: p50/p99 of ours and of the baseline, the ratios, and the goal verdict."""
    p50, p99 = percentile(ours, 0.5), percentile(ours, 0.99)
    b50, b99 = percentile(base, 0.5), percentile(base, 0.99)
    met = goal_ms is None or p99 <= goal_ms
    goal = "" if goal_ms is None else f"  goal p99 <= {goal_ms:g} ms: {'met' if met else 'MISSED'}"
    print(
        f"{label:<44}{p50:>9.3f}{p99:>9.3f}   baseline {b50:>8.3f}{b99:>9.3f}"
        f"   ratio {p50 / b50:>5.2f}x /{p99 / b99:>5.2f}x  mean {statistics.fmean(ours):.3f}{goal}"
    )
    return met


def header() -> None:
    print(f"{'':<44}{'p50 ms':>9}{'p99 ms':>9}   {'':<9}{'p50':>8}{'p99':>9}")


# --------------------------------------------------------------------------- prepare


class DictClaims:
    """ClaimReader over an in-process dict: the claim read costs nothing here."""

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}

    def read_claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        return self.claims[(namespace, name)]


class MemorySlices:
    """SliceApi in memory (prepare does not touch slices; the plugin publishes once at start)."""

    def __init__(self) -> None:
        self.slices: dict[str, dict[str, Any]] = {}

    def list_slices(self, driver: str, node_name: str) -> list[dict[str, Any]]:
        return list(self.slices.values())

    def create_slice(self, body: Mapping[str, Any]) -> None:
        self.slices[body["metadata"]["name"]] = dict(body)

    def replace_slice(self, name: str, body: Mapping[str, Any]) -> None:
        self.slices[name] = dict(body)

    def delete_slice(self, name: str) -> None:
        self.slices.pop(name, None)


class Floor(pb_grpc.DRAPluginServicer):  # type: ignore[misc]
    """Answers every call with a one-claim, one-device answer built from the request alone."""

    def NodePrepareResources(self, request: Any, context: Any) -> Any:
        response = pb.NodePrepareResourcesResponse()
        for claim in request.claims:
            response.claims[claim.uid].devices.add(
                request_names=["gpu"],
                pool_name=NODE_NAME,
                device_name="gpu-0",
                cdi_device_ids=[f"k8s.{DRIVER}/claim={claim.uid}-gpu-0"],
            )
        return response

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        response = pb.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            response.claims[claim.uid].error = ""
        return response


def bench_prepare(calls: int, *, checkpoint_on_disk: bool = True) -> bool:
    from cdigen.plugin.dra.kubelet_plugin import DraPlugin
    from cdigen.plugin.dra.options import DraOptions
    from tests.cdihost import build_host, make_node
    from tests.dra_kubelet_sim import DraKubeletSim
    from tests.fake_apiserver import allocated_claim

    work = Path(tempfile.mkdtemp(prefix="bdra-", dir="/tmp"))  # short: socket paths
    # /var/run/cdi is a tmpfs on a node (/run), the checkpoint is on disk (/var/lib/kubelet): the
    # same here, where /dev/shm exists
    shm = Path("/dev/shm")
    run = Path(tempfile.mkdtemp(prefix="bdra-", dir=shm)) if shm.is_dir() else work / "run"
    claims = DictClaims()
    host = build_host(work / "host", make_node(8), extra_libraries=45)
    options = DraOptions(
        node_name=NODE_NAME,
        driver=DRIVER,
        kubelet_dir=work / "kl",
        cdi_dir=run / "cdi",
        driver_root=str(host.driver_root),
        dev_root=str(host.dev_root),
        sysfs_root=str(host.sysfs_root),
        state_dir=None if checkpoint_on_disk else run / "state",
    )
    plugin = DraPlugin(options, host.node, slices=MemorySlices(), claims=claims)
    floor = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_DRAPluginServicer_to_server(Floor(), floor)
    floor.add_insecure_port(f"unix:{work}/floor.sock")
    try:
        plugin.start()
        floor.start()
        registered = DraKubeletSim(options.kubelet_dir).register()
        assert registered.service == "v1.DRAPlugin"
        libraries = len(host.libraries)
        print(
            f"prepare: {len(host.node.gpus)} GPUs, {libraries} driver libraries, {calls} calls "
            f"each, one connection per target (as the kubelet keeps); specs in {run}, "
            f"checkpoint in {options.checkpoint.parent}"
        )
        ours = grpc.insecure_channel(f"unix:{registered.endpoint}")
        base = grpc.insecure_channel(f"unix:{work}/floor.sock")
        stubs = {"ours": pb_grpc.DRAPluginStub(ours), "floor": pb_grpc.DRAPluginStub(base)}

        def request(i: int) -> Any:
            claim = pb.Claim(namespace="default", uid=f"uid-prepare-{i}", name=f"c-prepare-{i}")
            return pb.NodePrepareResourcesRequest(claims=[claim])

        def add_claim(i: int) -> None:
            uid, name = f"uid-prepare-{i}", f"c-prepare-{i}"
            device = f"gpu-{i % 8}"
            result = {"request": "gpu", "driver": DRIVER, "pool": NODE_NAME, "device": device}
            claims.claims[("default", name)] = allocated_claim(name, uid, [result])

        def prepare(stub: Any, check: bool) -> Callable[[int], Any]:
            def call(i: int) -> Any:
                answer = stub.NodePrepareResources(request(i), timeout=10)
                if check:
                    got = answer.claims[f"uid-prepare-{i}"]
                    assert not got.error, got.error
                return answer

            return call

        def unprepare(stub: Any) -> Callable[[int], Any]:
            def call(i: int) -> Any:
                return stub.NodeUnprepareResources(
                    pb.NodeUnprepareResourcesRequest(
                        claims=[pb.Claim(namespace="default", uid=f"uid-prepare-{i}", name="x")]
                    ),
                    timeout=10,
                )

            return call

        samples: dict[str, list[float]] = {k: [] for k in ("p", "u", "fp", "fu")}
        batch = 20  # alternate small batches: both targets see the same machine noise
        for i in range(-40, calls + 40):  # claims for the warm-up (negative) and the runs
            add_claim(i)
        ours_prepare, ours_unprepare = prepare(stubs["ours"], True), unprepare(stubs["ours"])
        floor_prepare, floor_unprepare = prepare(stubs["floor"], False), unprepare(stubs["floor"])
        for start in range(-40, calls, batch):
            ids = range(start, min(start + batch, calls))
            keep = start >= 0
            for i in ids:
                t0 = time.perf_counter()
                ours_prepare(i)
                t1 = time.perf_counter()
                ours_unprepare(i)
                t2 = time.perf_counter()
                if keep:
                    samples["p"].append((t1 - t0) * 1000)
                    samples["u"].append((t2 - t1) * 1000)
            for i in ids:
                t0 = time.perf_counter()
                floor_prepare(i)
                t1 = time.perf_counter()
                floor_unprepare(i)
                t2 = time.perf_counter()
                if keep:
                    samples["fp"].append((t1 - t0) * 1000)
                    samples["fu"].append((t2 - t1) * 1000)
        assert plugin.preparer.prepared() == {}
        assert not list(options.cdi_dir.glob("*.yaml")), "unprepare removes every spec"
        header()
        where = "" if checkpoint_on_disk else " (tmpfs)"
        met = report(
            f"NodePrepareResources, 1 claim, 1 GPU{where}",
            samples["p"],
            samples["fp"],
            PREPARE_GOAL_MS,
        )
        report(f"NodeUnprepareResources, 1 claim{where}", samples["u"], samples["fu"], None)
        ours.close()
        base.close()
        return met
    finally:
        plugin.stop()
        floor.stop(0)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(run, ignore_errors=True)


# --------------------------------------------------------------------------- claim read


def bench_claim(calls: int) -> None:
    from cdigen.plugin.agent.kubeapi import api_client
    from cdigen.plugin.dra.kube import KubeApi
    from tests.fake_apiserver import FakeApiServer, allocated_claim

    work = Path(tempfile.mkdtemp(prefix="bdra-"))
    server = FakeApiServer().start()
    try:
        result = {"request": "gpu", "driver": DRIVER, "pool": NODE_NAME, "device": "gpu-0"}
        server.add_claim(allocated_claim("train", "uid-1", [result]))
        api = KubeApi(api_client(str(server.kubeconfig(work / "kubeconfig"))))
        host, port = server.url.removeprefix("http://").split(":")
        raw = http.client.HTTPConnection(host, int(port))
        path = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/train"

        def ours(i: int) -> None:
            assert api.read_claim("default", "train")["metadata"]["uid"] == "uid-1"

        def floor(i: int) -> None:
            raw.request("GET", path, headers={"Authorization": "Bearer fake"})
            response = raw.getresponse()
            assert response.status == 200
            response.read()

        print(f"\nclaim read (excluded from prepare): fake API server on loopback, {calls} calls")
        header()
        report(
            "read ResourceClaim (kubernetes client)", timed(ours, calls), timed(floor, calls), None
        )
        raw.close()
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


# --------------------------------------------------------------------------- slices


def model_checked_api(api_client: Any) -> Any:
    """KubeApi publishing through the client's generated methods (the body validated against
    the client's models, then projected back): what KubeApi did before it sent dicts as built."""
    from cdigen.plugin.dra.kube import KubeApi

    class ModelChecked(KubeApi):
        def create_slice(self, body: Mapping[str, Any]) -> None:
            self._resource.create_resource_slice(body=dict(body), _preload_content=False)

        def replace_slice(self, name: str, body: Mapping[str, Any]) -> None:
            self._resource.replace_resource_slice(name, body=dict(body), _preload_content=False)

    return ModelChecked(api_client)


def bench_slices(calls: int) -> bool:
    from cdigen.discover import load_node
    from cdigen.plugin.agent.kubeapi import api_client
    from cdigen.plugin.dra.kube import KubeApi
    from cdigen.plugin.dra.slice_publisher import SlicePublisher
    from cdigen.policies.device_view import device_views
    from cdigen.policies.dra.order import ordered_views
    from tests.fake_apiserver import FakeApiServer

    work = Path(tempfile.mkdtemp(prefix="bdra-"))
    server = FakeApiServer().start()
    met = True
    try:
        client = api_client(str(server.kubeconfig(work / "kubeconfig")))
        api = KubeApi(client)
        checked = model_checked_api(client)
        print(f"\nslices: build + publish to the fake API server on loopback, {calls} rounds")
        header()
        for sample in ("dgx2-v100", "h100-mig-single", "dgx-a100-mig-mixed"):
            node = load_node(f"builtin:{sample}")
            publisher = SlicePublisher(api, driver=DRIVER, node_name=sample)
            slow = SlicePublisher(checked, driver=DRIVER, node_name=f"{sample}-checked")
            empty = SlicePublisher(api, driver=DRIVER, node_name=f"{sample}-empty")

            def build(i: int, node: Any = node) -> Any:
                return ordered_views(device_views(node, mig_strategy="mixed"), node)

            def both(i: int, node: Any = node, publisher: Any = publisher) -> None:
                publisher.publish(build(i, node))

            def floor(i: int, empty: Any = empty) -> None:
                empty.publish([])

            def before(i: int, node: Any = node, slow: Any = slow) -> None:
                slow.publish(build(i, node))

            views = build(0)
            gpus = len(node.gpus)
            label = f"{sample}: {gpus} GPUs, {len(views)} devices"
            build_ms = timed(build, calls)
            total = timed(both, calls)
            base = timed(floor, calls)
            met &= report(label, total, base, SLICES_GOAL_MS)
            report("  the same through the client's models", timed(before, calls), base, None)
            print(
                f"  of which building (views + engine order): p50 {percentile(build_ms, 0.5):.3f}"
                f" ms, p99 {percentile(build_ms, 0.99):.3f} ms"
            )
            (body,) = [s for s in server.slices.values() if s["spec"]["nodeName"] == sample]
            assert len(body["spec"]["devices"]) == len(views)
            assert body["spec"]["pool"]["generation"] == calls + 20
        return met
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--part", choices=("prepare", "claim", "slices"), action="append")
    args = parser.parse_args(argv)
    parts = args.part or ["prepare", "claim", "slices"]
    met = True
    if "prepare" in parts:
        met &= bench_prepare(args.calls)
        # the same with the checkpoint on a tmpfs too: what is left without the disk flushes
        bench_prepare(args.calls, checkpoint_on_disk=False)
    if "claim" in parts:
        bench_claim(args.calls)
    if "slices" in parts:
        met &= bench_slices(max(20, args.calls // 5))
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())

"""`cdigen dra why POD` against the fake API server: a Pending pod, a Running pod, a missing one."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cdigen.cli import main
from cdigen.discover import load_node
from cdigen.memory_shares import MemoryShares
from cdigen.plugin.agent.kubeapi import api_client
from cdigen.plugin.dra.kube import KubeApi
from cdigen.plugin.dra.slice_publisher import SlicePublisher
from cdigen.policies.device_view import device_views
from cdigen.policies.dra.order import ordered_views
from tests.fake_apiserver import FakeApiServer
from tests.helpers.why_docs import shipped_classes

ROOT = Path(__file__).resolve().parents[2]
DRIVER = "gpu.cdigen.dev"


def _publish(kubeconfig: Path, source: str, node: str, step: int | None = None) -> None:
    """The slices `dra serve --node SOURCE [--memory-step]` publishes for ``node``, through the
    plugin's own publisher."""
    found = load_node(source)
    views = ordered_views(device_views(found), found)
    kube = KubeApi(api_client(str(kubeconfig)))
    publisher = SlicePublisher(kube, driver=DRIVER, node_name=node)
    publisher.publish(views, shares=MemoryShares(step) if step else None)


def _claim(name: str, uid: str, memory: str, device: str | None = None) -> dict[str, Any]:
    """A ResourceClaim made from a template asking ``memory`` of one GPU; allocated to
    ``device`` on node-a when given, as the scheduler writes it."""
    claim: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default", "uid": uid},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "share",
                        "exactly": {
                            "deviceClassName": "gpu.cdigen.dev",
                            "allocationMode": "ExactCount",
                            "count": 1,
                            "capacity": {"requests": {"memory": memory}},
                        },
                    }
                ]
            }
        },
    }
    if device:
        claim["status"] = {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "share",
                            "driver": DRIVER,
                            "pool": "node-a",
                            "device": device,
                            "shareID": uid,
                            "consumedCapacity": {"memory": memory},
                        }
                    ]
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": ["node-a"]}
                            ]
                        }
                    ]
                },
            }
        }
    return claim


def _pod(name: str, template: str, claim: str, node: str | None) -> dict[str, Any]:
    status: dict[str, Any] = {
        "phase": "Running" if node else "Pending",
        "resourceClaimStatuses": [{"name": "gpu-memory", "resourceClaimName": claim}],
    }
    if not node:
        status["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/2 nodes are available: 2 cannot allocate all claims. "
                "preemption: 0/2 nodes are available: 2 Preemption is not helpful.",
            }
        ]
    spec: dict[str, Any] = {
        "resourceClaims": [{"name": "gpu-memory", "resourceClaimTemplateName": template}],
        "containers": [{"name": "main", "image": "cuda"}],
    }
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "namespace": "default"}, "spec": spec, "status": status}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[FakeApiServer, Path]]:
    """The 4090 story live: node-a a 24 GB card shared in 1 MiB steps, node-b a DGX-1 of whole
    V100s; two pods hold 3 GiB each of gpu-0 on node-a, a third asks 18 GiB."""
    api = FakeApiServer().start()
    kubeconfig = api.kubeconfig(tmp_path / "kubeconfig")
    try:
        _publish(kubeconfig, "builtin:rtx4090", "node-a", step=1 << 20)
        _publish(kubeconfig, "builtin:dgx1-v100", "node-b")
        for doc in shipped_classes():
            api.add_class(doc)
        for pod, uid in (("memory-3gi-a", "7c1e"), ("memory-3gi-b", "9d2f")):
            claim = f"{pod}-gpu-memory-x1"
            api.add_claim(_claim(claim, f"{uid}0000-0000-4000-8000-000000000000", "3Gi", "gpu-0"))
            api.add_pod(_pod(pod, "memory-3gi", claim, "node-a"))
        api.add_claim(_claim("memory-18gi-gpu-memory-x2", "0e5b0000-0000-4000-8000-0000", "18Gi"))
        api.add_pod(_pod("memory-18gi", "memory-18gi", "memory-18gi-gpu-memory-x2", None))
        yield api, kubeconfig
    finally:
        api.stop()


def _why(kubeconfig: Path, *argv: str) -> int:
    return main(["dra", "why", "--kubeconfig", str(kubeconfig), *argv])


def _doc_session(command: str) -> tuple[list[str], str]:
    """The argv (after ``cdigen``) and the output of the docs/dra.md console block that runs
    ``command``."""
    doc = (ROOT / "docs" / "dra.md").read_text()
    for block in re.findall(r"```console\n(.*?)```", doc, re.S):
        line, _, printed = block.partition("\n")
        if line.startswith(f"$ {command}"):
            return line.split()[2:], printed
    raise AssertionError(f"no console block for {command!r} in docs/dra.md")


def _run_doc_session(
    command: str, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str, str]:
    argv, printed = _doc_session(command)
    argv[argv.index("--kubeconfig") + 1] = str(kubeconfig)
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, printed + ("" if err == "" else f"stderr: {err}")


def test_a_pending_pod_says_why_node_by_node_in_one_screen(
    cluster: tuple[FakeApiServer, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    _, kubeconfig = cluster
    code, out, printed = _run_doc_session("cdigen dra why memory-18gi", kubeconfig, capsys)
    assert code == 0
    assert out == printed  # the docs session, as printed
    assert len(out.splitlines()) <= 25
    # the capacity the two running pods' claims leave: 24564Mi less 2 x 3Gi
    assert "    gpu-0: needs memory 18Gi, 18420Mi left\n" in out
    assert "  request share: 8 device(s) match its class and selectors, 0 of them" in out


def test_a_pending_pod_fits_once_a_claim_lets_go(
    cluster: tuple[FakeApiServer, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    api, kubeconfig = cluster
    del api.claims[("default", "memory-3gi-b-gpu-memory-x1")]["status"]
    assert _why(kubeconfig, "memory-18gi") == 0
    out = capsys.readouterr().out
    assert "on node-a (1 device(s), after 1 allocated claim(s) there):\n" in out
    assert "  memory-18gi-gpu-memory-x2: would get gpu-0\n" in out


def test_a_running_pod_shows_its_devices_node_and_cdi_names(
    cluster: tuple[FakeApiServer, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    _, kubeconfig = cluster
    code, out, printed = _run_doc_session("cdigen dra why memory-3gi-a", kubeconfig, capsys)
    assert code == 0
    assert out == printed
    assert "CDI device k8s.gpu.cdigen.dev/claim=7c1e0000-0000-4000-8000-000000000000-gpu-0" in out


def test_a_missing_pod_is_one_line_exit_1(
    cluster: tuple[FakeApiServer, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    _, kubeconfig = cluster
    assert _why(kubeconfig, "nope", "--namespace", "team-a") == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        "cdigen: error: pod team-a/nope: not found (API server answered 404 NotFound: "
        'pods "nope" not found)\n'
    )


def test_a_class_that_does_not_exist_is_the_reason(
    cluster: tuple[FakeApiServer, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    api, kubeconfig = cluster
    api.classes.clear()
    assert _why(kubeconfig, "memory-18gi") == 0
    assert capsys.readouterr().out.endswith(
        "request 'share' names DeviceClass 'gpu.cdigen.dev', which does not exist: the "
        "scheduler cannot allocate it anywhere\n"
    )


def test_the_refused_claim_in_the_docs_is_refused_as_shown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = (ROOT / "docs" / "dra.md").read_text()
    claim = re.search(r"```yaml\n# old-claim.yaml\n(.*?)```", doc, re.S)
    assert claim is not None
    (tmp_path / "old-claim.yaml").write_text(claim.group(1))
    monkeypatch.chdir(tmp_path)
    argv, printed = _doc_session("cdigen dra check old-claim.yaml")
    assert main(argv) == 1
    assert capsys.readouterr() == ("", printed)


def test_a_selector_that_matches_nothing_is_named(
    cluster: tuple[FakeApiServer, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    api, kubeconfig = cluster
    claim = api.claims[("default", "memory-18gi-gpu-memory-x2")]
    exactly = claim["spec"]["devices"]["requests"][0]["exactly"]
    expression = 'device.attributes["gpu.cdigen.dev"].productName.contains("H100")'
    exactly["selectors"] = [{"cel": {"expression": expression}}]
    assert _why(kubeconfig, "memory-18gi") == 0
    out = capsys.readouterr().out
    assert f"    selector 0: {expression}\n" in out
    assert "  request share: 0 device(s) match its class and selectors, 0 of them" in out
    assert "    gpu-0: selector 0 is false\n" in out
    assert "    gpu-2, gpu-3 and 6 more: selector 0 is false\n" in out
    assert len(out.splitlines()) <= 25


def test_nodes_with_the_same_story_are_told_once(
    cluster: tuple[FakeApiServer, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    _, kubeconfig = cluster
    for n in range(40):
        _publish(kubeconfig, "builtin:dgx1-v100", f"node-v{n:02}")
    assert _why(kubeconfig, "memory-18gi") == 0
    out = capsys.readouterr().out
    assert "\non node-b, node-v00 and 39 more (8 device(s) each):\n" in out
    assert len(out.splitlines()) <= 25


def test_a_pod_of_many_claims_still_fits_one_screen() -> None:
    from cdigen.plugin.dra.why import Cluster, explain_pod

    claims = {("default", f"c{n}"): _claim(f"c{n}", f"u{n}", "1Gi") for n in range(20)}
    pod = _pod("many", "t", "c0", None)
    pod["spec"]["resourceClaims"] = [
        {"name": f"c{n}", "resourceClaimName": f"c{n}"} for n in range(20)
    ]
    lines = explain_pod(Cluster(pod, claims, [], []), driver=DRIVER)
    assert len(lines) == 25
    assert lines[-1] == "... 18 more line(s): `cdigen dra explain` shows one node in full"


# --- hostile API objects (issue 36): never a traceback; one line naming the object ----------

PENDING = "memory-18gi"
PENDING_CLAIM = ("default", "memory-18gi-gpu-memory-x2")
OTHER_CLAIM = ("default", "memory-3gi-b-gpu-memory-x1")


def _a_node_a_slice(api: FakeApiServer) -> dict[str, Any]:
    return next(s for s in api.slices.values() if s["spec"].get("nodeName") == "node-a")


def _other_result(api: FakeApiServer) -> dict[str, Any]:
    result: dict[str, Any] = api.claims[OTHER_CLAIM]["status"]["allocation"]["devices"]["results"][
        0
    ]
    return result


@pytest.mark.parametrize(
    ("pod", "break_it", "field"),
    [
        (
            PENDING,
            lambda api: api.pods[("default", PENDING)]["spec"].update(resourceClaims=["x"]),
            "pod default/memory-18gi: spec.resourceClaims[0] is a string, not an object",
        ),
        (
            PENDING,
            lambda api: api.pods[("default", PENDING)]["status"].update(conditions=["x"]),
            "pod default/memory-18gi: status.conditions[0] is a string, not an object",
        ),
        (
            "memory-3gi-a",
            lambda api: api.claims[("default", "memory-3gi-a-gpu-memory-x1")]["status"][
                "allocation"
            ]["nodeSelector"].update(nodeSelectorTerms=["node-a"]),
            "resourceclaim default/memory-3gi-a-gpu-memory-x1: "
            "status.allocation.nodeSelector.nodeSelectorTerms[0] is a string, not an object",
        ),
        (
            "memory-3gi-a",
            lambda api: api.claims[("default", "memory-3gi-a-gpu-memory-x1")]["status"][
                "allocation"
            ]["devices"].update(results=["gpu-0"]),
            "status.allocation.devices.results[0] is a string, not an object",
        ),
    ],
)
def test_a_malformed_object_of_the_pod_is_one_line_exit_1(
    cluster: tuple[FakeApiServer, Path],
    capsys: pytest.CaptureFixture[str],
    pod: str,
    break_it: Any,
    field: str,
) -> None:
    api, kubeconfig = cluster
    break_it(api)
    assert _why(kubeconfig, pod) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err
    assert field in err


@pytest.mark.parametrize(
    ("break_it", "named"),
    [
        (
            lambda api: _a_node_a_slice(api)["spec"]["pool"].update(generation="one"),
            "spec.pool.generation is a string, not an integer",
        ),
        (
            lambda api: _a_node_a_slice(api).update(spec=["x"]),
            "spec is a list, not an object",
        ),
        (
            lambda api: api.claims[OTHER_CLAIM]["status"]["allocation"]["devices"].update(
                results=["gpu-0"]
            ),
            "resourceclaim default/memory-3gi-b-gpu-memory-x1 (status.allocation.devices."
            "results[0] is a string",
        ),
        (
            lambda api: _other_result(api).update(consumedCapacity=["3Gi"]),
            "resourceclaim default/memory-3gi-b-gpu-memory-x1 (status.allocation.devices."
            "results[0].consumedCapacity is a list",
        ),
        (
            lambda api: _other_result(api).update(consumedCapacity={"memory": "lots"}),
            "resourceclaim default/memory-3gi-b-gpu-memory-x1 (status.allocation.devices."
            "results[0].consumedCapacity.memory: 'lots' is not a quantity)",
        ),
        (
            lambda api: api.classes.update(broken={"metadata": {"name": "broken"}, "spec": ["x"]}),
            "deviceclass broken (spec is a list, not an object)",
        ),
    ],
)
def test_a_malformed_object_of_others_is_skipped_and_named(
    cluster: tuple[FakeApiServer, Path],
    capsys: pytest.CaptureFixture[str],
    break_it: Any,
    named: str,
) -> None:
    """One bad unrelated object does not break `dra why` for every pod."""
    api, kubeconfig = cluster
    break_it(api)
    assert _why(kubeconfig, PENDING) == 0
    out, err = capsys.readouterr()
    assert err == ""
    lines = out.splitlines()
    assert lines[-1].startswith("skipped as malformed: ") and named in lines[-1], out
    assert "request share: class gpu.cdigen.dev, 1 device(s), memory 18Gi" in out
    assert len(lines) <= 25


def test_names_from_the_api_are_printed_escaped(
    cluster: tuple[FakeApiServer, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    api, kubeconfig = cluster
    forged = "x\n\x1b[2Jpod default/other: Running"
    pod = api.pods[("default", PENDING)]
    pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"] = forged
    assert _why(kubeconfig, PENDING) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out
    assert "\npod default/other" not in out
    assert "claim x\\n\\x1b[2Jpod default/other: Running (template memory-18gi)" in out

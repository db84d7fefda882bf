"""The scheduler's first fit offline (cdigen.policies.dra.claims), `cdigen dra explain` and
`cdigen dra check` (cdigen.policies.dra.check)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdigen.cli import main
from cdigen.discover import load_node
from cdigen.memory_shares import MemoryShares
from cdigen.plugin.dra.slices import build_slices
from cdigen.policies.device_view import attribute_names, device_views, published_attribute_names
from cdigen.policies.dra.claim_docs import claim_from_doc, load_manifests
from cdigen.policies.dra.claims import FirstFit, NodeState
from cdigen.policies.dra.slice_devices import CapacityPolicy, DeviceKey, slice_devices

EXAMPLES = Path(__file__).resolve().parents[2] / "deploy" / "dra" / "examples"
DRIVER = "gpu.cdigen.dev"
GIB = 1 << 30


def _fit(source: str, shares: MemoryShares | None = None) -> FirstFit:
    node = load_node(source)
    slices = build_slices(
        device_views(node), driver=DRIVER, node_name="n", generation=1, shares=shares
    )
    _, classes = load_manifests([EXAMPLES.parent / "deviceclasses.yaml"])
    return FirstFit(slice_devices(slices), classes)


def _claim(**exactly: Any) -> Any:
    doc = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c"},
        "spec": {
            "devices": {
                "requests": [
                    {"name": "r", "exactly": {"deviceClassName": "gpu.cdigen.dev", **exactly}}
                ],
                "constraints": exactly.pop("_constraints", []),
            }
        },
    }
    return claim_from_doc(doc, "c.yaml")


def test_request_policy_rounds_up_to_steps_and_refuses_above_max() -> None:
    policy = CapacityPolicy(default=GIB, min=GIB, max=23 * GIB, step=GIB)
    assert policy.consumed(None, 24 * GIB) == GIB
    assert policy.consumed(GIB + 1, 24 * GIB) == 2 * GIB
    assert policy.consumed(100, 24 * GIB) == GIB
    assert policy.consumed(24 * GIB, 24 * GIB) is None
    assert CapacityPolicy(values=(GIB, 4 * GIB)).consumed(2 * GIB, 8 * GIB) == 4 * GIB
    assert CapacityPolicy().consumed(None, 8 * GIB) == 8 * GIB  # no policy: all of it


def test_shared_gpu_capacity_is_consumed_claim_by_claim() -> None:
    fit = _fit("builtin:rtx4090", MemoryShares())
    state = NodeState()
    for _ in range(7):
        picks = fit.allocate(_claim(capacity={"requests": {"memory": "3Gi"}}), state).picks
        assert [p.device for p in picks] == ["gpu-0"]
        state.add(picks, fit.by_key)
    assert state.consumed[DeviceKey(DRIVER, "n", "gpu-0")][f"{DRIVER}/memory"] == 21 * GIB
    assert fit.allocate(_claim(capacity={"requests": {"memory": "3Gi"}}), state).error
    # a claim without a memory request takes the default: the whole GPU unless the operator
    # chose a share, so it fits only on a GPU no one else holds
    _, reasons = fit.explain(_claim(), state)
    assert reasons == [("gpu-0", "needs memory 23Gi, 3060Mi left")]
    assert fit.allocate(_claim()).picks[0].consumed == {f"{DRIVER}/memory": 23 * GIB}
    shared = _fit("builtin:rtx4090", MemoryShares(default=GIB))
    assert shared.allocate(_claim(), state).picks[0].consumed == {f"{DRIVER}/memory": GIB}


def test_exclusive_devices_are_not_given_twice_and_selectors_filter() -> None:
    fit = _fit("builtin:ws-4xv100")
    state = NodeState()
    first = fit.allocate(_claim(count=3), state)
    assert len(first.picks) == 3
    state.add(first.picks, fit.by_key)
    assert "1 device(s) match and fit, 2 needed" in fit.allocate(_claim(count=2), state).error
    none = _claim(
        selectors=[{"cel": {"expression": 'device.attributes["gpu.cdigen.dev"].index > 9'}}]
    )
    assert fit.allocate(none).error


def test_first_fit_backtracks_when_a_constraint_fails_later() -> None:
    # devices by index: a takes gpu-2 first, b (index >= 4) then finds no GPU on NUMA node 0,
    # so first fit backtracks: a takes gpu-6, b the first GPU on its NUMA node, gpu-4
    fit = _fit("builtin:dgx1-v100")
    claim = claim_from_doc(
        {
            "kind": "ResourceClaim",
            "metadata": {"name": "bt"},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "a",
                            "exactly": {
                                "deviceClassName": "gpu.cdigen.dev",
                                "selectors": [
                                    {
                                        "cel": {
                                            "expression": 'device.attributes["gpu.cdigen.dev"]'
                                            ".index in [2, 6]"
                                        }
                                    }
                                ],
                            },
                        },
                        {
                            "name": "b",
                            "exactly": {
                                "deviceClassName": "gpu.cdigen.dev",
                                "selectors": [
                                    {
                                        "cel": {
                                            "expression": 'device.attributes["gpu.cdigen.dev"]'
                                            ".index >= 4"
                                        }
                                    }
                                ],
                            },
                        },
                    ],
                    "constraints": [{"matchAttribute": "resource.kubernetes.io/numaNode"}],
                }
            },
        },
        "bt.yaml",
    )
    assert fit.allocate(claim).devices == ("gpu-6", "gpu-4")


def test_explain_prints_the_chosen_devices_and_why_others_lost(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(
        [
            "dra",
            "explain",
            "--node",
            "builtin:dgx1-v100",
            "--claim",
            str(EXAMPLES / "two-gpus-one-nvlink-clique.yaml"),
            "--class",
            str(EXAMPLES.parent / "deviceclasses.yaml"),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "first fit picks gpu-2, gpu-3" in out
    assert "link score of the set: 250" in out
    assert "gpu-6  matchAttribute gpu.cdigen.dev/nvlinkClique: 4 != 0" in out
    assert "gpu-0  first fit had enough devices before it" in out


def test_explain_on_a_claim_that_cannot_fit_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "dra",
            "explain",
            "--node",
            "builtin:dgx-a100",
            "--claim",
            str(EXAMPLES / "four-gpus-one-numa-node.yaml"),
            "--class",
            str(EXAMPLES.parent / "deviceclasses.yaml"),
        ]
    )
    assert code == 1
    assert "not allocatable" in capsys.readouterr().out


def test_explain_without_the_device_class_is_one_line_exit_1(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "cdigen.cli",
            "dra",
            "explain",
            "--node",
            "builtin:rtx4090",
            "--claim",
            str(EXAMPLES / "memory-3gi.yaml"),
            "--class",  # classes given: the shipped ones are not read
            str(EXAMPLES / "graphics-gpu.yaml"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1  # the scheduler, with only the classes given, never would
    assert result.stderr.count("\n") == 1
    assert "DeviceClass 'gpu.cdigen.dev' does not exist" in result.stderr
    assert "(DeviceClasses: graphics-gpu.cdigen.dev; --class adds more)" in result.stderr


def _sized_claim(tmp_path: Path, name: str, *memory: str) -> str:
    """A claim for ``memory`` of one GPU (several: firstAvailable, in that order)."""
    import yaml

    def exact(amount: str) -> dict[str, object]:
        return {"deviceClassName": "gpu.cdigen.dev", "capacity": {"requests": {"memory": amount}}}

    request: dict[str, object] = {"name": "share"}
    if len(memory) == 1:
        request["exactly"] = exact(memory[0])
    else:
        request["firstAvailable"] = [{"name": f"m{n}", **exact(m)} for n, m in enumerate(memory)]
    doc = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [request]}},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


STORY = ["dra", "explain", "--node", "builtin:rtx4090", "--memory-step", "1Mi"]


def test_explain_replays_the_4090_story_claim_after_claim(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two 3 GiB claims fit on the 24 GB card (the shipped classes, no --class), an 18 GiB
    one does not: 24564 MiB less 6 GiB leaves 18420 MiB."""
    claims = [_sized_claim(tmp_path, n, m) for n, m in (("a", "3Gi"), ("b", "3Gi"), ("c", "18Gi"))]
    code = main([*STORY, *(arg for c in claims for arg in ("--claim", c))])
    out = capsys.readouterr().out
    assert code == 1
    assert out.count("first fit picks gpu-0") == 2
    assert f"claim c ({claims[2]}) on rtx4090: not allocatable" in out
    assert "  gpu-0  needs memory 18Gi, 18420Mi left" in out
    assert out.rstrip().endswith(
        "after 2 allocated claim(s):\n  gpu-0  memory 18420Mi left of 24564Mi"
    )


def test_explain_takes_the_first_available_subrequest_that_fits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    taken = _sized_claim(tmp_path, "taken", "6Gi")
    flexible = _sized_claim(tmp_path, "flexible", "20Gi", "4Gi")
    assert main([*STORY, "--claim", flexible]) == 0
    assert "  share/m0: gpu-0 (consumes memory 20Gi)" in capsys.readouterr().out
    assert main([*STORY, "--claim", taken, "--claim", flexible]) == 0
    assert "  share/m1: gpu-0 (consumes memory 4Gi)" in capsys.readouterr().out
    none = _sized_claim(tmp_path, "none", "20Gi", "19Gi")
    assert main([*STORY, "--claim", taken, "--claim", none]) == 1
    assert "every choice failed" in capsys.readouterr().out


def test_explain_says_when_a_capacity_request_gets_a_whole_device(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: without --memory-step the request's 3Gi was silently ignored."""
    claim = _sized_claim(tmp_path, "a", "3Gi")
    assert main(["dra", "explain", "--node", "builtin:rtx4090", "--claim", claim]) == 0
    out = capsys.readouterr().out
    assert (
        "note: request 'share' asks for capacity (memory 3Gi), but gpu-0 is published without "
        "consumable capacity (dra serve without --memory-step): the claim gets the whole device"
    ) in out


BAD = """\
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: bad}
spec:
  spec:
    devices:
      requests:
        - name: gpus
          exactly:
            deviceClassName: gpu.cdigen.dev
            selectors:
              - cel:
                  expression: device.attributes["gpu.cdigen.dev"].nvlinkClque >= 0
            capacity: {requests: {memroy: 1Gi}}
      constraints:
        - matchAttribute: resource.kubernetes.io/numaNod
"""


def test_check_names_file_field_and_cel_position_of_a_misspelt_attribute(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(BAD)
    assert main(["dra", "check", str(path)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (
        f"{path}: spec.spec.devices.requests[0].exactly.selectors[0].cel.expression: "
        "CEL line 1, column 37: no attribute 'nvlinkClque' in gpu.cdigen.dev "
        "(did you mean 'nvlinkClique'?)"
    )
    assert "capacity.requests.memroy: no capacity 'memroy' (did you mean 'memory'?)" in err[1]
    assert "constraints[0].matchAttribute: no attribute 'resource.kubernetes.io/numaNod'" in err[2]
    assert err[3].startswith(
        f"{path}: ResourceClaimTemplate bad: the scheduler could never allocate it on "
        "builtin:dgx-a100-mig-mixed (request 'gpus': selector 0: CEL runtime error: no attribute "
        "'nvlinkClque'"
    )
    assert err[-1] == "cdigen: dra check failed: 4 problem(s)"


def test_check_flags_nvidias_domain_and_syntax_errors(tmp_path: Path) -> None:
    doc = yaml.safe_load(BAD)
    selectors = doc["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"]
    selectors[0]["cel"]["expression"] = 'device.attributes["gpu.nvidia.com"].index == 0'
    selectors.append({"cel": {"expression": "device.driver == "}})
    from cdigen.policies.dra.check import Published, check_document

    problems = [str(p) for p in check_document(doc, "x.yaml", Published.of(DRIVER))]
    assert "publishes NVIDIA's names under 'gpu.cdigen.dev'" in problems[0]
    assert "selectors[1].cel.expression: CEL line 1" in problems[1]


def test_check_passes_the_examples_and_bad_input_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["dra", "check", *map(str, sorted(EXAMPLES.glob("*.yaml")))]) == 0
    assert main(["dra", "check", str(tmp_path / "missing.yaml")]) == 2
    broken = tmp_path / "broken.yaml"
    broken.write_text("kind: [\n")
    assert main(["dra", "check", str(broken)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "broken.yaml" in err[1] and "line 2" in err[1]


@pytest.mark.parametrize(
    "source", ["builtin:dgx1-v100", "builtin:dgx-a100-mig-mixed", "builtin:h100-mig-single"]
)
def test_what_check_accepts_covers_what_the_views_publish(source: str) -> None:
    node = load_node(source)
    assert attribute_names(device_views(node)) <= published_attribute_names()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--taint-xid", "79=Later"], "--taint-xid: '79=Later' is not XID=EFFECT"),
        (["--memory-step", "0"], "--memory-step: '0' is not a positive whole quantity"),
        (["--mps-thread-percentage", "150"], "--mps-thread-percentage: '150' is not a percent"),
        (["--mps-pipe-dir", "run/mps"], "--mps-pipe-dir: 'run/mps' is not an absolute path"),
        (["--mps-shm-dir", "/run/shm"], "--mps-shm-dir: '/run/shm' needs an MPS pipe directory"),
        (["--mps-pipe-dir", "/p", "--mps-shm-dir", "s"], "--mps-shm-dir: must be an absolute"),
        (["--mps-pipe-dir", "/p", "--mps-shm-dir", "/dev/shm"], "must not be the node's own"),
        (["--replicas", "0"], "--replicas: 0 is not in 1-1024"),
        (["--mig-strategy", "dynamic"], "--mig-strategy: dynamic makes MIG devices through NVML"),
    ],
)
def test_bad_sharing_flags_are_one_line_exit_2(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["dra", "serve", "--node", "builtin:rtx4090", "--node-name", "n", *flags]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


@pytest.mark.parametrize("version", ["1.34", "1.35", "1.36", "1.37"])
def test_the_examples_pass_strict_validation(version: str) -> None:
    import kubernetes_validate

    paths = sorted(EXAMPLES.glob("*.yaml"))
    assert len(paths) >= 6
    for path in paths:
        for doc in yaml.safe_load_all(path.read_text()):
            kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize("kubeconfig", ["missing", "empty"])
def test_an_unusable_kubeconfig_is_one_line_exit_2(
    kubeconfig: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "kubeconfig"
    if kubeconfig == "empty":
        path.write_text("")
    argv = ["dra", "serve", "--node", "builtin:rtx4090", "--node-name", "n"]
    argv += ["--kubelet-dir", str(tmp_path / "kubelet"), "--cdi-dir", str(tmp_path / "cdi")]
    assert main([*argv, "--kubeconfig", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--kubeconfig: {path}" in err, err


def test_outside_a_cluster_without_kubeconfig_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    argv = ["dra", "serve", "--node", "builtin:rtx4090", "--node-name", "n"]
    argv += ["--kubelet-dir", str(tmp_path / "kubelet"), "--cdi-dir", str(tmp_path / "cdi")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "in-cluster config" in err and "--kubeconfig" in err, err


def test_the_4090_story_in_the_docs_is_what_explain_prints(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "dra-sharing.md").read_text()
    command = "$ cdigen dra explain --node builtin:rtx4090 --memory-step 1Gi --claim memory-3gi"
    block = docs[docs.index(command) :].split("```", 1)[0]
    argv, _, printed = block.partition("\n")
    monkeypatch.chdir(EXAMPLES)  # the docs run it there
    assert main(argv.split()[2:]) == 1
    assert capsys.readouterr().out == printed


V1BETA1 = """\
apiVersion: resource.k8s.io/v1beta1
kind: ResourceClaim
metadata: {name: old-shape}
spec:
  devices:
    requests:
      - name: gpu
        deviceClassName: gpu.cdigen.dev
        selectors:
          - cel:
              expression: device.attributes["gpu.cdigen.dev"].productNme == "x"
"""


@pytest.mark.parametrize("tool", ["check", "explain"])
def test_a_v1beta1_shaped_request_is_refused_not_passed_unchecked(
    tool: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "old.yaml"
    path.write_text(V1BETA1)  # a CEL typo dra check used to pass as OK, never compiled
    argv = ["dra", "check", str(path)]
    if tool == "explain":
        argv = ["dra", "explain", "--node", "builtin:rtx4090", "--claim", str(path)]
    assert main(argv) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith(
        f"cdigen: error: {path}: spec.devices.requests[0].deviceClassName: the v1beta1 request "
        "shape (device fields on the request itself) is not checked; write it as "
        "resource.k8s.io/v1 does, under exactly:"
    )


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("adminAccess", True, "exactly.adminAccess: adminAccess is not simulated"),
        ("selector", [], "exactly.selector: unknown field 'selector', not checked; did you mean"),
        ("priority", 3, "exactly.priority: unknown field 'priority', not checked; leave it out"),
    ],
)
def test_a_field_the_tools_do_not_simulate_is_refused(
    field: str, value: Any, said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = next(yaml.safe_load_all((EXAMPLES / "memory-3gi.yaml").read_text()))
    doc["spec"]["spec"]["devices"]["requests"][0]["exactly"][field] = value
    path = tmp_path / "claim.yaml"
    path.write_text(yaml.safe_dump(doc))
    for argv in (
        ["dra", "check", str(path)],
        ["dra", "explain", "--node", "builtin:rtx4090", "--claim", str(path)],
    ):
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1
        assert f"{path}: spec.spec.devices.requests[0].{said}" in err
    doc["spec"]["spec"]["devices"]["requests"][0]["exactly"]["adminAccess"] = False
    del doc["spec"]["spec"]["devices"]["requests"][0]["exactly"][field]
    path.write_text(yaml.safe_dump(doc))  # adminAccess: false is the default, and checked
    assert main(["dra", "check", str(path)]) == 0
    doc["spec"]["spec"]["devices"]["requests"].append({"name": "bare"})
    path.write_text(yaml.safe_dump(doc))  # a request with nothing in it to check
    assert main(["dra", "check", str(path)]) == 1
    assert "spec.spec.devices.requests[1]: a request with neither exactly nor firstAvailable" in (
        capsys.readouterr().err
    )


def test_serve_keeps_the_guards_of_generate_for_the_claims_specs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A driver root that is not there: exit 2, one line, before the API server is asked (the
    claims' specs would have had no driver files)."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    argv = ["dra", "serve", "--node", "builtin:rtx4090", "--node-name", "n"]
    argv += ["--driver-root", str(tmp_path / "nowhere"), "--kubeconfig", str(kubeconfig)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--driver-root" in err and "nowhere" in err

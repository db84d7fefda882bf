"""What a DRA claim that names no memory takes on a node serving memory shares (issue 35, point
2): the operator's ``--default-share`` or ``--shares-per-gpu``, else the whole GPU, published as
``requestPolicy.default`` within what the API server takes, shown by ``dra explain`` and
``labels``; and the rough edges met there (i, j, k, l)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cdigen.cli import build_parser, main
from cdigen.discover import load_node
from cdigen.memory_shares import MemoryShares
from cdigen.model import DEVICE_PLUGIN_MIG_STRATEGY, DRA_MIG_STRATEGY
from cdigen.plugin.agent.kubeapi import api_client
from cdigen.plugin.dra.kube import KubeApi
from cdigen.plugin.dra.slice_publisher import SlicePublisher
from cdigen.plugin.dra.slices import build_slices
from cdigen.policies.device_view import device_views
from tests.fake_apiserver import FakeApiServer
from tests.helpers.slice_rules import capacity_problems, validate_pool

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "deploy" / "dra" / "examples"
GIB, MIB = 1 << 30, 1 << 20
DRIVER = "gpu.cdigen.dev"
NO_MEMORY = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaim",
    "metadata": {"name": "seed"},
    "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}},
}


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def no_memory(tmp_path: Path) -> str:
    path = tmp_path / "no-memory.yaml"
    path.write_text(yaml.safe_dump(NO_MEMORY))
    return str(path)


# -- the published policy ---------------------------------------------------------------------


def _policy(source: str, shares: MemoryShares) -> list[dict[str, object]]:
    views = device_views(load_node(source))
    slices = build_slices(views, driver=DRIVER, node_name="n", generation=1, shares=shares)
    for body in slices:
        for device in body["spec"]["devices"]:
            assert capacity_problems(device) == [], device["name"]
    validate_pool(slices, "1.36")
    return [
        d["capacity"]["memory"].get("requestPolicy")
        for s in slices
        for d in s["spec"]["devices"]
        if d.get("allowMultipleAllocations")
    ]


@pytest.mark.parametrize(
    ("shares", "default"),
    [
        (MemoryShares(step=GIB), "23Gi"),  # the whole GPU: such a claim never shares it
        (MemoryShares(step=MIB), "24564Mi"),  # every MiB of it
        (MemoryShares(step=GIB, default=6 * GIB), "6Gi"),
        (MemoryShares(step=GIB, per_gpu=4), "5Gi"),  # 23.99 GiB / 4, down to the step
        (MemoryShares(step=MIB, per_gpu=4), "6141Mi"),  # what replicas: 4 gives a device plugin pod
    ],
)
def test_the_default_is_the_operators_and_what_the_api_server_takes(
    shares: MemoryShares, default: str
) -> None:
    (policy,) = _policy("builtin:rtx4090", shares)
    assert policy["default"] == default  # type: ignore[index]


def test_every_builtin_gpu_gets_a_policy_the_api_server_takes() -> None:
    for source in ("builtin:dgx-a100", "builtin:dgx1-v100", "builtin:ws-4xv100"):
        for shares in (MemoryShares(), MemoryShares(step=MIB, per_gpu=3)):
            assert _policy(source, shares)


def test_the_fake_api_server_refuses_a_default_off_the_step_as_the_real_one(
    tmp_path: Path,
) -> None:
    """A default that is not min + k * step is refused (422) by validateRequestPolicy; the
    command line never makes one (below), the fake holds the plugin to it anyway."""
    api = FakeApiServer().start()
    try:
        kube = KubeApi(api_client(str(api.kubeconfig(tmp_path / "kubeconfig"))))
        publisher = SlicePublisher(kube, driver=DRIVER, node_name="n")
        views = device_views(load_node("builtin:rtx4090"))
        with pytest.raises(Exception, match=r"422|Invalid"):
            publisher.publish(views, shares=MemoryShares(step=GIB, default=GIB + GIB // 2))
        publisher.publish(views, shares=MemoryShares(step=GIB, default=3 * GIB))
        assert len(api.slices) == 1
    finally:
        api.stop()


# -- dra explain: the class's promise, and the note ------------------------------------------


def test_a_claim_naming_no_memory_holds_the_whole_gpu_by_default(
    capsys: pytest.CaptureFixture[str], no_memory: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/dra-sharing.md: gpu.cdigen.dev with no memory named takes the whole card; a 3 GiB
    and an 18 GiB claim after it do not fit beside it."""
    monkeypatch.chdir(EXAMPLES)
    code, out, _ = run(capsys, "dra", "explain", "--node", "builtin:rtx4090",
                       "--memory-step", "1Gi", "--claim", no_memory,
                       "--claim", "memory-3gi.yaml", "--claim", "memory-18gi.yaml")  # fmt: skip
    assert code == 1
    assert "  gpu: gpu-0 (consumes memory 23Gi)" in out
    assert "note: request 'gpu' names no memory: it takes the default share, 23Gi of gpu-0 " \
        "(the whole GPU;" in out  # fmt: skip
    assert "gpu-0  needs memory 3Gi, 1012Mi left" in out
    assert "gpu-0  needs memory 18Gi, 1012Mi left" in out
    assert out.rstrip().endswith("gpu-0  memory 1012Mi left of 24564Mi")


def test_with_shares_per_gpu_unchanged_claims_share_the_card(
    capsys: pytest.CaptureFixture[str], no_memory: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(EXAMPLES)
    code, out, _ = run(capsys, "dra", "explain", "--node", "builtin:rtx4090",
                       "--memory-step", "1GiB", "--shares-per-gpu", "4", "--claim", no_memory,
                       "--claim", no_memory, "--claim", "memory-3gi.yaml")  # fmt: skip
    assert code == 0
    assert out.count("(consumes memory 5Gi)") == 2 and "(consumes memory 3Gi)" in out
    assert "1/4 of the GPU's memory, in whole steps" in out
    assert out.rstrip().endswith("gpu-0  memory 11252Mi left of 24564Mi")


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--default-share", "6Gi"], "--default-share: needs --memory-step"),
        (["--shares-per-gpu", "4"], "--shares-per-gpu: needs --memory-step"),
        (["--memory-step", "1Gi", "--default-share", "6Gi", "--shares-per-gpu", "4"],
         "--default-share: cannot go with --shares-per-gpu"),
        (["--memory-step", "1Gi", "--default-share", "1536Mi"],
         "--default-share: '1536Mi' is not a whole number of --memory-step 1Gi; give a multiple "
         "of the step, e.g. 1Gi or 2Gi"),
        (["--memory-step", "1Gi", "--default-share", "30Gi"],
         "--default-share: a claim naming no memory would take 30Gi of gpu-0, which offers 1Gi "
         "to 23Gi in steps of 1Gi"),
        (["--memory-step", "1Gi", "--shares-per-gpu", "30"],
         "--shares-per-gpu: a claim naming no memory would take 0 of gpu-0"),
        (["--memory-step", "1Gi", "--shares-per-gpu", "0"], "--shares-per-gpu: 0 is not in 1-1024"),
    ],
)  # fmt: skip
def test_a_default_that_cannot_be_published_is_one_line_exit_2(
    capsys: pytest.CaptureFixture[str], no_memory: str, flags: list[str], expected: str
) -> None:
    for command in (
        ["dra", "explain", "--node", "builtin:rtx4090", "--claim", no_memory],
        ["labels", "--node", "builtin:rtx4090"],
    ):
        code, out, err = run(capsys, *command, *flags)
        assert code == 2 and out == "", (command, out)
        assert err.count("\n") == 1 and expected in err, err


def test_dra_serve_refuses_a_default_the_api_server_would_refuse(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    api = FakeApiServer()  # never asked: the start stops before
    kubeconfig = api.kubeconfig(tmp_path / "kubeconfig")
    kubelet = tmp_path / "kubelet"
    (kubelet / "plugins").mkdir(parents=True)
    code, _, err = run(capsys, "dra", "serve", "--node", "builtin:rtx4090", "--node-name", "n",
                       "--kubeconfig", str(kubeconfig), "--kubelet-dir", str(kubelet),
                       "--cdi-dir", str(tmp_path / "cdi"), "--memory-step", "1Gi",
                       "--shares-per-gpu", "64")  # fmt: skip
    assert code == 2, err
    assert (
        err.strip()
        .splitlines()[-1]
        .startswith(
            "cdigen: error: --shares-per-gpu: a claim naming no memory would take 0 of gpu-0"
        )
    )
    assert api.requests == []


# -- labels -----------------------------------------------------------------------------------


def test_labels_show_what_an_unchanged_pod_gets(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "labels", "--node", "builtin:rtx4090", "--memory-step", "1Gi",
                       "--shares-per-gpu", "4")  # fmt: skip
    assert code == 0
    assert (
        "cdigen.dev/dra.default-share=5120\n" in out and "cdigen.dev/dra.memory-step=1024\n" in out
    )
    code, out, _ = run(capsys, "labels", "--node", "builtin:rtx4090")
    assert code == 0 and "cdigen.dev/dra." not in out


def test_the_dra_plugins_labels_carry_the_shares() -> None:
    from cdigen.plugin.dra.labels import dra_labels

    node = load_node("builtin:rtx4090")
    views = device_views(node)
    labels = dra_labels(node, views, {}, "mixed", MemoryShares(step=GIB, default=6 * GIB))
    assert labels["cdigen.dev/dra.default-share"] == "6144"
    assert "cdigen.dev/dra.default-share" not in dra_labels(node, views, {}, "mixed")


# -- rough edges ------------------------------------------------------------------------------


def test_k_a_request_above_the_policy_is_told_in_quantities(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    doc = yaml.safe_load(yaml.safe_dump(NO_MEMORY))
    doc["spec"]["devices"]["requests"][0]["exactly"]["capacity"] = {"requests": {"memory": "30Gi"}}
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(doc))
    code, out, _ = run(capsys, "dra", "explain", "--node", "builtin:rtx4090",
                       "--memory-step", "1Gi", "--claim", str(path))  # fmt: skip
    assert code == 1
    assert (
        "gpu-0  memory request 30Gi is more than its request policy allows: at most 23Gi "
        "(1Gi to 23Gi in steps of 1Gi)"
    ) in out
    assert "32212254720" not in out


def test_l_every_memory_flag_takes_the_same_spellings(
    capsys: pytest.CaptureFixture[str], no_memory: str, tmp_path: Path
) -> None:
    outs = set()
    for step in ("1Gi", "1GiB", "1gib", "1073741824", "1024Mi", "1024MiB"):
        code, out, err = run(capsys, "dra", "explain", "--node", "builtin:rtx4090",
                             "--memory-step", step, "--claim", no_memory)  # fmt: skip
        assert code == 0, err
        outs.add(out)
    assert len(outs) == 1
    reference = ROOT / "tests" / "fixtures" / "topologies" / "dgx-a100.txt"
    for memory in ("80Gi", "80GiB", "85899345920"):
        code, out, err = run(capsys, "topo", "import", str(reference), "--memory", memory,
                             "--format", "json")  # fmt: skip
        assert code == 0, err
        assert '"memoryBytes": 85899345920' in out


def test_j_dra_explain_reads_nvml_by_default_as_every_command(
    capsys: pytest.CaptureFixture[str], no_memory: str
) -> None:
    """Was: `--node` required, and `nvml` refused. On this machine there is no driver: the
    one line is NVML's, as for `cdigen labels`."""
    code, _, labels_err = run(capsys, "labels")
    for argv in (["--claim", no_memory], ["--node", "nvml", "--claim", no_memory]):
        code, out, err = run(capsys, "dra", "explain", *argv)
        if code == 0:  # a machine with a GPU driver: it explained its own GPUs
            assert "first fit picks" in out
            continue
        assert code == 2 and "required" not in err and "NVML" in err, err
        assert err.splitlines()[-1] == labels_err.splitlines()[-1]


def test_i_the_mig_strategy_defaults_are_one_constant_each_with_the_reason_in_help(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = build_parser()
    dra = parser.parse_args(["dra", "serve"])
    explain = parser.parse_args(["dra", "explain", "--claim", "x"])
    labels = parser.parse_args(["labels"])
    assert dra.mig_strategy == explain.mig_strategy == DRA_MIG_STRATEGY == "mixed"
    assert labels.mig_strategy == DEVICE_PLUGIN_MIG_STRATEGY == "none"
    from cdigen.plugin.deviceplugin.config import PluginConfig

    assert PluginConfig().mig_strategy == DEVICE_PLUGIN_MIG_STRATEGY
    for command in (["dra", "serve"], ["dra", "explain"], ["plugin", "serve"], ["labels"]):
        with pytest.raises(SystemExit):
            main([*command, "--help"])
        lines = capsys.readouterr().out.splitlines()
        at = next(n for n, line in enumerate(lines) if line.strip().startswith("--mig-strategy"))
        block = [lines[at]]
        for line in lines[at + 1 :]:
            if not line.startswith(" " * 8):  # the next option, or the end of the group
                break
            block.append(line)
        said = " ".join(" ".join(block).split())
        assert "default" in said and "none" in said and "mixed" in said, (command, said)
        assert "because" in said or ":" in said.split("default", 1)[1], said  # a reason

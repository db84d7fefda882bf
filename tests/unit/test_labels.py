"""Node labels: GFD's names and value formats on every built-in node, checked against the
table in docs/labels.md; ``cdigen labels`` as a user runs it, and the docs' kubectl one-liner."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cdigen.discover import load_node
from cdigen.discover.builtin import names
from cdigen.labels import (
    LABEL_VALUE,
    LabelSharing,
    family,
    label_problems,
    node_labels,
    product_value,
)

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "labels.md"
SHARINGS = {
    "unshared": LabelSharing(),
    "time-slicing": LabelSharing(replicas=4, strategy="time-slicing"),
    "mps-renamed": LabelSharing(replicas=2, strategy="mps", renamed=True),
}
# Kubernetes' label value rule, written out here rather than imported: the test checks the code's.
K8S_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")


def documented() -> list[tuple[re.Pattern[str], re.Pattern[str]]]:
    """(key pattern, value format) per row of the table in docs/labels.md."""
    rows = []
    for line in DOC.read_text(encoding="utf-8").splitlines():
        line = line.replace("\\|", "\0")  # an escaped | inside a cell (an alternation)
        cells = [c.strip().replace("\0", "|") for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[0].startswith(("`nvidia.com/", "`cdigen.dev/")):
            continue
        key = re.escape(cells[0].strip("`")).replace(re.escape("<profile>"), r"[0-9]+g\.[0-9]+gb")
        rows.append((re.compile(key), re.compile(cells[1].strip("`"))))
    assert len(rows) > 25, "the table in docs/labels.md was not found"
    return rows


TABLE = documented()


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cdigen.cli", *args], capture_output=True, text=True, check=False
    )


@pytest.mark.parametrize("sharing", sorted(SHARINGS))
@pytest.mark.parametrize("strategy", ["none", "single", "mixed"])
@pytest.mark.parametrize("name", names())
def test_every_label_of_every_builtin_has_a_documented_name_and_format(
    name: str, strategy: str, sharing: str
) -> None:
    labels = node_labels(
        load_node(f"builtin:{name}"), mig_strategy=strategy, sharing=SHARINGS[sharing]
    )
    assert label_problems(labels) == []
    for key, value in labels.items():
        assert len(value) <= 63 and K8S_VALUE.fullmatch(value), f"{key}={value!r}"
        formats = [fmt for pattern, fmt in TABLE if pattern.fullmatch(key)]
        assert formats, f"{key} is not in docs/labels.md"
        assert formats[0].fullmatch(value), f"{key}={value!r} is not {formats[0].pattern}"
    for required in (
        "gpu.present",
        "gpu.product",
        "gpu.count",
        "gpu.replicas",
        "gpu.sharing-strategy",
        "gpu.family",
        "gpu.compute.major",
        "gpu.compute.minor",
        "mps.capable",
        "cuda.driver-version.major",
        "cuda.driver-version.minor",
        "cuda.driver-version.revision",
        "cuda.driver.major",
        "cuda.runtime-version.major",
    ):
        assert f"nvidia.com/{required}" in labels
    # under none only where MIG is enabled somewhere (GFD: only under single and mixed)
    mig_enabled = any(g.mig_enabled for g in load_node(f"builtin:{name}").gpus)
    assert ("nvidia.com/mig.strategy" in labels) == (strategy != "none" or mig_enabled)
    assert list(labels) == sorted(labels)


@pytest.mark.parametrize(
    ("name", "product", "memory", "gpu_family", "compute"),
    [
        ("dgx-a100", "NVIDIA-A100-SXM4-80GB", "81920", "ampere", ("8", "0")),
        ("dgx-h100", "NVIDIA-H100-80GB-HBM3", "81559", "hopper", ("9", "0")),
        ("dgx1-v100", "Tesla-V100-SXM2-16GB", "16160", "volta", ("7", "0")),
        ("dgx1-p100", "Tesla-P100-SXM2-16GB", "16280", "pascal", ("6", "0")),
        ("ws-4xrtx8000", "Quadro-RTX-8000", "46080", "turing", ("7", "5")),
        ("rtx4090", "NVIDIA-GeForce-RTX-4090", "24564", "ada-lovelace", ("8", "9")),
    ],
)
def test_gfd_values_of_known_products(
    name: str, product: str, memory: str, gpu_family: str, compute: tuple[str, str]
) -> None:
    node = load_node(f"builtin:{name}")
    labels = node_labels(node)
    assert labels["nvidia.com/gpu.product"] == product
    assert labels["nvidia.com/gpu.memory"] == memory  # MiB
    assert labels["nvidia.com/gpu.family"] == gpu_family
    assert (
        labels["nvidia.com/gpu.compute.major"],
        labels["nvidia.com/gpu.compute.minor"],
    ) == compute
    assert labels["nvidia.com/gpu.count"] == str(len(node.gpus))
    assert labels["nvidia.com/gpu.present"] == "true"
    assert labels["nvidia.com/gpu.replicas"] == "1"
    assert labels["nvidia.com/gpu.sharing-strategy"] == "none"
    major, minor, *rev = node.driver_version.split(".")
    assert labels["nvidia.com/cuda.driver-version.major"] == labels["nvidia.com/cuda.driver.major"]
    assert labels["nvidia.com/cuda.driver-version.major"] == major
    assert labels["nvidia.com/cuda.driver-version.minor"] == minor
    assert labels["nvidia.com/cuda.driver-version.revision"] == (rev[0] if rev else "")
    assert labels["nvidia.com/cuda.driver-version.full"] == node.driver_version
    assert labels["nvidia.com/cuda.runtime-version.full"] == node.cuda_driver_version


def test_families_by_compute_capability() -> None:
    expected = {
        "3.7": "kepler",
        "5.2": "maxwell",
        "6.1": "pascal",
        "7.0": "volta",
        "7.2": "volta",
        "7.5": "turing",
        "8.0": "ampere",
        "8.6": "ampere",
        "8.9": "ada-lovelace",
        "9.0": "hopper",
        "10.0": "blackwell",
        "12.0": "blackwell",
        "4.0": "undefined",
    }
    assert {cc: family(cc) for cc in expected} == expected


def test_product_value_is_gfds_and_always_a_label_value() -> None:
    assert product_value("NVIDIA A100-SXM4-40GB") == "NVIDIA-A100-SXM4-40GB"
    assert product_value("NVIDIA  H100 80GB HBM3", "MIG", "1g.10gb") == (
        "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"
    )
    assert product_value("Tesla K80 (rev #2)") == "Tesla-K80-rev-2"
    long = product_value("NVIDIA " + "Very Long Product Name " * 5)
    assert len(long) <= 63 and LABEL_VALUE.match(long)


def test_sharing_labels_follow_gfd() -> None:
    node = load_node("builtin:rtx4090")
    shared = node_labels(node, sharing=LabelSharing(replicas=4, strategy="time-slicing"))
    assert shared["nvidia.com/gpu.product"] == "NVIDIA-GeForce-RTX-4090-SHARED"
    assert shared["nvidia.com/gpu.replicas"] == "4"
    assert shared["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    assert shared["nvidia.com/mps.capable"] == "false"
    mps = node_labels(node, sharing=LabelSharing(replicas=2, strategy="mps", renamed=True))
    assert mps["nvidia.com/gpu.product"] == "NVIDIA-GeForce-RTX-4090"  # renamed: no suffix
    assert mps["nvidia.com/gpu.sharing-strategy"] == "mps"
    assert mps["nvidia.com/mps.capable"] == "true"


def test_mig_strategies() -> None:
    single = node_labels(load_node("builtin:h100-mig-single"), mig_strategy="single")
    assert single["nvidia.com/mig.strategy"] == "single"
    assert single["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"
    assert single["nvidia.com/gpu.count"] == "56"
    assert single["nvidia.com/gpu.memory"] == "9984"
    assert single["nvidia.com/mig.capable"] == "true"

    mixed_node = load_node("builtin:dgx-a100-mig-mixed")
    invalid = node_labels(mixed_node, mig_strategy="single")  # several profiles: GFD's INVALID
    assert invalid["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB-MIG-INVALID"
    assert invalid["nvidia.com/gpu.count"] == "0"
    assert invalid["nvidia.com/gpu.memory"] == "0"

    mixed = node_labels(mixed_node, mig_strategy="mixed")
    counts: dict[str, int] = {}
    for gpu in mixed_node.gpus:
        for mig in gpu.mig_devices:
            counts[mig.profile] = counts.get(mig.profile, 0) + 1
    assert {
        k.removeprefix("nvidia.com/mig-").removesuffix(".count"): int(v)
        for k, v in mixed.items()
        if k.startswith("nvidia.com/mig-") and k.endswith(".count")
    } == counts
    assert mixed["nvidia.com/mig-1g.10gb.product"] == "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb"
    assert mixed["nvidia.com/mig-1g.10gb.memory"] == "9728"
    assert "nvidia.com/mig-1g.10gb.count" not in node_labels(mixed_node)  # strategy none


def test_own_labels_for_nvlink_numa_and_health() -> None:
    a100 = node_labels(load_node("builtin:dgx-a100"))
    assert a100["cdigen.dev/nvlink.domain-size"] == "8"
    assert a100["cdigen.dev/numa.gpu-nodes"] == "4"
    assert a100["cdigen.dev/numa.max-gpus"] == "2"
    workstation = load_node("builtin:rtx4090")
    assert node_labels(workstation)["cdigen.dev/nvlink.domain-size"] == "0"
    sick = dataclasses.replace(
        workstation, gpus=(dataclasses.replace(workstation.gpus[0], healthy=False),)
    )
    assert node_labels(sick)["cdigen.dev/gpu.healthy"] == "0"
    unknown = dataclasses.replace(
        workstation, gpus=(dataclasses.replace(workstation.gpus[0], numa_node=None),)
    )
    assert "cdigen.dev/numa.gpu-nodes" not in node_labels(unknown)
    assert node_labels(dataclasses.replace(workstation, gpus=())) == {}


def test_cli_prints_sorted_key_value_lines_and_json(tmp_path: Path) -> None:
    text = run("labels", "--node", "builtin:dgx-a100")
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines == sorted(lines)
    assert "nvidia.com/gpu.product=NVIDIA-A100-SXM4-80GB" in lines
    as_json = run("labels", "--node", "builtin:dgx-a100", "--format", "json")
    assert json.loads(as_json.stdout) == dict(line.split("=", 1) for line in lines)
    node_file = tmp_path / "node.yaml"
    assert run("discover", "--node", "builtin:dgx-a100", "-o", str(node_file)).returncode == 0
    assert run("labels", "--node", str(node_file)).stdout == text.stdout  # a node file: the same
    mixed = run("labels", "--node", "builtin:dgx-a100-mig-mixed", "--mig-strategy", "mixed")
    assert "nvidia.com/mig.strategy=mixed" in mixed.stdout.splitlines()
    shared = run("labels", "--node", "builtin:rtx4090", "--replicas", "4")
    assert "nvidia.com/gpu.sharing-strategy=time-slicing" in shared.stdout.splitlines()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--replicas", "0"], "--replicas 0 is out of range"),
        (["--mig-strategy", "all"], "invalid choice: 'all'"),
        (["--node", "builtin:nope"], "no built-in sample called 'nope'"),
        (["--node", "/nonexistent.yaml"], "not found"),
        # issue 35 m: a strategy without replicas was silently ignored
        (["--sharing-strategy", "mps"], "--sharing-strategy mps needs --replicas N"),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(args: list[str], message: str) -> None:
    result = run("labels", *(["--node", "builtin:rtx4090"] if "--node" not in args else []), *args)
    assert result.returncode == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr


def test_docs_kubectl_one_liner_passes_every_label_as_one_argument(tmp_path: Path) -> None:
    """Runs the one-liner of docs/labels.md with a kubectl that records its arguments."""
    one_liner = '$ cdigen labels | xargs kubectl label node "$(hostname)" --overwrite'
    for doc in (DOC, REPO / "docs" / "install.md"):
        assert one_liner in doc.read_text(encoding="utf-8"), doc
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "cdigen").write_text(
        f'#!/bin/sh\nexec {sys.executable} -m cdigen.cli "$@" --node builtin:dgx-a100-mig-mixed '
        "--mig-strategy mixed\n"
    )
    record = tmp_path / "argv"
    (bin_dir / "kubectl").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {record}\n')
    (bin_dir / "hostname").write_text("#!/bin/sh\necho gpu-node-1\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        ["sh", "-c", one_liner.removeprefix("$ ")], env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    argv = record.read_text().splitlines()
    assert argv[:4] == ["label", "node", "gpu-node-1", "--overwrite"]
    expected = node_labels(load_node("builtin:dgx-a100-mig-mixed"), mig_strategy="mixed")
    assert argv[4:] == [f"{k}={v}" for k, v in expected.items()]


def test_a_node_of_several_products_is_labelled_by_the_most_common() -> None:
    node = load_node("builtin:dgx-a100")
    gpus = [
        dataclasses.replace(g, name="NVIDIA A100-SXM4-40GB") if g.index < 3 else g
        for g in node.gpus
    ]
    labels = node_labels(dataclasses.replace(node, gpus=tuple(gpus)))
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
    assert labels["nvidia.com/gpu.count"] == "5"


def test_the_plugin_config_gives_gfds_sharing_view() -> None:
    from cdigen.plugin.deviceplugin.config import PluginConfig, ResourceConfig
    from cdigen.plugin.deviceplugin.labels import plugin_labels
    from cdigen.plugin.deviceplugin.sharing import Sharing

    node = load_node("builtin:rtx4090")  # 24564 MiB
    cases = {
        ("nvidia.com/gpu", Sharing(replicas=4)): (
            "NVIDIA-GeForce-RTX-4090-SHARED",
            "4",
            "time-slicing",
        ),
        ("nvidia.com/gpu.shared", Sharing(replicas=4)): (
            "NVIDIA-GeForce-RTX-4090",
            "4",
            "time-slicing",
        ),
        (
            "nvidia.com/gpu-memory",
            Sharing(memory_slice_mib=1024, mps_pipe_directory="/run/nvidia/mps"),
        ): ("NVIDIA-GeForce-RTX-4090", "23", "mps"),
    }
    for (name, sharing), (product, replicas, strategy) in cases.items():
        config = PluginConfig(resources=(ResourceConfig(name, sharing=sharing),))
        labels = plugin_labels(node, config)
        assert labels["nvidia.com/gpu.product"] == product, name
        assert labels["nvidia.com/gpu.replicas"] == replicas, name
        assert labels["nvidia.com/gpu.sharing-strategy"] == strategy, name
        assert labels["nvidia.com/mps.capable"] == str(strategy == "mps").lower()
    assert plugin_labels(node, PluginConfig())["nvidia.com/gpu.replicas"] == "1"


def test_registering_labels_imports_no_label_code() -> None:
    """``labels`` is a core command: registering it must stay cheap (every command starts it)."""
    code = (
        "import sys; from cdigen.cli import build_parser; build_parser(wings=False); "
        "print('cdigen.labels' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "False", result.stderr
    from cdigen.cli import build_parser
    from cdigen.model import MIG_STRATEGIES

    sub = next(
        a for a in build_parser(wings=False)._actions if isinstance(a, argparse._SubParsersAction)
    )
    action = next(a for a in sub.choices["labels"]._actions if a.dest == "mig_strategy")
    assert tuple(action.choices or ()) == MIG_STRATEGIES


def test_a_feature_file_that_cannot_be_written_is_logged_and_serving_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from cdigen.plugin.agent.feature_file import FeatureFile
    from cdigen.plugin.deviceplugin.config import PluginConfig
    from cdigen.plugin.deviceplugin.labels import plugin_labels

    (tmp_path / "file").write_text("")
    features = FeatureFile(tmp_path / "file" / "cdigen")  # its directory is a file
    node = load_node("builtin:rtx4090")
    assert not features.update(lambda: plugin_labels(node, PluginConfig()))
    assert "node labels not written" in caplog.text
    good = FeatureFile(tmp_path / "features.d" / "cdigen")
    assert good.update(lambda: plugin_labels(node, PluginConfig()))
    assert not good.update(lambda: plugin_labels(node, PluginConfig()))  # unchanged: no write
    assert good.writes == 1


@pytest.mark.parametrize("name", names())
def test_nvlink_domain_size_agrees_with_the_dra_attribute(name: str) -> None:
    """``cdigen.dev/nvlink.domain-size`` is the biggest ``nvlinkDomain`` the DRA view publishes."""
    from collections import Counter

    from cdigen.labels import nvlink_domain_size
    from cdigen.policies.graph import nvlink_groups

    node = load_node(f"builtin:{name}")
    domains = Counter(nvlink_groups(node).domain.values())
    assert nvlink_domain_size(node) == max(domains.values(), default=0)


def test_the_console_samples_in_docs_labels_md_are_what_cdigen_prints() -> None:
    """Each ``$ cdigen labels ...`` block of docs/labels.md (with an optional ``| grep -E``)."""
    blocks = re.findall(
        r"```console\n\$ (cdigen labels [^\n|]*)(?:\| grep -E '([^']*)')?\n(.*?)```",
        DOC.read_text(encoding="utf-8"),
        re.S,
    )
    assert len(blocks) >= 2
    for command, pattern, shown in blocks:
        result = run(*command.split()[1:])
        assert result.returncode == 0, result.stderr
        lines = [ln for ln in result.stdout.splitlines() if not pattern or re.search(pattern, ln)]
        assert shown.splitlines() == lines, command


def test_a_mig_node_under_strategy_none_says_so_in_a_label_and_a_warning() -> None:
    """Issue 35 n: GFD labels mig.strategy under single and mixed; under none it leaves it out,
    which on a MIG node hid why the MIG GPUs were not advertised."""
    mig = run("labels", "--node", "builtin:dgx-a100-mig-mixed")
    assert mig.returncode == 0
    assert "nvidia.com/mig.strategy=none" in mig.stdout.splitlines()
    assert "--mig-strategy single or mixed" in mig.stderr
    assert len(mig.stderr.strip().splitlines()) == 1
    plain = run("labels", "--node", "builtin:rtx4090")  # no MIG: as GFD, no label, no warning
    assert "mig.strategy" not in plain.stdout and not plain.stderr
    single = run("labels", "--node", "builtin:h100-mig-single", "--mig-strategy", "single")
    assert "nvidia.com/mig.strategy=single" in single.stdout.splitlines()


def test_a_failed_feature_file_write_is_retried_without_a_label_change(tmp_path: Path) -> None:
    """Issue 36, finding 10: the directory is unusable at first (here a file stands where it
    should be), then fixed; the labels are written without another update."""
    import time

    from cdigen.plugin.agent.feature_file import FeatureFile

    features_d = tmp_path / "features.d"
    features_d.write_text("not a directory")
    features = FeatureFile(features_d / "cdigen", retry_first_s=0.05)
    try:
        assert features.update(lambda: {"cdigen.dev/gpu.count": "8"}) is False
        features_d.unlink()
        features_d.mkdir()
        deadline = time.monotonic() + 5
        while not (features_d / "cdigen").exists():
            assert time.monotonic() < deadline, "never retried"
            time.sleep(0.02)
        assert (features_d / "cdigen").read_text().endswith("\ncdigen.dev/gpu.count=8\n")
    finally:
        features.stop()

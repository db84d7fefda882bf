"""Kubernetes node labels from a :class:`~cdigen.model.Node`, under the names and value formats
of NVIDIA's GPU Feature Discovery (GFD), so that nodeSelectors written for it keep working,
plus a few of cdigen's own (``cdigen.dev/…``) for topology GFD does not label.

Pure functions: the plugins write them into a Node Feature Discovery feature file
(:func:`feature_file_text`), ``cdigen labels`` prints them. docs/labels.md lists every label.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from cdigen.constants import MIB
from cdigen.families import family_of
from cdigen.model import DEVICE_PLUGIN_MIG_STRATEGY, MIG_STRATEGIES, Gpu, Node

NVIDIA = "nvidia.com/"
OURS = "cdigen.dev/"
SHARING_STRATEGIES = ("none", "time-slicing", "mps")

# A label value: at most 63 characters of [A-Za-z0-9._-], beginning and ending alphanumeric
# (or empty). Kubernetes' own rule (validation.IsValidLabelValue).
LABEL_VALUE = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?$")
# The name part of a key: the same characters, at most 63, alphanumeric at both ends.
LABEL_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")


@dataclass(frozen=True)
class LabelSharing:
    """How whole GPUs are shared, as GFD's ``gpu.replicas`` / ``gpu.sharing-strategy`` see it.

    ``replicas``: devices per GPU (1: not shared); ``strategy``: ``time-slicing`` or ``mps``
    when shared; ``renamed``: the shares go out under another resource name than
    ``nvidia.com/gpu`` (then ``gpu.product`` gets no ``-SHARED`` suffix, as in GFD).
    """

    replicas: int = 1
    strategy: str = "none"
    renamed: bool = False

    @property
    def shared(self) -> bool:
        """True when each GPU is handed out more than once."""
        return self.replicas > 1


NOT_SHARED = LabelSharing()


def family(compute_capability: str) -> str:
    """GFD's ``gpu.family`` for a compute capability such as ``8.0``: ``ampere``."""
    known = family_of(*_major_minor(compute_capability))
    return known.label if known else "undefined"


def _major_minor(version: str) -> tuple[int, int]:
    parts = version.split(".")
    try:
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        return 0, 0


def product_value(*parts: str) -> str:
    """GFD's product value: each part stripped of characters outside ``[A-Za-z0-9._ -]``, its
    spaces turned into ``-``, the parts joined by ``-`` (``NVIDIA-A100-SXM4-40GB``); cut to a
    valid label value if a long name would pass 63 characters."""
    cleaned = ("-".join(re.sub(r"[^A-Za-z0-9._ -]", "", p).split()) for p in parts if p)
    return _fit("-".join(c for c in cleaned if c))


def _fit(value: str) -> str:
    """``value`` cut to 63 characters and trimmed to alphanumeric ends (a valid label value)."""
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", value[:63])


def _mib(memory_bytes: int) -> str:
    return str(memory_bytes // MIB)


def _version_labels(node: Node) -> dict[str, str]:
    labels: dict[str, str] = {}
    driver = node.driver_version.split(".")
    if 2 <= len(driver) <= 3 and all(p.isdigit() for p in driver):
        major, minor, rev = (*driver, "")[:3]
        labels.update(
            {
                "cuda.driver-version.major": major,
                "cuda.driver-version.minor": minor,
                "cuda.driver-version.revision": rev,
                "cuda.driver-version.full": node.driver_version,
                # the names GFD still writes beside the new ones (deprecated there)
                "cuda.driver.major": major,
                "cuda.driver.minor": minor,
                "cuda.driver.rev": rev,
            }
        )
    cuda = node.cuda_driver_version.split(".")
    if len(cuda) == 2 and all(p.isdigit() for p in cuda):
        labels.update(
            {
                "cuda.runtime-version.major": cuda[0],
                "cuda.runtime-version.minor": cuda[1],
                "cuda.runtime-version.full": node.cuda_driver_version,
                "cuda.runtime.major": cuda[0],
                "cuda.runtime.minor": cuda[1],
            }
        )
    return labels


def _product_group(gpus: Iterable[Gpu]) -> list[Gpu]:
    """The GPUs of the most common product name (ties: the one with the lowest index).

    GFD labels one product per node; on a mixed node it picks one of the names at random."""
    ordered = sorted(gpus, key=lambda g: g.index)
    counts = Counter(g.name for g in ordered)  # in order of first appearance: max keeps the first
    name = max(counts, key=counts.__getitem__)
    return [g for g in ordered if g.name == name]


def _resource(
    prefix: str, product: str, count: int, sharing: LabelSharing | None
) -> dict[str, str]:
    """GFD's base labels of one resource: product, count, replicas, sharing-strategy.
    ``sharing`` None: sharing does not apply (MIG-enabled GPUs), so replicas 0."""
    replicas, strategy = 0, "none"
    if sharing is not None:
        replicas = sharing.replicas
        if sharing.shared:
            strategy = sharing.strategy
            if not sharing.renamed:
                product = _fit(f"{product}-SHARED")
    return {
        f"{prefix}.product": product,
        f"{prefix}.count": str(count),
        f"{prefix}.replicas": str(replicas),
        f"{prefix}.sharing-strategy": strategy,
    }


def _gpu_labels(node: Node, sharing: LabelSharing) -> dict[str, str]:
    group = _product_group(node.gpus)
    gpu = group[0]
    # GFD: GPUs with MIG enabled are labelled without sharing, whole ones with it
    labels = _resource(
        "gpu",
        product_value(gpu.name),
        len(group),
        None if all(g.mig_enabled for g in group) else sharing,
    )
    if gpu.memory_bytes:
        labels["gpu.memory"] = _mib(gpu.memory_bytes)
    major, minor = _major_minor(gpu.cuda_compute_capability)
    if major:
        labels["gpu.family"] = family(gpu.cuda_compute_capability)
        labels["gpu.compute.major"] = str(major)
        labels["gpu.compute.minor"] = str(minor)
    return labels


def _single_labels(node: Node) -> dict[str, str]:
    """``mig.strategy=single``: the ``gpu.*`` labels describe the MIG devices, when every GPU is
    MIG-enabled, none empty, all of one profile; else GFD's ``-MIG-INVALID`` labels."""
    enabled = [g for g in sorted(node.gpus, key=lambda g: g.index) if g.mig_enabled]
    if not enabled:
        return {}
    migs = [m for g in enabled for m in g.mig_devices]
    profiles = {m.profile for m in migs}
    mixed_modes = len(enabled) != len(node.gpus)
    if mixed_modes or any(not g.mig_devices for g in enabled) or len(profiles) != 1:
        return {
            "gpu.product": product_value(enabled[0].name, "MIG", "INVALID"),
            "gpu.count": "0",
            "gpu.replicas": "0",
            "gpu.memory": "0",
        }
    labels = _resource(
        "gpu", product_value(enabled[0].name, "MIG", migs[0].profile), len(migs), NOT_SHARED
    )
    labels["gpu.memory"] = _mib(migs[0].memory_bytes)
    return labels


def _mixed_labels(node: Node) -> dict[str, str]:
    """``mig.strategy=mixed``: one set of labels per MIG profile, ``mig-<profile>.*``."""
    labels: dict[str, str] = {}
    seen: dict[str, tuple[Gpu, int]] = {}
    for gpu in sorted(node.gpus, key=lambda g: g.index):
        for mig in gpu.mig_devices if gpu.mig_enabled else ():
            parent, count = seen.get(mig.profile, (gpu, 0))
            seen[mig.profile] = (parent, count + 1)
    for profile, (parent, count) in sorted(seen.items()):
        prefix = f"mig-{profile}"
        labels.update(
            _resource(prefix, product_value(parent.name, "MIG", profile), count, NOT_SHARED)
        )
        memory = next(m.memory_bytes for m in parent.mig_devices if m.profile == profile)
        labels[f"{prefix}.memory"] = _mib(memory)
    return labels


def _mig_capable(node: Node) -> bool:
    """Whether some GPU can run MIG: one has it enabled, or is of a MIG family (GA100, Hopper,
    Blackwell data-centre parts: compute capability 8.0, 9.0 or 10.x). NVML is not asked."""
    return any(
        g.mig_enabled or g.cuda_compute_capability in ("8.0", "9.0", "10.0", "10.3")
        for g in node.gpus
    )


def _own_labels(node: Node) -> dict[str, str]:
    """cdigen's labels: what GFD has no label for."""
    labels = {
        "gpu.healthy": str(sum(1 for g in node.gpus if g.usable)),
        "nvlink.domain-size": str(nvlink_domain_size(node)),
    }
    numa = [g.numa_node for g in node.gpus]
    if numa and all(n is not None for n in numa):
        per_node = Counter(numa)
        labels["numa.gpu-nodes"] = str(len(per_node))
        labels["numa.max-gpus"] = str(max(per_node.values()))
    return labels


def nvlink_domain_size(node: Node) -> int:
    """The most GPUs that reach each other over NVLink (possibly through other GPUs), as in
    the DRA attribute ``nvlinkDomain``; 0 when no GPU has an NVLink."""
    parent: dict[int, int] = {}

    def root(i: int) -> int:
        while parent.setdefault(i, i) != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for link in node.links:
        if link.nvlinks > 0:
            parent[root(link.a)] = root(link.b)
    sizes = Counter(root(i) for i in list(parent))
    return max(sizes.values(), default=0)


def node_labels(
    node: Node,
    *,
    mig_strategy: str = DEVICE_PLUGIN_MIG_STRATEGY,
    sharing: LabelSharing = NOT_SHARED,
) -> dict[str, str]:
    """Every label for ``node``, full keys, sorted; none for a node without GPUs (as GFD).

    ``mig_strategy`` and ``sharing`` are the device plugin's (they change ``gpu.*`` as they
    change what it advertises)."""
    if mig_strategy not in MIG_STRATEGIES:
        raise ValueError(f"unknown MIG strategy {mig_strategy!r}")
    if not node.gpus:
        return {}
    mps_capable = sharing.shared and sharing.strategy == "mps"
    mps_capable = mps_capable and not any(g.mig_enabled for g in node.gpus)
    nvidia: dict[str, str] = {
        "gpu.present": "true",
        "mig.capable": str(_mig_capable(node)).lower(),
        "mps.capable": str(mps_capable).lower(),
        **_version_labels(node),
        **_gpu_labels(node, sharing),
    }
    if mig_strategy != "none":
        nvidia["mig.strategy"] = mig_strategy
        nvidia.update(_single_labels(node) if mig_strategy == "single" else _mixed_labels(node))
    elif any(g.mig_enabled for g in node.gpus):
        # GFD leaves it out under none; on a node with MIG enabled that hides why its MIG GPUs
        # are not advertised, so say it (a selector for single or mixed still does not match)
        nvidia["mig.strategy"] = "none"
    labels = {NVIDIA + k: v for k, v in nvidia.items()}
    labels.update({OURS + k: v for k, v in _own_labels(node).items()})
    return dict(sorted(labels.items()))


def label_problems(labels: Mapping[str, str]) -> list[str]:
    """What makes any of ``labels`` invalid for Kubernetes (empty: all valid)."""
    problems = []
    for key, value in labels.items():
        prefix, _, name = key.rpartition("/")
        if not prefix or not LABEL_NAME.match(name):
            problems.append(f"{key}: not a valid label key")
        if not LABEL_VALUE.match(value):
            problems.append(f"{key}={value!r}: not a valid label value")
    return problems


def labels_text(labels: Mapping[str, str]) -> str:
    """``key=value`` lines, one per label, in key order."""
    return "".join(f"{k}={v}\n" for k, v in sorted(labels.items()))


FEATURE_FILE_HEADER = (
    "# Node labels of cdigen (docs/labels.md), for Node Feature Discovery's local source.\n"
    "# Rewritten by the plugin whenever the node changes: do not edit.\n"
)


def feature_file_text(labels: Mapping[str, str]) -> str:
    """The NFD feature file for ``labels``: comment lines, then ``key=value`` lines."""
    return FEATURE_FILE_HEADER + labels_text(labels)

"""Import the text of ``nvidia-smi topo -m`` as a :class:`Node`.

The text is parsed by :mod:`cdigen.discover.topo_matrix`. What `topo -m` does not show (product
name, memory, UUIDs, bus IDs) is filled with options or deterministic made-up values.
"""

from __future__ import annotations

import uuid as uuidlib
from dataclasses import dataclass, replace
from pathlib import Path

from cdigen.discover.topo_matrix import TopoMatrix, matrix_links, parse_topo
from cdigen.fileio import read_text
from cdigen.model import Gpu, Node
from cdigen.nodefile import check_node

from .products import PRODUCTS, product

_UUID_NAMESPACE = uuidlib.UUID("6d1c5f0e-2f4b-4a57-9a43-1f0c9a1e7c11")


def made_up_uuid(prefix: str, seed: str) -> str:
    """A deterministic, well-formed made-up UUID such as ``GPU-1b4e28ba-2fa1-...``."""
    return f"{prefix}-{uuidlib.uuid5(_UUID_NAMESPACE, seed)}"


def made_up_uuids(prefix: str, seed: str, count: int) -> list[str]:
    """``made_up_uuid(prefix, f"{seed}/{i}")`` for i < ``count``, hashing ``seed`` once: a seed
    made of the whole matrix is a megabyte at 1,000 GPUs, and hashing it per GPU was cubic."""
    import hashlib

    common = hashlib.sha1(_UUID_NAMESPACE.bytes + seed.encode(), usedforsecurity=False)
    out = []
    for i in range(count):
        digest = common.copy()
        digest.update(f"/{i}".encode())
        out.append(f"{prefix}-{uuidlib.UUID(bytes=digest.digest()[:16], version=5)}")
    return out


_BUSES = 0xE0  # buses 0x07..0xe6 of a PCI domain, as GPUs sit on a real one


def made_up_bus_id(index: int, count: int) -> str:
    """A plausible PCI bus ID for GPU ``index`` of ``count``: spread over the bus range of
    domain 0, and over further domains when there are more GPUs than buses."""
    step = max(1, _BUSES // max(count, 1))
    domain, bus = divmod(index * step, _BUSES)
    return f"{domain:04x}:{0x07 + bus:02x}:00.0"


@dataclass(frozen=True)
class NodeFacts:
    """What ``topo -m`` does not show, given by the user (``cdigen topo import`` options)."""

    name: str = ""
    gpu_name: str = ""
    memory_bytes: int | None = None
    driver_version: str = ""
    cuda_driver_version: str = ""


def matrix_to_node(matrix: TopoMatrix, facts: NodeFacts = NodeFacts()) -> Node:
    """A Node from a parsed matrix; unknown facts made up deterministically from the name."""
    name, gpu_name, memory_bytes = facts.name, facts.gpu_name, facts.memory_bytes
    known = product(gpu_name) if gpu_name else None
    count = len(matrix.labels)
    seed = name or "|".join(" ".join(r) for r in matrix.labels)
    uuids = made_up_uuids("GPU", seed, count)
    gpus = tuple(
        Gpu(
            index=i,
            minor=i,
            uuid=uuids[i],
            name=gpu_name or "unknown (imported from nvidia-smi topo -m)",
            architecture=known.architecture if known else "",
            cuda_compute_capability=known.cuda_compute_capability if known else "",
            memory_bytes=memory_bytes
            if memory_bytes is not None
            else (known.memory_bytes if known else 0),
            pci_bus_id=made_up_bus_id(i, count),
            numa_node=matrix.numa_nodes[i],
            brand=known.brand if known else "",
        )
        for i in range(count)
    )
    notes: tuple[str, ...] = ()
    if matrix.numa_inferred:
        notes = (
            "no NUMA Affinity column: NUMA nodes inferred from distinct CPU affinity sets "
            f"({', '.join(f'GPU{i}={n}' for i, n in enumerate(matrix.numa_nodes))})",
        )
    return Node(
        gpus=gpus,
        links=matrix_links(matrix),
        driver_version=facts.driver_version,
        cuda_driver_version=facts.cuda_driver_version,
        name=name,
        notes=notes,
    )


def import_topo_text(text: str, *, where: str, facts: NodeFacts = NodeFacts()) -> Node:
    """Parse ``topo -m`` text read from ``where`` and build a checked Node."""
    return import_topo_warned(text, where=where, facts=facts)[0]


def import_topo_warned(
    text: str, *, where: str, facts: NodeFacts = NodeFacts()
) -> tuple[Node, tuple[str, ...]]:
    """:func:`import_topo_text`, and what the user should know about the result: GPUs whose
    NUMA node could not be read, memory that is unknown."""
    matrix = parse_topo(text, where=where)
    node = matrix_to_node(matrix, facts)
    check_node(node, where=where)
    return node, (*matrix.warnings, *_memory_warnings(facts))


def _memory_warnings(facts: NodeFacts) -> tuple[str, ...]:
    """A warning when the GPUs' memory is unknown: ``memoryBytes: 0`` leaves them no memory
    slices and nothing for a memory selector to match."""
    if facts.memory_bytes is not None or (facts.gpu_name and product(facts.gpu_name)):
        return ()
    if facts.gpu_name:
        what = f"cdigen does not know the GPU {facts.gpu_name!r}{_near_product(facts.gpu_name)}"
    else:
        what = "no --gpu-name was given"
    return (
        f"{what}: the GPUs' memory is unknown and written as memoryBytes: 0 (no memory slices, "
        "no memory for policies and DRA to match); give --memory SIZE (e.g. --memory 24GiB), "
        f"or --gpu-name with one of: {', '.join(p.name for p in PRODUCTS)}",
    )


def _near_product(name: str) -> str:
    """``" (did you mean 'NVIDIA GeForce RTX 4090'?)"`` for a name close to a known one."""
    import difflib

    names = {p.name.lower(): p.name for p in PRODUCTS}
    wanted = name.strip().lower()
    near = [n for n in names if wanted and wanted in n] or difflib.get_close_matches(
        wanted, list(names), n=1, cutoff=0.6
    )
    return f" (did you mean {names[near[0]]!r}?)" if near else ""


def import_topo(path: str | Path, facts: NodeFacts = NodeFacts()) -> Node:
    """Read a saved ``nvidia-smi topo -m`` output and build a Node (named after the file)."""
    if not facts.name:
        facts = replace(facts, name=Path(path).stem)
    return import_topo_text(read_text(path, what="topo -m text"), where=str(path), facts=facts)

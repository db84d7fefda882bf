"""Node files: the YAML/JSON form of :class:`cdigen.model.Node` (camelCase keys), in and out.

Reading checks the JSON Schema (``schemas/node.schema.json``) first, then what a schema cannot
say: unique GPU indexes, UUIDs and minors, links that name known GPUs and two different ones.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, NotRequired, TypedDict, cast

from cdigen.errors import InputError
from cdigen.fileio import dump_document, not_a_mapping, read_document
from cdigen.model import API_VERSION, NODE_KIND, Gpu, Link, MigDevice, Node, PcieLevel
from cdigen.schemas import validate

SCHEMA = "node"

_BUS_ID = re.compile(r"^(?:([0-9a-fA-F]{4,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")


class MigDeviceDoc(TypedDict):
    """A MIG device as written in a node file."""

    uuid: str
    profile: str
    giId: int
    ciId: int
    memoryBytes: int
    capMinors: list[int]


class GpuDoc(TypedDict):
    """A GPU as written in a node file."""

    index: int
    minor: int
    uuid: str
    name: str
    brand: str
    architecture: str
    cudaComputeCapability: str
    memoryBytes: int
    pciBusId: str
    numaNode: int | None
    migEnabled: bool
    migDevices: list[MigDeviceDoc]
    healthy: NotRequired[bool]
    error: NotRequired[str]


class LinkDoc(TypedDict):
    """A GPU pair as written in a node file."""

    a: int
    b: int
    pcie: PcieLevel | None
    nvlinks: int


class NodeDoc(TypedDict):
    """The whole node file."""

    apiVersion: str
    kind: str
    name: NotRequired[str]
    discoveredBy: NotRequired[str]
    driverVersion: str
    cudaDriverVersion: str
    gpus: list[GpuDoc]
    links: list[LinkDoc]


def normalize_bus_id(bus_id: str) -> str:
    """A PCI bus ID in the sysfs form ``0000:07:00.0`` (NVML writes ``00000000:07:00.0``;
    ``07:00.0`` means domain 0).

    Anything that is not a bus ID comes back unchanged (the schema reports it).
    """
    match = _BUS_ID.match(bus_id.strip())
    if not match:
        return bus_id
    domain, bus, device, function = match.groups()
    return f"{int(domain or '0', 16):04x}:{bus.lower()}:{device.lower()}.{function}"


def node_to_dict(node: Node) -> NodeDoc:
    """The node-file document for ``node`` (camelCase keys, stable order)."""
    doc: NodeDoc = {"apiVersion": API_VERSION, "kind": NODE_KIND}  # type: ignore[typeddict-item]
    if node.name:
        doc["name"] = node.name
    if node.discovered_by:
        doc["discoveredBy"] = node.discovered_by
    doc["driverVersion"] = node.driver_version
    doc["cudaDriverVersion"] = node.cuda_driver_version
    doc["gpus"] = [_gpu_to_dict(g) for g in node.gpus]
    doc["links"] = [
        {"a": k.a, "b": k.b, "pcie": k.pcie, "nvlinks": k.nvlinks}
        for k in sorted(node.links, key=lambda k: (k.a, k.b))
    ]
    return doc


def _gpu_to_dict(gpu: Gpu) -> GpuDoc:
    doc: GpuDoc = {
        "index": gpu.index,
        "minor": gpu.minor,
        "uuid": gpu.uuid,
        "name": gpu.name,
        "brand": gpu.brand,
        "architecture": gpu.architecture,
        "cudaComputeCapability": gpu.cuda_compute_capability,
        "memoryBytes": gpu.memory_bytes,
        "pciBusId": gpu.pci_bus_id,
        "numaNode": gpu.numa_node,
        "migEnabled": gpu.mig_enabled,
        "migDevices": [
            {
                "uuid": m.uuid,
                "profile": m.profile,
                "giId": m.gi_id,
                "ciId": m.ci_id,
                "memoryBytes": m.memory_bytes,
                "capMinors": list(m.cap_minors),
            }
            for m in gpu.mig_devices
        ],
    }
    if not gpu.healthy:
        doc["healthy"] = False
    if gpu.error is not None:
        doc["error"] = gpu.error
    return doc


def dump_node(node: Node, fmt: str = "yaml") -> str:
    """``node`` as node-file text, ``yaml`` or ``json``; one line per link.

    The links are written here, not by the YAML or JSON library: a node has one per GPU pair,
    half a million at 1,000 GPUs (an imported matrix), and PyYAML's representer spent most of
    a minute on them. Their values are numbers, null and the PCIe level names, which need no
    quoting in either format.
    """
    doc = node_to_dict(node)
    links = doc.pop("links")  # type: ignore[misc]
    if fmt == "json":
        head = dump_document(doc, "json").rstrip()
        assert head.endswith("\n}")
        rows = ",".join(f"\n    {_json_link(k)}" for k in links)
        return f'{head[:-2]},\n  "links": [{rows}{chr(10) + "  " if links else ""}]\n}}\n'
    rows = "".join(
        f"\n- {{a: {k['a']}, b: {k['b']}, pcie: {k['pcie'] or 'null'}, nvlinks: {k['nvlinks']}}}"
        for k in links
    )
    return f"{dump_document(doc, fmt)}links:{rows or ' []'}\n"


def _json_link(link: LinkDoc) -> str:
    pcie = f'"{link["pcie"]}"' if link["pcie"] else "null"
    return f'{{"a": {link["a"]}, "b": {link["b"]}, "pcie": {pcie}, "nvlinks": {link["nvlinks"]}}}'


def node_from_dict(doc: Any, *, where: str) -> Node:
    """Build a :class:`Node` from a parsed node file; InputError/SchemaError naming ``where``."""
    validate(doc, SCHEMA, where=where)
    data = cast(dict[str, Any], _whole_numbers(doc))
    gpus = tuple(_gpu_from_dict(g) for g in data["gpus"])
    links = tuple(
        Link(
            a=min(k["a"], k["b"]),
            b=max(k["a"], k["b"]),
            pcie=k.get("pcie"),
            nvlinks=k.get("nvlinks", 0),
        )
        for k in data.get("links", [])
    )
    node = Node(
        gpus=gpus,
        links=links,
        driver_version=data.get("driverVersion", ""),
        cuda_driver_version=data.get("cudaDriverVersion", ""),
        name=data.get("name", ""),
        discovered_by=data.get("discoveredBy", ""),
    )
    check_node(node, where=where, raw_links=data.get("links", []))
    return node


def _whole_numbers(value: Any) -> Any:
    """``value`` with floats made ints: JSON Schema counts ``8.0e10`` as an integer, and every
    number in a node file is one (the schema checked that, and the range)."""
    if isinstance(value, float):
        return int(value)
    if isinstance(value, dict):
        return {k: _whole_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_whole_numbers(v) for v in value]
    return value


def _gpu_from_dict(g: dict[str, Any]) -> Gpu:
    return Gpu(
        index=g["index"],
        minor=g["minor"],
        uuid=g["uuid"],
        name=g["name"],
        architecture=g["architecture"],
        cuda_compute_capability=g["cudaComputeCapability"],
        memory_bytes=g["memoryBytes"],
        pci_bus_id=normalize_bus_id(g["pciBusId"]),
        numa_node=g.get("numaNode"),
        brand=g.get("brand", ""),
        mig_enabled=g.get("migEnabled", False),
        mig_devices=tuple(
            MigDevice(
                uuid=m["uuid"],
                profile=m["profile"],
                gi_id=m["giId"],
                ci_id=m["ciId"],
                memory_bytes=m["memoryBytes"],
                cap_minors=tuple(m.get("capMinors", ())),
            )
            for m in g.get("migDevices", [])
        ),
        healthy=g.get("healthy", True),
        error=g.get("error"),
    )


def check_node(node: Node, *, where: str, raw_links: list[dict[str, Any]] | None = None) -> None:
    """Raise InputError for what the schema cannot catch (duplicates, dangling links)."""
    _check_unique_ids(node, where)
    _check_gpus(node, where)
    _check_links(node, where, raw_links)


def _check_unique_ids(node: Node, where: str) -> None:
    """No two GPUs with one index, UUID or PCI bus ID (unknown ones aside)."""
    for attr, label in (("index", "index"), ("uuid", "uuid"), ("pci_bus_id", "pciBusId")):
        seen: dict[object, int] = {}
        for pos, gpu in enumerate(node.gpus):
            value = getattr(gpu, attr)
            if value in ("", -1):
                continue
            if value in seen:
                raise InputError(
                    f"gpus[{pos}].{label}: {value} is already used by gpus[{seen[value]}]",
                    where=where,
                    hint=f"every GPU needs its own {label}",
                )
            seen[value] = pos


def _check_gpus(node: Node, where: str) -> None:
    """Each GPU: its own minor, a minor and bus ID unless it has an error, MIG devices only
    with MIG enabled, and MIG UUIDs used once in the node."""
    minors: dict[int, int] = {}
    mig_uuids: dict[str, str] = {}
    for pos, gpu in enumerate(node.gpus):
        if gpu.minor >= 0 and gpu.minor in minors:
            raise InputError(
                f"gpus[{pos}].minor: {gpu.minor} is already used by gpus[{minors[gpu.minor]}]",
                where=where,
                hint="every GPU has its own /dev/nvidia<minor>",
            )
        minors[gpu.minor] = pos
        if gpu.error is None:
            for label, missing in (
                ("minor", gpu.minor < 0),
                ("pciBusId", not gpu.pci_bus_id),
            ):
                if missing:
                    raise InputError(
                        f"gpus[{pos}].{label}: unknown (allowed only on a GPU with an error)",
                        where=where,
                    )
        if gpu.mig_devices and not gpu.mig_enabled:
            raise InputError(
                f"gpus[{pos}].migDevices: GPU {gpu.index} has MIG devices but migEnabled is false",
                where=where,
                hint="set migEnabled: true or remove the MIG devices",
            )
        for mpos, mig in enumerate(gpu.mig_devices):
            path = f"gpus[{pos}].migDevices[{mpos}].uuid"
            if mig.uuid in mig_uuids:
                raise InputError(
                    f"{path}: {mig.uuid} is already used by {mig_uuids[mig.uuid]}", where=where
                )
            mig_uuids[mig.uuid] = path


def _check_links(node: Node, where: str, raw_links: list[dict[str, Any]] | None) -> None:
    """Each link joins two different known GPUs, and each pair once; ``raw_links`` (the file's
    own entries) name the ends as written."""
    indexes = {g.index for g in node.gpus}
    pairs: dict[tuple[int, int], int] = {}
    for pos, link in enumerate(node.links):
        raw = raw_links[pos] if raw_links is not None else {"a": link.a, "b": link.b}
        for end in ("a", "b"):
            if raw[end] not in indexes:
                raise InputError(
                    f"links[{pos}].{end}: no GPU has index {raw[end]}",
                    where=where,
                    hint=f"known indexes: {sorted(indexes)}",
                )
        if link.a == link.b:
            raise InputError(
                f"links[{pos}]: a link joins two different GPUs, both ends are {link.a}",
                where=where,
            )
        if (link.a, link.b) in pairs:
            raise InputError(
                f"links[{pos}]: GPUs {link.a} and {link.b} are already linked in "
                f"links[{pairs[(link.a, link.b)]}]",
                where=where,
                hint="give each pair once",
            )
        pairs[(link.a, link.b)] = pos


def load_node_file(path: str | Path) -> Node:
    """Read, check and build the node in the YAML/JSON file ``path``."""
    if not str(path).strip():
        raise InputError(
            f"the node source {str(path)!r} names no file",
            hint="give nvml, builtin:NAME or the path of a node file",
        )
    doc = read_document(path, what="node file")
    if not isinstance(doc, dict) or doc.get("kind") not in (None, NODE_KIND):
        why = f"kind: {doc.get('kind')}" if isinstance(doc, dict) else not_a_mapping(doc)
        raise InputError(
            f"not a node file ({why})",
            where=str(path),
            hint="a node file has 'apiVersion: cdigen/v1alpha1' and 'kind: Node'",
        )
    return node_from_dict(doc, where=str(path))

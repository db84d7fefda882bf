"""Import the text of ``nvidia-smi topo -m`` as a :class:`Node`.

What `topo -m` gives: the GPU-to-GPU matrix (``X``, ``NV#``, ``PIX``, ``PXB``, ``PHB``, ``NODE``,
``SYS``), and per GPU row its CPU affinity, NUMA affinity and GPU NUMA ID where the driver prints
them. NIC rows and columns, the legend and ``#`` lines are ignored. ``NV#`` means # NVLinks with
the PCIe level hidden, so such pairs get ``pcie: null``. What `topo -m` does not show (product
name, memory, UUIDs, bus IDs) is filled with options or deterministic made-up values.
"""

from __future__ import annotations

import re
import uuid as uuidlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from cdigen.errors import InputError
from cdigen.fileio import read_text
from cdigen.model import MAX_NUMA_NODE, MAX_NVLINKS, PCIE_LEVELS, Gpu, Link, Node, PcieLevel
from cdigen.nodefile import check_node

from .products import PRODUCTS, product

# ASCII digits only (``\\d`` and ``str.isdigit`` take ``²`` and other scripts' digits), and few.
_GPU = re.compile(r"^GPU([0-9]{1,5})$")
_NV = re.compile(r"^NV([0-9]+)$")
_CPU = "[0-9]{1,7}"
_CPU_LIST = re.compile(rf"^{_CPU}(-{_CPU})?(,{_CPU}(-{_CPU})?)*$")
_NUMA = re.compile(r"^[0-9]{1,4}$")
_LEGACY_LABELS: dict[str, PcieLevel] = {"SOC": "SYS"}  # pre-2017 drivers said SOC for SYS
# Trailing columns, as the header spells them (split on whitespace).
_TRAILING = (("CPU", "Affinity"), ("NUMA", "Affinity"), ("GPU", "NUMA", "ID"))
_TRAILING_NAMES = tuple(" ".join(words) for words in _TRAILING)
_TAB = 8  # terminals expand nvidia-smi's tabs to 8-column stops; pastes keep the spaces
_WORD = re.compile(r"\S+")
_UUID_NAMESPACE = uuidlib.UUID("6d1c5f0e-2f4b-4a57-9a43-1f0c9a1e7c11")


@dataclass(frozen=True)
class TopoMatrix:
    """The GPU part of one ``nvidia-smi topo -m`` output."""

    labels: tuple[tuple[str, ...], ...]  # labels[i][j] for GPUi/GPUj; "X" on the diagonal
    cpu_affinity: tuple[str | None, ...]
    numa_nodes: tuple[int | None, ...]
    numa_inferred: bool  # NUMA nodes come from distinct CPU affinity sets, not a NUMA column
    warnings: tuple[str, ...] = ()  # what could not be read, per GPU


def parse_topo(text: str, *, where: str) -> TopoMatrix:
    """Parse ``topo -m`` text; a one-line InputError naming ``where`` and the line if it is bad."""
    lines = [(n, line) for n, line in enumerate(text.splitlines(), 1)]
    content = [(n, line) for n, line in lines if line.strip() and not line.lstrip().startswith("#")]
    header_at = next((i for i, (_, line) in enumerate(content) if "GPU0" in line.split()), None)
    if header_at is None or _is_row(content, header_at):
        raise InputError(
            "no GPU columns found (expected a header line naming GPU0, GPU1, ...)",
            where=where,
            hint="give the output of 'nvidia-smi topo -m' as it was printed",
        )
    header_line_no, header_line = content[header_at]
    columns, trailing = _header_columns(header_line)
    starts = _header_starts(header_line)
    if starts is not None and len(starts) != 1 + len(columns) + len(trailing):
        starts = None
    gpu_columns = [c for c in columns if _GPU.match(c)]
    expected = [f"GPU{i}" for i in range(len(gpu_columns))]
    if columns[: len(gpu_columns)] != expected:
        raise InputError(
            f"line {header_line_no}: GPU columns must come first, in order: "
            f"{_clip(' '.join(expected))}",
            where=where,
        )
    rows: dict[int, tuple[int, list[str], bool]] = {}
    for line_no, line in content[header_at + 1 :]:
        first = line.split()[0]
        if first.rstrip(":").lower() in ("legend", "nic legend"):
            break
        match = _GPU.match(first)
        if not match:
            continue  # NIC rows and anything else nvidia-smi prints below the matrix
        index = int(match.group(1))
        if index in rows:
            raise InputError(f"line {line_no}: a second row for GPU{index}", where=where)
        cells, by_position = _row_cells(line, starts)
        rows[index] = (line_no, cells[1:], by_position)
    if not rows:
        raise InputError(
            "no GPU rows found below the header",
            where=where,
            hint="give the output of 'nvidia-smi topo -m' as it was printed",
        )
    missing = [f"GPU{i}" for i in range(len(gpu_columns)) if i not in rows]
    extra = sorted(i for i in rows if i >= len(gpu_columns))
    if missing:
        raise InputError(
            f"rows missing: the header names {len(gpu_columns)} GPUs but only {len(rows)} GPU "
            f"rows are present (missing: {_span(missing)})",
            where=where,
            hint="the paste looks cut off; capture the full 'nvidia-smi topo -m' output",
        )
    if extra:
        raise InputError(f"row GPU{extra[0]} has no column in the header", where=where)
    labels, cpus, numas, warnings = [], [], [], []
    for i in range(len(gpu_columns)):
        line_no, cells, by_position = rows[i]
        row_labels, cpu, numa = _parse_row(
            cells, columns, len(gpu_columns), trailing, where=f"{where}: line {line_no}"
        )
        unread = _unread_numa(cells[len(columns) :], trailing, by_position)
        if unread:
            cpu, numa = (cpu if by_position else None), None
            warnings.append(f"GPU{i} (line {line_no}): its NUMA node cannot be read: {unread}")
        if row_labels[i] != "X":
            raise InputError(
                f"line {line_no}: GPU{i} against itself should be X, found {row_labels[i]}",
                where=where,
            )
        others = [j for j, label in enumerate(row_labels[: len(gpu_columns)]) if label == "X"]
        if others != [i]:
            j = next(j for j in others if j != i)
            raise InputError(
                f"line {line_no}: GPU{i}/GPU{j} is X, which only a GPU against itself is",
                where=where,
                hint="give the link label nvidia-smi printed (NV#, PIX, PXB, PHB, NODE, SYS)",
            )
        labels.append(tuple(row_labels[: len(gpu_columns)]))
        cpus.append(cpu)
        numas.append(numa)
    for i, row in enumerate(labels):
        for j in range(i + 1, len(row)):
            if row[j] != labels[j][i]:
                raise InputError(
                    f"the matrix is not symmetric: GPU{i}/GPU{j} is {row[j]} "
                    f"but GPU{j}/GPU{i} is {labels[j][i]}",
                    where=where,
                )
    inferred = False
    if "NUMA Affinity" not in trailing and all(c is not None for c in cpus):
        order = sorted(set(cpus), key=lambda c: _first_cpu(c or ""))
        numas = [order.index(c) for c in cpus]
        inferred = True
    return TopoMatrix(tuple(labels), tuple(cpus), tuple(numas), inferred, tuple(warnings))


def _unread_numa(tail: list[str], trailing: list[str], by_position: bool) -> str:
    """Why a GPU row's NUMA Affinity cannot be read (its cells after the matrix, ``tail``),
    or "" if it can be or the header has no such column."""
    if "NUMA Affinity" not in trailing:
        return ""
    if not by_position and len(tail) < len(trailing):
        return (
            f"the row has {len(tail)} cell{'' if len(tail) == 1 else 's'} after the matrix "
            "where the header names "
            f"{len(trailing)} ({', '.join(trailing)}), and the text has neither tabs nor "
            "columns aligned under the header to tell which cell is blank"
        )
    at = trailing.index("NUMA Affinity")
    if at >= len(tail) or not tail[at]:
        return "its NUMA Affinity cell is blank"
    return ""


def _is_row(content: list[tuple[int, str]], at: int) -> bool:
    tokens = content[at][1].split()
    return len(tokens) > 1 and tokens[1] == "X"


def _span(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else f"{names[0]}..{names[-1]}"


def _first_cpu(cpus: str) -> int:
    return int(re.split(r"[-,]", cpus)[0])


def _clip(text: str, limit: int = 40) -> str:
    """``text`` cut to ``limit`` characters for an error message."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _cells(line: str) -> list[str]:
    """The cells of one line, empty ones included, read by position as nvidia-smi aligns them.

    nvidia-smi ends each cell with a tab, so an empty cell (a blank CPU Affinity under a Slurm
    or cgroup CPU limit) is two tabs in a row. A terminal paste has the tabs expanded to
    8-column stops; the stops give the cells back. Text aligned neither way is split on
    whitespace (no empty cells can be told apart there).
    """
    if "\t" in line:
        return [cell.strip() for cell in line.rstrip("\r\n").split("\t")]
    return _tab_stop_cells(line) or line.split()


def _row_cells(line: str, starts: list[int] | None) -> tuple[list[str], bool]:
    """The cells of one row, and whether they were read by position (so that a blank cell is
    an empty string, not missing): by tabs, under the header's columns, or at 8-column tab
    stops; else split on whitespace."""
    if "\t" in line:
        return _cells(line), True
    cells = _cells_under(line, starts) if starts else None
    if cells is None:
        cells = _tab_stop_cells(line)
    return (cells, True) if cells is not None else (line.split(), False)


def _header_starts(line: str) -> list[int] | None:
    """Where each column of a header line without tabs starts (the corner, position 0,
    first), multi-word names ("CPU Affinity") as one; None for a line with tabs, or one with
    no corner (the rows' GPU names would stand under its first column)."""
    if "\t" in line or not line[:1].isspace():
        return None
    starts = [0]
    cell, end = "", -2
    for word in _WORD.finditer(line):
        joined = f"{cell} {word.group()}"
        if word.start() == end + 1 and _is_name_start(joined):
            cell = joined
        else:
            starts.append(word.start())
            cell = word.group()
        end = word.end()
    return starts


def _cells_under(line: str, starts: list[int]) -> list[str] | None:
    """The cells of a row read under the header's columns (each word starting where a column
    does, give or take one for nvidia-smi's " X "), blanks as ""; None if it is not aligned so."""
    cells = [""] * len(starts)
    at = 0
    for word in _WORD.finditer(line):
        while at < len(starts) and starts[at] < word.start() - 1:
            at += 1
        if at == len(starts) or abs(starts[at] - word.start()) > 1 or cells[at]:
            return None
        cells[at] = word.group()
    while len(cells) > 1 and not cells[-1]:
        cells.pop()
    return cells


def _tab_stop_cells(line: str) -> list[str] | None:
    """The cells of a line whose tabs were expanded to 8-column stops, or None if it is not one."""
    cells: list[str] = []
    next_stop = 0  # where the cell after the current one starts
    end = 0  # where the current cell's text ends
    for word in _WORD.finditer(line):
        start = word.start()
        joined = f"{cells[-1]} {word.group()}" if cells else ""
        if start == end + 1 and start < next_stop and _is_name_start(joined):
            cells[-1] = joined  # a cell of several words: "CPU Affinity"
        elif start >= next_stop and start % _TAB in (0, 1):  # 1: nvidia-smi's " X "
            cells += [""] * ((start - next_stop) // _TAB)
            cells.append(word.group())
        else:
            return None
        end = word.end()
        next_stop = (end // _TAB + 1) * _TAB
    return cells


def _is_name_start(text: str) -> bool:
    return any(name.startswith(text) for name in _TRAILING_NAMES)


def _header_columns(line: str) -> tuple[list[str], list[str]]:
    """Device columns, then the trailing column names (multi-word names as one)."""
    if "\t" not in line:  # no header cell is blank: a tab-stop reading could only invent some
        return _split_header(line.split())
    cells = _cells(line)
    if cells and cells[0] == "":
        cells = cells[1:]  # the empty corner above the row labels
    if any(" " in cell for cell in cells) or any(c in _TRAILING_NAMES for c in cells):
        at = next((i for i, c in enumerate(cells) if c in _TRAILING_NAMES), len(cells))
        return cells[:at], cells[at:]
    return _split_header(line.split())


def _split_header(tokens: list[str]) -> tuple[list[str], list[str]]:
    """Device columns, then the trailing column names (multi-word names joined)."""
    columns: list[str] = []
    trailing: list[str] = []
    i = 0
    while i < len(tokens):
        for words in _TRAILING:
            if tuple(tokens[i : i + len(words)]) == words:
                trailing.append(" ".join(words))
                i += len(words)
                break
        else:
            if trailing:
                trailing.append(tokens[i])
            else:
                columns.append(tokens[i])
            i += 1
    return columns, trailing


def _parse_row(
    cells: list[str], columns: list[str], gpu_count: int, trailing: list[str], *, where: str
) -> tuple[list[str], str | None, int | None]:
    if len(cells) < len(columns):
        raise InputError(
            f"the row has {len(cells)} cells but the header names {len(columns)} devices",
            where=where,
            hint="the paste looks cut off",
        )
    row = cells[: len(columns)]
    for col, label in zip(columns[:gpu_count], row, strict=False):
        if label not in _GOOD_LABELS:
            _check_label(label, col, where=where)
    row = [_LEGACY_LABELS.get(label, label) for label in row]
    tail = dict(zip(trailing, cells[len(columns) :], strict=False))
    cpu = tail.get("CPU Affinity") or None  # empty under a Slurm or cgroup CPU limit
    if cpu is not None and cpu != "N/A" and not _CPU_LIST.match(cpu):
        raise InputError(
            f"CPU Affinity {_clip(cpu)!r} is not a CPU list like 0-15,32-47", where=where
        )
    numa_text = tail.get("NUMA Affinity") or None
    numa: int | None = None
    if numa_text is not None and numa_text != "N/A":
        if not _NUMA.match(numa_text) or int(numa_text) > MAX_NUMA_NODE:
            raise InputError(
                f"NUMA Affinity {_clip(numa_text)!r} is not a NUMA node number "
                f"(0 to {MAX_NUMA_NODE})",
                where=where,
            )
        numa = int(numa_text)
    return row, (None if cpu in (None, "N/A") else cpu), numa


_GOOD_LABELS = {"X", *PCIE_LEVELS, "SOC", *(f"NV{n}" for n in range(1, MAX_NVLINKS + 1))}


def _check_label(label: str, col: str, *, where: str) -> None:
    """InputError for a matrix cell that is no link label (the GPU columns of one row)."""
    nv = _NV.match(label)
    if nv and (len(nv.group(1)) > 2 or int(nv.group(1)) > MAX_NVLINKS):
        raise InputError(
            f"column {col}: {_clip(label)} is more NVLinks than two GPUs can share "
            f"(at most NV{MAX_NVLINKS})",
            where=where,
        )
    if not nv:
        raise InputError(
            f"column {col}: unknown link label {_clip(label)!r}",
            where=where,
            hint="expected X, NV#, PIX, PXB, PHB, NODE or SYS",
        )


def matrix_links(matrix: TopoMatrix) -> tuple[Link, ...]:
    """One link per GPU pair: ``NV#`` gives # NVLinks (PCIe unknown), a PCIe label its level."""
    kinds: dict[str, tuple[PcieLevel | None, int]] = {}
    for row in matrix.labels:
        for label in row:
            if label not in kinds and label != "X":
                nv = _NV.match(label)
                kinds[label] = (None, int(nv.group(1))) if nv else (_pcie(label), 0)
    return tuple(
        Link(i, j, *kinds[row[j]])
        for i, row in enumerate(matrix.labels)
        for j in range(i + 1, len(row))
    )


def _pcie(label: str) -> PcieLevel:
    for level in PCIE_LEVELS:
        if level == label:
            return level
    raise ValueError(label)


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

"""Parsing the text of ``nvidia-smi topo -m`` into its GPU matrix, and the links it shows.

What `topo -m` gives: the GPU-to-GPU matrix (``X``, ``NV#``, ``PIX``, ``PXB``, ``PHB``, ``NODE``,
``SYS``), and per GPU row its CPU affinity, NUMA affinity and GPU NUMA ID where the driver prints
them. NIC rows and columns, the legend and ``#`` lines are ignored. ``NV#`` means # NVLinks with
the PCIe level hidden, so such pairs get ``pcie: null``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from cdigen.discover.topo_cells import header_columns, header_starts, row_cells
from cdigen.errors import InputError
from cdigen.model import MAX_NUMA_NODE, MAX_NVLINKS, PCIE_LEVELS, Link, PcieLevel

# ASCII digits only (``\\d`` and ``str.isdigit`` take ``²`` and other scripts' digits), and few.
_GPU = re.compile(r"^GPU([0-9]{1,5})$")
_NV = re.compile(r"^NV([0-9]+)$")
_CPU = "[0-9]{1,7}"
_CPU_LIST = re.compile(rf"^{_CPU}(-{_CPU})?(,{_CPU}(-{_CPU})?)*$")
_NUMA = re.compile(r"^[0-9]{1,4}$")
_LEGACY_LABELS: dict[str, PcieLevel] = {"SOC": "SYS"}  # pre-2017 drivers said SOC for SYS


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
    columns, trailing = header_columns(header_line)
    starts = header_starts(header_line)
    if starts is not None and len(starts) != 1 + len(columns) + len(trailing):
        starts = None
    gpu_count = _gpu_column_count(columns, header_line_no, where)
    rows = _gpu_rows(content[header_at + 1 :], starts, gpu_count, where)
    labels, cpus, numas, warnings = [], [], [], []
    for i in range(gpu_count):
        row_labels, cpu, numa, warning = _read_gpu_row(
            i, rows[i], columns, gpu_count, trailing, where
        )
        labels.append(row_labels)
        cpus.append(cpu)
        numas.append(numa)
        warnings += [warning] if warning else []
    _check_symmetric(labels, where)
    inferred = False
    if "NUMA Affinity" not in trailing and all(c is not None for c in cpus):
        order = sorted(set(cpus), key=lambda c: _first_cpu(c or ""))
        numas = [order.index(c) for c in cpus]
        inferred = True
    return TopoMatrix(tuple(labels), tuple(cpus), tuple(numas), inferred, tuple(warnings))


_Row = tuple[int, list[str], bool]  # line number, cells after the row's name, read by position


def _gpu_column_count(columns: list[str], line_no: int, where: str) -> int:
    """How many GPU columns the header names; InputError unless they come first, in order."""
    gpu_columns = [c for c in columns if _GPU.match(c)]
    expected = [f"GPU{i}" for i in range(len(gpu_columns))]
    if columns[: len(gpu_columns)] != expected:
        raise InputError(
            f"line {line_no}: GPU columns must come first, in order: {_clip(' '.join(expected))}",
            where=where,
        )
    return len(gpu_columns)


def _gpu_rows(
    content: list[tuple[int, str]], starts: list[int] | None, gpu_count: int, where: str
) -> dict[int, _Row]:
    """The GPU rows below the header, up to the legend: one per GPU column, none more."""
    rows: dict[int, _Row] = {}
    for line_no, line in content:
        first = line.split()[0]
        if first.rstrip(":").lower() in ("legend", "nic legend"):
            break
        match = _GPU.match(first)
        if not match:
            continue  # NIC rows and anything else nvidia-smi prints below the matrix
        index = int(match.group(1))
        if index in rows:
            raise InputError(f"line {line_no}: a second row for GPU{index}", where=where)
        cells, by_position = row_cells(line, starts)
        rows[index] = (line_no, cells[1:], by_position)
    if not rows:
        raise InputError(
            "no GPU rows found below the header",
            where=where,
            hint="give the output of 'nvidia-smi topo -m' as it was printed",
        )
    missing = [f"GPU{i}" for i in range(gpu_count) if i not in rows]
    extra = sorted(i for i in rows if i >= gpu_count)
    if missing:
        raise InputError(
            f"rows missing: the header names {gpu_count} GPUs but only {len(rows)} GPU "
            f"rows are present (missing: {_span(missing)})",
            where=where,
            hint="the paste looks cut off; capture the full 'nvidia-smi topo -m' output",
        )
    if extra:
        raise InputError(f"row GPU{extra[0]} has no column in the header", where=where)
    return rows


def _read_gpu_row(
    i: int, row: _Row, columns: list[str], gpu_count: int, trailing: list[str], where: str
) -> tuple[tuple[str, ...], str | None, int | None, str]:
    """GPU ``i``'s labels, CPU affinity, NUMA node, and a warning ("" if none) when its NUMA
    node cannot be read; InputError for a row whose ``X`` is not on the diagonal alone."""
    line_no, cells, by_position = row
    row_labels, cpu, numa = _parse_row(
        cells, columns, gpu_count, trailing, where=f"{where}: line {line_no}"
    )
    warning = ""
    unread = _unread_numa(cells[len(columns) :], trailing, by_position)
    if unread:
        cpu, numa = (cpu if by_position else None), None
        warning = f"GPU{i} (line {line_no}): its NUMA node cannot be read: {unread}"
    if row_labels[i] != "X":
        raise InputError(
            f"line {line_no}: GPU{i} against itself should be X, found {row_labels[i]}",
            where=where,
        )
    others = [j for j, label in enumerate(row_labels[:gpu_count]) if label == "X"]
    if others != [i]:
        j = next(j for j in others if j != i)
        raise InputError(
            f"line {line_no}: GPU{i}/GPU{j} is X, which only a GPU against itself is",
            where=where,
            hint="give the link label nvidia-smi printed (NV#, PIX, PXB, PHB, NODE, SYS)",
        )
    return tuple(row_labels[:gpu_count]), cpu, numa, warning


def _check_symmetric(labels: list[tuple[str, ...]], where: str) -> None:
    """InputError at the first pair whose two cells disagree."""
    for i, row in enumerate(labels):
        for j in range(i + 1, len(row)):
            if row[j] != labels[j][i]:
                raise InputError(
                    f"the matrix is not symmetric: GPU{i}/GPU{j} is {row[j]} "
                    f"but GPU{j}/GPU{i} is {labels[j][i]}",
                    where=where,
                )


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

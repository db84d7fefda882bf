"""The cells of ``nvidia-smi topo -m`` lines, blank ones included where the text tells them apart.

nvidia-smi ends each cell with a tab; a terminal paste has the tabs expanded to 8-column stops;
some pastes keep the header's alignment only. Each reading is tried in that order.
"""

from __future__ import annotations

import re

# Trailing columns, as the header spells them (split on whitespace).
_TRAILING = (("CPU", "Affinity"), ("NUMA", "Affinity"), ("GPU", "NUMA", "ID"))
_TRAILING_NAMES = tuple(" ".join(words) for words in _TRAILING)
_TAB = 8  # terminals expand nvidia-smi's tabs to 8-column stops; pastes keep the spaces
_WORD = re.compile(r"\S+")


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


def row_cells(line: str, starts: list[int] | None) -> tuple[list[str], bool]:
    """The cells of one row, and whether they were read by position (so that a blank cell is
    an empty string, not missing): by tabs, under the header's columns, or at 8-column tab
    stops; else split on whitespace."""
    if "\t" in line:
        return _cells(line), True
    cells = _cells_under(line, starts) if starts else None
    if cells is None:
        cells = _tab_stop_cells(line)
    return (cells, True) if cells is not None else (line.split(), False)


def header_starts(line: str) -> list[int] | None:
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


def header_columns(line: str) -> tuple[list[str], list[str]]:
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

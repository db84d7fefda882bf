"""Share placement: how a request over replicas, memory slices or MIG devices lands on GPUs.

Shared devices count as shares of their GPU (``cdigen.shares`` holds the ID grammar). Memory
slices, and every share under the ``pack`` policy, go on one GPU when one has room: the best
fit (the fewest free shares left on it), then the GPU least linked to the other free GPUs.
Slices that must span GPUs come back with a fallback reason (the plugin's Allocate refuses
such a set). Under ``spread`` (the default) a request for several replicas gets distinct GPUs,
by topology, and among sets equal on the topology the one with the most free shares.

Devices are handles here: indexes into the request's list of available devices, grouped by
the GPU position they belong to.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from cdigen.policies.objective import Objective
from cdigen.policies.search import Search, SetQuery


@dataclass
class DeviceGroups:
    """A request's devices (indexes into its available list) by GPU position."""

    groups: dict[int, list[int]] = field(default_factory=dict)  # usable GPU -> its devices
    bad: list[int] = field(default_factory=list)  # unknown or unusable GPUs: chosen last
    must_groups: dict[int, list[int]] = field(default_factory=dict)
    must_bad: list[int] = field(default_factory=list)


def choose_gpus(
    objective: Objective,
    search: Search,
    devices: DeviceGroups,
    slots: int,
    notes: list[str],
    *,
    pack: bool,
    slices: bool,
) -> tuple[int, ...]:
    """The GPU positions that get the request's ``slots`` devices."""
    avail_positions = tuple(sorted(devices.groups))
    must_positions = tuple(sorted(devices.must_groups))
    replicas = any(len(ids) > 1 for ids in devices.groups.values())
    counts = {p: len(ids) for p, ids in devices.groups.items()}
    found: tuple[int, ...] | None = None
    if pack and (replicas or slices):
        fit = best_fit(objective, counts, must_positions, slots, avail_positions)
        if fit is not None:
            return (fit,)
        if slices:
            notes.append(
                f"no single GPU has {slots} free slices (at most {max(counts.values())} "
                "on one GPU); the answer spans GPUs and Allocate will refuse it"
            )
    if not replicas:
        found = search.best(SetQuery(avail_positions, must_positions, slots), notes)
    elif pack:
        for k in range(max(1, len(must_positions)), len(avail_positions) + 1):
            if sum(sorted(counts.values(), reverse=True)[:k]) < slots:
                continue
            query = SetQuery(avail_positions, must_positions, k, counts, slots)
            found = search.best(query, notes)
            if found is not None:
                break
    else:
        k = max(len(must_positions), min(slots, len(avail_positions)))
        query = SetQuery(avail_positions, must_positions, k, counts, slots, balance=True)
        found = search.best(query, notes)
    if found is None:  # not expected for a valid request; stay valid anyway
        notes.append("no candidate set found; used every available GPU")
        found = avail_positions
    return found


def best_fit(
    objective: Objective,
    counts: dict[int, int],
    must_positions: Sequence[int],
    slots: int,
    avail_positions: Sequence[int],
) -> int | None:
    """The one GPU for ``slots`` shares: best fit (fewest free shares left), else None.

    GPUs passing the selector and the constraints come first; ties after the best fit go to
    the GPU least linked to the other free GPUs (keeping the well-connected ones for
    multi-GPU requests), then to the lowest index.
    """
    if len(must_positions) > 1:
        return None
    fits = [
        p
        for p, free in counts.items()
        if free >= slots and (not must_positions or must_positions[0] == p)
    ]
    if not fits:
        return None
    scores = objective.topology.scores
    constraints = objective.constrained

    def key(p: int) -> tuple[bool, bool, int, int, int]:
        failed = constraints and not objective.constraints_ok((p,))[0]
        degree = sum(scores[p][q] for q in avail_positions if q != p)
        return (p in objective.fail_positions, failed, counts[p] - slots, degree, p)

    return min(fits, key=key)


def assign(devices: DeviceGroups, positions: Sequence[int], slots: int, pack: bool) -> list[int]:
    """Pick ``slots`` devices on the chosen GPUs: must-include first, then spread or pack."""
    groups = devices.groups
    picked: dict[int, list[int]] = {p: list(devices.must_groups.get(p, [])) for p in positions}
    left = slots - sum(len(v) for v in picked.values())
    spare = {p: [i for i in groups[p] if i not in set(picked[p])] for p in positions}
    if pack:
        for p in sorted(positions, key=lambda p: -len(groups[p])):
            take = spare[p][:left]
            picked[p].extend(take)
            left -= len(take)
    else:
        while left > 0:
            open_ = [p for p in positions if spare[p]]
            if not open_:
                break
            p = min(open_, key=lambda p: (len(picked[p]), p))
            picked[p].append(spare[p].pop(0))
            left -= 1
    chosen = [i for p in positions for i in picked[p]]
    if left > 0:  # only after a fallback: top up from the other GPUs, keep the answer valid
        taken = set(chosen)
        extra = [i for ids in groups.values() for i in ids if i not in taken]
        chosen += extra[:left]
    return chosen

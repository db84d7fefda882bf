"""What ``dra why`` remembers across the nodes of a cluster, so that thousands of identical
nodes cost about one: the verdict of each compiled selector by the values the CEL ``device``
variable exposes, and each node's whole story by what the simulator reads of it.

Both keys are exact. The CEL ``device`` map holds the driver, ``allowMultipleAllocations``,
the attributes and the capacities, and nothing unique to one device (not its name, pool or
node), so two devices with equal maps get the same verdict from the same program. A node's
story depends on its devices (names, attributes, capacities, request policies, taints) and on
what the allocated claims hold there; the pool a device is in only decides which claims hold
it, and that is read before the key is made (what they hold is told in the shared fit's
devices, by position), except where another device of the node has its name: then the pool
names the device in the story, and is in the key.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Callable, Hashable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from cdigen.policies.cel import CelEvaluationError, CelProgram
from cdigen.policies.dra.claims import NodeState, shared_names
from cdigen.policies.dra.slice_devices import SliceDevice


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cycle collector off for a while: parsing a cluster's lists and simulating its
    nodes make millions of objects and no cycles, and the collector's passes over them were a
    third of the time."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def loads(data: bytes | str) -> Any:
    """``json.loads`` of an API server's answer for ``dra why``, which only reads it: equal
    JSON objects (the attributes, capacities and devices thousands of identical GPUs repeat)
    become one shared dict, and the collector is paused. A list of 5,000 nodes' slices took
    about 250 MB as plain dicts, 60 MB so. The result must not be modified."""
    with collector_paused():
        return json.loads(data, object_pairs_hook=_shared_objects())


def _shared_objects() -> Callable[[list[tuple[str, Any]]], dict[str, Any]]:
    """A ``json`` object hook that returns one dict for equal objects of one document.

    The key is each member's name, type and value, or for an object member, the identity of
    the (already shared) dict it became: equal objects have identical members. A dict kept
    here keeps its members alive, so no identity in a key is reused while the hook lives.
    Objects holding a list are not shared (a list has no key)."""
    seen: dict[tuple[Any, ...], dict[str, Any]] = {}

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        try:
            key = tuple([(k, type(v), id(v) if type(v) is dict else v) for k, v in pairs])
            found = seen.get(key)
        except TypeError:  # a list member
            return dict(pairs)
        if found is None:
            found = seen[key] = dict(pairs)
        return found

    return hook


class _Unkeyable(Exception):
    """A value with no exact key (evaluated without the memo)."""


def _value_key(value: Any) -> Any:
    """An exact, hashable key for one CEL value: its type beside its value, so that the bool
    ``true`` and the int ``1`` (equal in Python) never share an entry."""
    if isinstance(value, dict):
        items = [(_value_key(k), _value_key(v)) for k, v in value.items()]
        return (type(value), tuple(sorted(items, key=repr)))
    if isinstance(value, list):
        return (type(value), tuple(_value_key(v) for v in value))
    try:
        hash(value)
    except TypeError:
        raise _Unkeyable from None
    return (type(value), value)


@dataclass(frozen=True)
class MemoProgram(CelProgram):
    """A compiled selector that remembers its verdict (or its error) for each ``device``
    value it was evaluated on."""

    verdicts: dict[Any, bool | CelEvaluationError] = field(
        default_factory=dict, compare=False, repr=False
    )

    def evaluate(self, activation: Mapping[str, Any], deadline: float | None = None) -> bool:
        try:
            key = _value_key(dict(activation))
        except _Unkeyable:
            return super().evaluate(activation, deadline)
        known = self.verdicts.get(key)
        if known is None:
            try:
                known = super().evaluate(activation, deadline)
            except CelEvaluationError as exc:
                known = exc
            self.verdicts[key] = known
        if isinstance(known, CelEvaluationError):
            raise known
        return known


class MemoPrograms(dict[str, CelProgram]):
    """The ``programs`` of :class:`cdigen.policies.dra.claims.FirstFit`, shared by the fits of every
    node: each program stored is kept as a :class:`MemoProgram`."""

    def __setitem__(self, expression: str, program: CelProgram) -> None:
        if not isinstance(program, MemoProgram):
            program = MemoProgram(
                program.text, program.program, program.cost, program.allocation_fields
            )
        super().__setitem__(expression, program)


def _attribute_key(value: Any) -> Any:
    if isinstance(value, list):
        return (list, tuple(_attribute_key(v) for v in value))
    return (type(value), value)


def device_key(device: SliceDevice, *, pool: bool = False) -> tuple[Any, ...]:
    """Everything the simulator reads of ``device`` but its pool (with it when ``pool``)."""
    return (
        device.pool if pool else None,
        device.name,
        device.driver,
        tuple(sorted((k, _attribute_key(v)) for k, v in device.attributes.items())),
        tuple(sorted(device.versions)),
        tuple(sorted(device.capacity.items())),
        tuple(sorted(device.policies.items())),
        device.allow_multiple,
        device.taints,
    )


def devices_key(devices: list[SliceDevice]) -> tuple[Any, ...]:
    """What the simulator reads of one node's devices, in order (all but the pools of those
    whose name no other device of the node has): nodes with equal keys can share one
    :class:`cdigen.policies.dra.claims.FirstFit`. A name two devices share is told with its
    driver and pool (:meth:`FirstFit.label`), so there the pool is part of the key."""
    shared = shared_names(devices)
    return tuple(device_key(d, pool=d.name in shared) for d in devices)


def node_key(devices: Hashable, state: NodeState, held: int) -> tuple[Any, ...]:
    """What one node's story depends on: its devices (their :func:`devices_key`, or one
    object standing for it), what is held of them, and by how many claims."""
    consumed = tuple(
        sorted((name, tuple(sorted(amounts.items()))) for name, amounts in state.consumed.items())
    )
    return (devices, tuple(sorted(state.exclusive)), consumed, held)

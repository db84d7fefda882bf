"""CDI names: ``vendor/class=name``, with the rules of the CDI Go library's parser.

A *kind* is ``vendor/class``; a *qualified name* is ``kind=name``. Vendor and class start with a
letter, device names with a letter or a digit; all end with a letter or a digit.
"""

from __future__ import annotations

import re

from cdigen.errors import InputError

VENDOR_RE = re.compile(r"^[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")
DEVICE_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")

DEFAULT_VENDOR = "nvidia.com"
DEFAULT_CLASS = "gpu"
CAPABILITY_DEVICE_PREFIX = "capability-"  # never a GPU name: those are digits, GPU-/MIG- or gpuN


def _kind_part_problem(part: str, value: str) -> str | None:
    if len(value) == 1:
        # the CDI library (v1.1.0, in containerd 2.x and CRI-O) panics on one-letter names
        return f"invalid {part} {value!r}: must be at least two characters long"
    if VENDOR_RE.fullmatch(value):
        return None
    return (
        f"invalid {part} {value!r}: must start with a letter, end with a letter or digit, "
        "and contain only letters, digits, '_', '.' and '-'"
    )


def vendor_problem(vendor: str) -> str | None:
    """Why ``vendor`` is not a valid CDI vendor, or None."""
    return _kind_part_problem("vendor", vendor)


def class_problem(cls: str) -> str | None:
    """Why ``cls`` is not a valid CDI class, or None."""
    return _kind_part_problem("class", cls)


def device_name_problem(name: str) -> str | None:
    """Why ``name`` is not a valid CDI device name, or None."""
    if DEVICE_RE.fullmatch(name):
        return None
    return (
        f"invalid device name {name!r}: must start and end with a letter or digit and contain "
        "only letters, digits, '_', '.', ':' and '-'"
    )


def split_kind(kind: str) -> tuple[str, str]:
    """``vendor/class`` -> ``(vendor, class)``; the parts may be empty if ``kind`` is malformed."""
    vendor, _, cls = kind.partition("/")
    return vendor, cls


def kind_problem(kind: str) -> str | None:
    """Why ``kind`` is not a valid ``vendor/class``, or None: the one check for a kind we
    write, accept in a config or load."""
    vendor, sep, cls = kind.partition("/")  # as the CDI library's parser.ParseQualifier
    if not sep or not vendor or not cls:
        return f"invalid kind {kind!r}: expected vendor/class, e.g. nvidia.com/gpu"
    return vendor_problem(vendor) or class_problem(cls)


def make_kind(vendor: str, cls: str) -> str:
    """The kind ``vendor/class``; InputError if either part breaks the naming rules."""
    problem = vendor_problem(vendor) or class_problem(cls)
    if problem:
        raise InputError(problem, hint="pass a valid --vendor/--class, e.g. nvidia.com and gpu")
    return f"{vendor}/{cls}"


def qualified_name(kind: str, name: str) -> str:
    """``kind=name``, e.g. ``nvidia.com/gpu=0``."""
    return f"{kind}={name}"


def device_name(strategy: str, gpu_index: int, uuid: str, mig_position: int | None = None) -> str:
    """The CDI device name of a GPU (``mig_position`` None) or of the MIG device at
    ``mig_position`` on GPU ``gpu_index`` (``uuid`` is then the MIG device's), under one naming
    strategy: ``index`` (``0``, ``0:1``), ``uuid`` or ``type-index`` (``gpu0``, ``mig0:1``).
    The one place device names are made: generated specs and the plugin both use it."""
    if mig_position is None:
        by = {"index": str(gpu_index), "uuid": uuid, "type-index": f"gpu{gpu_index}"}
    else:
        by = {
            "index": f"{gpu_index}:{mig_position}",
            "uuid": uuid,
            "type-index": f"mig{gpu_index}:{mig_position}",
        }
    return by[strategy]


def capability_device_name(capability: str) -> str:
    """The CDI device name of a driver capability's extra edits, e.g. ``capability-graphics``
    (``nvidia.com/gpu=capability-graphics``). The one place these names are made: generated
    specs and the plugin's Allocate both use it."""
    return f"{CAPABILITY_DEVICE_PREFIX}{capability}"


def capability_of(name: str) -> str | None:
    """The capability a (bare or fully-qualified) capability device name stands for
    (``nvidia.com/gpu=capability-graphics`` -> ``graphics``); None for any other name."""
    device = name.rpartition("=")[2]
    if device.startswith(CAPABILITY_DEVICE_PREFIX):
        return device.removeprefix(CAPABILITY_DEVICE_PREFIX)
    return None


def parse_qualified_name(text: str) -> tuple[str, str, str]:
    """``vendor/class=name`` -> ``(vendor, class, name)``; InputError naming the bad part."""
    kind, sep, name = text.partition("=")
    if not sep:
        raise InputError(
            f"{text!r} is not a qualified CDI device name", hint="expected vendor/class=name"
        )
    problem = kind_problem(kind) or device_name_problem(name)
    if problem:
        raise InputError(problem, where=text)
    vendor, cls = split_kind(kind)
    return vendor, cls, name


def spec_file_name(vendor: str, cls: str, fmt: str) -> str:
    """The file cdigen owns for a kind: ``<vendor>-<class>.yaml`` or ``.json``."""
    return f"{vendor}-{cls}.{'json' if fmt == 'json' else 'yaml'}"

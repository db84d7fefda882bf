"""The checkpoint of prepared claims, and where their transient specs live.

Every claim is kept in the checkpoint file in two phases: its plan (the devices, and the MIG
placements it will make) is recorded before any side effect, as ``PrepareStarted``; each MIG
device as it is made; the claim as ``PrepareCompleted`` once its spec is written. Unprepare
records ``UnprepareStarted`` before it destroys anything. A restarted plugin rolls back every
claim left half-prepared and finishes every unprepare begun, so that no MIG device is stranded,
and still unprepares the claims prepared before it.

Layout version 2 carries the boot ID (``/proc/sys/kernel/random/boot_id``: a new one is a
reboot, which took the MIG devices with it) and a SHA-256 over the rest, so that a damaged file
is refused rather than half believed; version 1 (what cdigen wrote before: no phases, no
checksum, no boot ID) still loads, its claims as completed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NotRequired, TypedDict

from cdigen.errors import InputError
from cdigen.fileio import read_text, same_dir
from cdigen.plugin.dra.claims import ClaimRef, kind_of, quoted
from cdigen.plugin.dra.dynamic_mig import MigDoc, mig_doc_problem

log = logging.getLogger(__name__)

CHECKPOINT_VERSION = 2
LOADED_VERSIONS = (1, 2)  # 1: before the two phases (no state, checksum or boot ID)
STARTED: Literal["PrepareStarted"] = "PrepareStarted"
COMPLETED: Literal["PrepareCompleted"] = "PrepareCompleted"
UNPREPARING: Literal["UnprepareStarted"] = "UnprepareStarted"
State = Literal["PrepareStarted", "PrepareCompleted", "UnprepareStarted"]
STATES: tuple[State, ...] = (STARTED, COMPLETED, UNPREPARING)
CLAIM_CLASS = "claim"
CHECKPOINT_HINT = (
    "move it away only after unpreparing its claims by hand (their specs are in the CDI dir, "
    "named after the claim UID)"
)


class PreparedDeviceDoc(TypedDict):
    """A prepared device in the checkpoint (and, field for field, in the kubelet's answer)."""

    requestNames: list[str]
    poolName: str
    deviceName: str
    cdiDeviceIds: list[str]
    shareId: str | None
    # consumedCapacity of the allocation (quantities by capacity name), for attribution
    consumedCapacity: NotRequired[dict[str, str]]


class PlacementDoc(TypedDict):
    """A MIG placement a claim's plan makes: the GPU and the memory slices (first, how many)
    of its GPU instance, which identify it before NVML gives it an ID (instances never
    overlap)."""

    device: str
    gpuUUID: str
    start: int
    size: int


class ClaimDoc(TypedDict):
    """A claim in the checkpoint (version 1 had no ``state``: all were completed)."""

    namespace: str
    name: str
    devices: list[PreparedDeviceDoc]
    shareable: dict[str, bool]
    specPath: str
    migDevices: NotRequired[list[MigDoc]]  # made for the claim (--mig-strategy dynamic)
    state: NotRequired[State]
    placements: NotRequired[list[PlacementDoc]]  # the plan's, recorded before they are made


@dataclass(frozen=True)
class Checkpoint:
    """What a checkpoint file holds: the claims by UID and the boot it was written in."""

    claims: dict[str, ClaimDoc]
    boot_id: str | None


def read_boot_id(proc_root: str | Path) -> str | None:
    """This boot's ID from ``<proc_root>/sys/kernel/random/boot_id``; None when unreadable."""
    try:
        with open(Path(proc_root) / "sys" / "kernel" / "random" / "boot_id", "rb") as f:
            raw = f.read(100)
    except OSError:
        return None
    text = raw.decode("ascii", "replace").strip()
    return text if text and text.isprintable() and len(text) <= 64 else None


def checkpoint_bytes(claims: dict[str, ClaimDoc], boot_id: str | None) -> bytes:
    """The file's content: layout 2, with the SHA-256 of the rest (canonical JSON).

    The claims, most of a save's CPU, are encoded once: canonical JSON of an object is its
    keys in order, so the file is the rest's text with ``"checksum"`` set between ``bootId``
    and ``claims``, byte for byte what encoding the whole body again gives."""
    # compact: json's C encoder (an indent takes the pure-Python one)
    head = '{"bootId":' + _canonical(boot_id)
    tail = ',"claims":' + _canonical(claims) + ',"version":' + _canonical(CHECKPOINT_VERSION) + "}"
    checksum = _canonical(_digest(head + tail))
    return (head + ',"checksum":' + checksum + tail).encode()


def _canonical(doc: Any) -> str:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def _checksum(body: dict[str, Any]) -> str:
    return _digest(_canonical({k: v for k, v in body.items() if k != "checksum"}))


def _digest(rest: str) -> str:
    """The checksum of the canonical text of everything but the checksum."""
    return "sha256:" + hashlib.sha256(rest.encode()).hexdigest()


def claim_spec_path(spec_dir: Path, driver: str, uid: str) -> Path:
    """Where the transient spec of claim ``uid`` (a checked UID: ClaimRef.problem) lives."""
    return spec_dir / f"{claim_spec_prefix(driver)}{uid}.json"


def legacy_claim_spec_path(spec_dir: Path, driver: str, uid: str) -> Path:
    """Where earlier versions wrote it (JSON in a ``.yaml`` file): a checkpoint written by
    one names this path, and the plugin still removes it at unprepare after an upgrade."""
    return claim_spec_path(spec_dir, driver, uid).with_suffix(".yaml")


def claim_vendor(driver: str) -> str:
    """The CDI vendor of ``driver``'s per-claim specs, ``k8s.<driver>``, as the kubelet's DRA
    helper names it."""
    return f"k8s.{driver}"


def claim_spec_prefix(driver: str) -> str:
    """What every claim spec's file name starts with: ``k8s.<driver>-claim_``."""
    return f"{claim_vendor(driver)}-{CLAIM_CLASS}_"


def spec_path_problem(path: str, spec_dir: Path, driver: str, uid: str) -> str | None:
    """Why ``path`` is not where claim ``uid``'s spec belongs (its file directly in the CDI dir,
    symlinks of the directory resolved), or None."""
    expected = claim_spec_path(spec_dir, driver, uid)
    names = (expected.name, legacy_claim_spec_path(spec_dir, driver, uid).name)
    if "\0" in path or Path(path).name not in names or not same_dir(Path(path).parent, spec_dir):
        return f"{quoted(path)} is not {expected}"
    return None


def load_checkpoint(path: Path, *, spec_dir: Path, driver: str) -> Checkpoint:
    """The claims in the checkpoint at ``path`` (none when there is no file).

    A checkpoint that cannot be read, is not one we wrote or names a spec outside ``spec_dir``
    is an InputError naming the file (one line): starting empty would leak the specs and device
    holds of the claims it lists. Read bounded (fileio.read_text: a regular file, no FIFO,
    at most CDIGEN_MAX_INPUT_BYTES, UTF-8) and checked field by field.
    """
    if not os.path.lexists(path):
        return Checkpoint({}, None)
    try:
        text = read_text(path, what="checkpoint")
    except InputError as exc:
        raise InputError(exc.message, where=str(path), hint=exc.hint or CHECKPOINT_HINT) from None
    try:
        doc = json.loads(text)
    except RecursionError:
        raise _bad_checkpoint(path, "it is nested too deeply") from None
    except ValueError as exc:
        raise _bad_checkpoint(path, f"it is not JSON ({' '.join(str(exc).split())[:80]})") from None
    if not isinstance(doc, dict):
        raise _bad_checkpoint(path, f"it is {kind_of(doc)}, not an object")
    version = doc.get("version")
    if version not in LOADED_VERSIONS or isinstance(version, bool):
        raise _bad_checkpoint(path, f"unknown layout (version {quoted(version, 40)}, not 1 or 2)")
    boot_id = None
    if version == 2:
        if doc.get("checksum") != _checksum(doc):
            raise _bad_checkpoint(path, "its checksum does not match (damaged or edited)")
        boot_id = doc.get("bootId")
        if boot_id is not None and not isinstance(boot_id, str):
            raise _bad_checkpoint(path, f"bootId is {kind_of(boot_id)}, not a string")
    claims = doc.get("claims")
    if not isinstance(claims, dict):
        raise _bad_checkpoint(path, f"claims is {kind_of(claims)}, not an object")
    for uid, claim in claims.items():
        problem = _claim_doc_problem(uid, claim, spec_dir, driver)
        if problem:
            raise _bad_checkpoint(path, f"claims[{quoted(uid, 60)}]{problem}")
    out: dict[str, ClaimDoc] = claims
    return Checkpoint(out, boot_id)


def _bad_checkpoint(path: Path, problem: str) -> InputError:
    return InputError(
        f"the checkpoint is not one cdigen wrote: {problem}", where=str(path), hint=CHECKPOINT_HINT
    )


def _claim_doc_problem(uid: str, claim: Any, spec_dir: Path, driver: str) -> str | None:
    """What is wrong with one checkpoint entry (``.field: why``, or ``: why``), or None."""
    if not isinstance(claim, dict):
        return f": {kind_of(claim)}, not an object"
    uid_problem = ClaimRef("x", uid, "x").problem()
    if uid_problem:
        return f": {uid_problem}"
    for key in ("namespace", "name", "specPath"):
        if not isinstance(claim.get(key), str):
            return f".{key}: {kind_of(claim.get(key))}, not a string"
    ref_problem = ClaimRef(claim["namespace"], uid, claim["name"]).problem()
    if ref_problem:
        return f": {ref_problem}"
    if claim["specPath"]:
        problem = spec_path_problem(claim["specPath"], spec_dir, driver, uid)
        if problem:
            return f".specPath: {problem} (a spec outside the CDI dir, or another --cdi-dir)"
    shareable = claim.get("shareable")
    if not isinstance(shareable, dict) or not all(isinstance(v, bool) for v in shareable.values()):
        return f".shareable: {kind_of(shareable)}, not an object of device: true/false"
    devices = claim.get("devices")
    if not isinstance(devices, list):
        return f".devices: {kind_of(devices)}, not a list"
    for index, device in enumerate(devices):
        problem = _device_doc_problem(device)
        if problem:
            return f".devices[{index}]{problem}"
        device.setdefault("shareId", None)
    migs = claim.get("migDevices", [])
    if not isinstance(migs, list):
        return f".migDevices: {kind_of(migs)}, not a list"
    for index, doc in enumerate(migs):
        problem = mig_doc_problem(doc)
        if problem:
            return f".migDevices[{index}]{problem}"
    state = claim.setdefault("state", COMPLETED)  # layout 1: every claim was completed
    if state not in STATES:
        return f".state: {quoted(state, 40)}, not one of {', '.join(STATES)}"
    placements = claim.get("placements", [])
    if not isinstance(placements, list):
        return f".placements: {kind_of(placements)}, not a list"
    for index, doc in enumerate(placements):
        problem = _placement_doc_problem(doc)
        if problem:
            return f".placements[{index}]{problem}"
    return None


def _placement_doc_problem(doc: Any) -> str | None:
    if not isinstance(doc, dict):
        return f": {kind_of(doc)}, not an object"
    for key in ("device", "gpuUUID"):
        if not isinstance(doc.get(key), str):
            return f".{key}: {kind_of(doc.get(key))}, not a string"
    for key in ("start", "size"):
        value = doc.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            return f".{key}: {kind_of(value)}, not a non-negative integer"
    return None


def _device_doc_problem(device: Any) -> str | None:
    if not isinstance(device, dict):
        return f": {kind_of(device)}, not an object"
    for key in ("poolName", "deviceName"):
        if not isinstance(device.get(key), str):
            return f".{key}: {kind_of(device.get(key))}, not a string"
    for key in ("requestNames", "cdiDeviceIds"):
        value = device.get(key)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            return f".{key}: {kind_of(value)}, not a list of strings"
    if device.get("shareId") is not None and not isinstance(device.get("shareId"), str):
        return f".shareId: {kind_of(device.get('shareId'))}, not a string or null"
    consumed = device.get("consumedCapacity", {})
    if not isinstance(consumed, dict):
        return f".consumedCapacity: {kind_of(consumed)}, not an object"
    for name, value in consumed.items():
        if not isinstance(value, str):
            return f".consumedCapacity.{quoted(name, 40)}: {kind_of(value)}, not a quantity string"
    return None


def remove_spec(path: str | Path) -> str:
    """Remove a claim's spec file (one already gone is fine). The error, or ""."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        return f"cannot remove {path}: {exc.strerror}"
    return ""


def remove_unknown_spec(spec_dir: Path, driver: str, uid: str) -> str:
    """Remove the spec a claim the checkpoint does not know may have left (``uid`` is a
    checked one). The error, or ""."""
    for path in (
        claim_spec_path(spec_dir, driver, uid),
        legacy_claim_spec_path(spec_dir, driver, uid),
    ):
        if not os.path.lexists(path):
            continue
        error = remove_spec(path)
        if error:
            return error
        log.info("removed %s, left by claim %s without a checkpoint entry", path, uid)
    return ""


def spec_present(claim: ClaimDoc) -> bool:
    """True when the claim needs no spec or its spec is in the CDI dir."""
    return not claim["specPath"] or os.path.exists(claim["specPath"])

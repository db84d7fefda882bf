"""The checkpoint of prepared claims, and where their transient specs live.

Every prepared claim is kept in the checkpoint file, so that a restarted plugin still unprepares
claims prepared before it (their specs, and the MIG devices made for them).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from cdigen.errors import InputError
from cdigen.fileio import read_text, same_dir
from plugin.dra.claims import ClaimRef, kind_of, quoted
from plugin.dra.dynamic_mig import MigDoc, mig_doc_problem

CHECKPOINT_VERSION = 1
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


class ClaimDoc(TypedDict):
    """A prepared claim in the checkpoint."""

    namespace: str
    name: str
    devices: list[PreparedDeviceDoc]
    shareable: dict[str, bool]
    specPath: str
    migDevices: NotRequired[list[MigDoc]]  # made for the claim (--mig-strategy dynamic)


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


def load_checkpoint(path: Path, *, spec_dir: Path, driver: str) -> dict[str, ClaimDoc]:
    """The prepared claims in the checkpoint at ``path`` ({} when there is none).

    A checkpoint that cannot be read, is not one we wrote or names a spec outside ``spec_dir``
    is an InputError naming the file (one line): starting empty would leak the specs and device
    holds of the claims it lists. Read bounded (fileio.read_text: a regular file, no FIFO,
    at most CDIGEN_MAX_INPUT_BYTES, UTF-8) and checked field by field.
    """
    if not os.path.lexists(path):
        return {}
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
    if doc.get("version") != CHECKPOINT_VERSION:
        raise _bad_checkpoint(
            path, f"unknown layout (version {quoted(doc.get('version'), 40)}, not 1)"
        )
    claims = doc.get("claims")
    if not isinstance(claims, dict):
        raise _bad_checkpoint(path, f"claims is {kind_of(claims)}, not an object")
    for uid, claim in claims.items():
        problem = _claim_doc_problem(uid, claim, spec_dir, driver)
        if problem:
            raise _bad_checkpoint(path, f"claims[{quoted(uid, 60)}]{problem}")
    out: dict[str, ClaimDoc] = claims
    return out


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


def spec_present(claim: ClaimDoc) -> bool:
    """True when the claim needs no spec or its spec is in the CDI dir."""
    return not claim["specPath"] or os.path.exists(claim["specPath"])

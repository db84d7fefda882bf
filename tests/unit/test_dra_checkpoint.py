"""The two-phase checkpoint's file: layout 2 (checksum, boot ID) written and read back, and
layout 1, what cdigen wrote before (tests/fixtures/dra/checkpoint-v1.json, written by main's
code at d8a930e), still loaded, its claims as completed."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from cdigen.errors import InputError
from cdigen.plugin.dra.checkpoint import (
    COMPLETED,
    checkpoint_bytes,
    load_checkpoint,
    read_boot_id,
)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "dra" / "checkpoint-v1.json"
FIXTURE_CDI = Path("/tmp/cdigen-v1-fixture/cdi")  # the CDI dir it was written with
DRIVER = "gpu.cdigen.dev"


def test_a_checkpoint_written_by_the_previous_layout_loads_as_completed_claims() -> None:
    loaded = load_checkpoint(FIXTURE, spec_dir=FIXTURE_CDI, driver=DRIVER)
    assert loaded.boot_id is None
    assert {c["state"] for c in loaded.claims.values()} == {COMPLETED}
    made = {m["device"]: m["gi"] for c in loaded.claims.values() for m in c["migDevices"]}
    assert made == {"gpu-1-3g-40gb-at-4": 1, "gpu-1-1g-10gb-at-0": 2}


def test_layout_2_round_trips_with_its_boot_id(tmp_path: Path) -> None:
    claims = load_checkpoint(FIXTURE, spec_dir=FIXTURE_CDI, driver=DRIVER).claims
    path = tmp_path / "checkpoint.json"
    path.write_bytes(checkpoint_bytes(claims, "boot-1"))
    again = load_checkpoint(path, spec_dir=FIXTURE_CDI, driver=DRIVER)
    assert again.claims == claims and again.boot_id == "boot-1"
    assert json.loads(path.read_text())["version"] == 2


@pytest.mark.parametrize("cut", [1, 100, -2])
def test_a_truncated_or_flipped_layout_2_is_refused_with_one_line(tmp_path: Path, cut: int) -> None:
    claims = load_checkpoint(FIXTURE, spec_dir=FIXTURE_CDI, driver=DRIVER).claims
    data = checkpoint_bytes(claims, "boot-1")
    path = tmp_path / "checkpoint.json"
    # -2: one number changed, still JSON of the right shape: the checksum says no
    changed = data.replace(b'"gi":1,', b'"gi":3,', 1)
    assert changed != data
    data = changed if cut == -2 else data[:cut]
    path.write_bytes(data)
    with pytest.raises(InputError) as caught:
        load_checkpoint(path, spec_dir=FIXTURE_CDI, driver=DRIVER)
    message = str(caught.value)
    assert "\n" not in message and str(path) in message
    assert ("checksum" in message) == (cut == -2)


@pytest.mark.parametrize("boot_id", [None, "boot-\u00e9"])
def test_layout_2_is_canonical_json_checksummed_over_the_rest(boot_id: str | None) -> None:
    """The bytes a save writes: sorted keys, no spaces, ASCII escapes, and the SHA-256 of the
    same encoding of everything but the checksum (what earlier versions wrote and check)."""
    claims = load_checkpoint(FIXTURE, spec_dir=FIXTURE_CDI, driver=DRIVER).claims
    data = checkpoint_bytes(claims, boot_id)
    doc = json.loads(data)
    assert data == canonical(doc).encode()
    rest = canonical({k: v for k, v in doc.items() if k != "checksum"})
    assert doc["checksum"] == "sha256:" + hashlib.sha256(rest.encode()).hexdigest()
    assert (doc["version"], doc["bootId"], doc["claims"]) == (2, boot_id, claims)


def canonical(doc: object) -> str:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def test_the_boot_id_is_read_from_the_proc_root_given(tmp_path: Path) -> None:
    assert read_boot_id(tmp_path) is None
    where = tmp_path / "sys" / "kernel" / "random"
    where.mkdir(parents=True)
    (where / "boot_id").write_text("3f2c7a9e-0d1b-4c55-9f1e-2a6b8c0d4e11\n")
    assert read_boot_id(tmp_path) == "3f2c7a9e-0d1b-4c55-9f1e-2a6b8c0d4e11"


def test_a_boot_id_longer_than_any_the_kernel_writes_is_not_believed(tmp_path: Path) -> None:
    where = tmp_path / "sys" / "kernel" / "random"
    where.mkdir(parents=True)
    (where / "boot_id").write_text("b" * 64 + "\n")
    assert read_boot_id(tmp_path) == "b" * 64
    (where / "boot_id").write_text("b" * 65 + "\n")
    assert read_boot_id(tmp_path) is None
    (where / "boot_id").write_text("bad\x00id\n")
    assert read_boot_id(tmp_path) is None


def test_the_checksum_is_of_the_content_not_of_the_key_order(tmp_path: Path) -> None:
    """A checkpoint rewritten with its keys in another order (by a JSON tool) still loads."""
    claims = load_checkpoint(FIXTURE, spec_dir=FIXTURE_CDI, driver=DRIVER).claims
    doc = json.loads(checkpoint_bytes(claims, "boot-1"))

    def reversed_keys(value: object) -> object:
        if isinstance(value, dict):
            return {k: reversed_keys(value[k]) for k in reversed(list(value))}
        if isinstance(value, list):
            return [reversed_keys(v) for v in value]
        return value

    path = tmp_path / "checkpoint.json"
    path.write_text(json.dumps(reversed_keys(doc), indent=2))
    assert load_checkpoint(path, spec_dir=FIXTURE_CDI, driver=DRIVER).claims == claims


def test_an_unreadable_checkpoint_keeps_the_readers_hint_or_gets_the_checkpoints(
    tmp_path: Path,
) -> None:
    import os

    fifo, binary = tmp_path / "fifo", tmp_path / "binary"
    os.mkfifo(fifo)
    binary.write_bytes(b"\xff\xfe")
    with pytest.raises(InputError) as caught:
        load_checkpoint(fifo, spec_dir=FIXTURE_CDI, driver=DRIVER)
    assert caught.value.hint == "give the path of a regular file"
    with pytest.raises(InputError) as caught:
        load_checkpoint(binary, spec_dir=FIXTURE_CDI, driver=DRIVER)
    assert "not UTF-8" in caught.value.message
    assert (caught.value.hint or "").startswith("move it away only after unpreparing its claims")


def test_a_half_prepared_claim_with_a_placement_at_slice_0_round_trips(tmp_path: Path) -> None:
    claims = load_checkpoint(FIXTURE, spec_dir=FIXTURE_CDI, driver=DRIVER).claims
    (uid, claim) = next(iter(claims.items()))
    claim["state"] = "PrepareStarted"
    claim["placements"] = [
        {"device": "gpu-1-7g-80gb-at-0", "gpuUUID": "GPU-1", "start": 0, "size": 8}
    ]
    path = tmp_path / "checkpoint.json"
    path.write_bytes(checkpoint_bytes(claims, None))
    again = load_checkpoint(path, spec_dir=FIXTURE_CDI, driver=DRIVER).claims[uid]
    assert again["state"] == "PrepareStarted" and again["placements"][0]["start"] == 0
    claim["placements"][0]["start"] = -1
    path.write_bytes(checkpoint_bytes(claims, None))
    with pytest.raises(InputError, match=r"\.placements\[0\]\.start: .*not a non-negative"):
        load_checkpoint(path, spec_dir=FIXTURE_CDI, driver=DRIVER)


def test_a_share_id_string_loads_and_a_number_does_not(tmp_path: Path) -> None:
    claims = load_checkpoint(FIXTURE, spec_dir=FIXTURE_CDI, driver=DRIVER).claims
    device = next(iter(claims.values()))["devices"][0]
    device["shareId"] = "6f1c"
    path = tmp_path / "checkpoint.json"
    path.write_bytes(checkpoint_bytes(claims, None))
    loaded = load_checkpoint(path, spec_dir=FIXTURE_CDI, driver=DRIVER).claims
    assert next(iter(loaded.values()))["devices"][0]["shareId"] == "6f1c"
    device["shareId"] = 7  # type: ignore[typeddict-item]
    path.write_bytes(checkpoint_bytes(claims, None))
    with pytest.raises(InputError, match=r"shareId: a number, not a string or null"):
        load_checkpoint(path, spec_dir=FIXTURE_CDI, driver=DRIVER)

"""The DRA plugin's file rules at the library level: atomic_write confined to a directory and
never climbing through ``..``, modes whatever the umask, claim references checked."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdigen.cdi.names import device_name_problem
from cdigen.errors import WriteError
from cdigen.fileio import atomic_write
from cdigen.plugin.dra.checkpoint import claim_spec_path, spec_path_problem
from cdigen.plugin.dra.claims import ClaimRef


def test_atomic_write_creates_no_directory_through_dot_dot(tmp_path: Path) -> None:
    (tmp_path / "cdi").mkdir()
    target = tmp_path / "cdi" / "k8s.x-claim_.." / ".." / ".." / "escape" / "victim.yaml"
    with pytest.raises(WriteError, match=r"through '\.\.'"):
        atomic_write(target, b"x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cdi"]
    assert list((tmp_path / "cdi").iterdir()) == []


def test_atomic_write_within_refuses_a_file_outside_that_directory(tmp_path: Path) -> None:
    cdi = tmp_path / "cdi"
    (tmp_path / "elsewhere").mkdir()
    cdi.mkdir()
    (cdi / "link").symlink_to(tmp_path / "elsewhere")
    for target in (tmp_path / "elsewhere" / "a.yaml", cdi / "link" / "a.yaml", cdi / "sub/a.yaml"):
        with pytest.raises(WriteError, match="will not write outside"):
            atomic_write(target, b"x", within=cdi)
    assert list((tmp_path / "elsewhere").iterdir()) == []
    atomic_write(cdi / "a.yaml", b"x", within=cdi)
    assert (cdi / "a.yaml").read_bytes() == b"x"


def test_atomic_write_makes_0755_directories_under_umask_000(
    tmp_path: Path, umask_000: None
) -> None:
    target = tmp_path / "a" / "b" / "f.json"
    atomic_write(target, b"{}", mode=0o600)
    modes = [stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "a", tmp_path / "a" / "b")]
    assert modes == [0o755, 0o755]
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


@pytest.mark.parametrize(
    "uid",
    [
        "8e3c7a52-0c1f-4c36-9f0e-5f5b2a1d9c77",  # what the API server makes
        "u-a",
        "uid-0",
        "x",
        "a.b_c",
        "u" * 128,
    ],
)
def test_kubernetes_uids_are_taken(uid: str) -> None:
    assert ClaimRef("default", uid, "claim-1").problem() is None


@pytest.mark.parametrize(
    "uid",
    ["", ".", "..", "a..b", "a/b", "/x", "-a", "a-", "a\nb", "a\0b", "a b", "é", "u" * 129],
)
def test_anything_else_is_not_a_uid(uid: str) -> None:
    problem = ClaimRef("default", uid, "c").problem()
    assert problem is not None and "is not a Kubernetes UID" in problem
    assert "\n" not in problem and len(problem) < 200


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=200) | st.from_regex(r"[A-Za-z0-9._/-]{1,140}", fullmatch=True))
def test_a_uid_that_is_taken_names_one_file_directly_in_the_cdi_dir(uid: str) -> None:
    spec_dir = Path("/var/run/cdi")
    if ClaimRef("default", uid, "c").problem() is not None:
        return
    path = claim_spec_path(spec_dir, "gpu.cdigen.dev", uid)
    assert Path(os.path.normpath(path)).parent == spec_dir
    assert spec_path_problem(str(path), spec_dir, "gpu.cdigen.dev", uid) is None
    assert device_name_problem(f"{uid}-gpu-0") is None


def test_a_checkpoint_of_an_earlier_version_names_a_yaml_spec_and_it_is_accepted(
    tmp_path: Path,
) -> None:
    """Earlier versions wrote the claim spec as JSON in a ``.yaml`` file: after an upgrade the
    checkpoint still names it, and unprepare must be able to remove it."""
    from cdigen.plugin.dra.checkpoint import legacy_claim_spec_path

    legacy = legacy_claim_spec_path(tmp_path, "gpu.cdigen.dev", "uid-a")
    assert legacy.name == "k8s.gpu.cdigen.dev-claim_uid-a.yaml"
    assert claim_spec_path(tmp_path, "gpu.cdigen.dev", "uid-a").suffix == ".json"
    assert spec_path_problem(str(legacy), tmp_path, "gpu.cdigen.dev", "uid-a") is None
    other = legacy.with_name("k8s.gpu.cdigen.dev-claim_uid-b.yaml")
    assert spec_path_problem(str(other), tmp_path, "gpu.cdigen.dev", "uid-a") is not None


def test_a_claim_spec_is_checked_and_must_be_a_json_file(tmp_path: Path) -> None:
    from cdigen.cdi.write import write_claim_spec
    from cdigen.errors import SchemaError

    spec = {
        "cdiVersion": "0.5.0",
        "kind": "k8s.gpu.cdigen.dev/claim",
        "devices": [{"name": "uid-a-gpu-0", "containerEdits": {"deviceNodes": [{"path": "x"}]}}],
    }
    with pytest.raises(SchemaError, match="is not absolute"):
        write_claim_spec(spec, tmp_path / "cdi" / "a.json", within=tmp_path / "cdi")
    assert not (tmp_path / "cdi" / "a.json").exists()
    spec["devices"][0]["containerEdits"]["deviceNodes"] = [{"path": "/dev/nvidia0"}]
    with pytest.raises(WriteError, match=r"must end in \.json"):
        write_claim_spec(spec, tmp_path / "cdi" / "a.yaml", within=tmp_path / "cdi")
    write_claim_spec(spec, tmp_path / "cdi" / "a.json", within=tmp_path / "cdi")
    assert stat.S_IMODE((tmp_path / "cdi" / "a.json").stat().st_mode) == 0o644

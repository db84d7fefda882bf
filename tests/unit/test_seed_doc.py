"""docs/seed-4090.md, the seed's story: its commands print what it says, from the files it shows."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from cdigen.cli import main
from tests.helpers.doc_sessions import Session, expected_exit, sessions, shown_files

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "seed-4090.md"
TEXT = DOC.read_text(encoding="utf-8")


FILES = shown_files("docs/seed-4090.md")
SESSIONS = [(x.command, "\n".join(x.shown), x) for x in sessions([DOC])]


def test_the_page_shows_both_wings() -> None:
    assert {"seed.yaml", "gpu-mps-4.yaml", "seed-a.yaml", "seed-b.yaml"} <= set(FILES)
    commands = [c for c, _, _ in SESSIONS]
    assert any(c.startswith("cdigen plugin config check") for c in commands)
    assert any(c.startswith("cdigen dra explain") for c in commands)


def test_the_seed_pod_asks_for_one_whole_gpu_and_nothing_else() -> None:
    pod = yaml.safe_load(FILES["seed.yaml"])
    (container,) = pod["spec"]["containers"]
    assert container["resources"] == {"limits": {"nvidia.com/gpu": 1}}
    assert "resourceClaims" not in pod["spec"]


@pytest.mark.parametrize(
    ("command", "expected", "session"), SESSIONS, ids=[c for c, _, _ in SESSIONS]
)
def test_each_session_prints_what_the_page_says(
    command: str,
    expected: str,
    session: Session,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name, body in FILES.items():
        (tmp_path / name).write_text(body, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    code = main(shlex.split(command)[1:])
    # the page says which one fails: the claim the whole-GPU default leaves without a GPU
    assert code == expected_exit(session)
    assert capsys.readouterr().out.rstrip("\n") == expected.rstrip("\n")


def test_the_helm_values_it_installs_are_the_charts_own() -> None:
    named = re.findall(r"helm install cdigen deploy/helm/cdigen -f (\S+)", TEXT)
    assert len(named) == 2
    for path in named:
        assert (ROOT / path).is_file(), path


def test_the_readme_links_it_first() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    first_link = re.search(r"\]\((docs/[^)#]+)", readme)
    assert first_link is not None and first_link.group(1) == "docs/seed-4090.md"

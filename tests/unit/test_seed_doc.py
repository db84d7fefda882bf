"""docs/seed-4090.md, the seed's story: its commands print what it says, from the files it shows."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from cdigen.cli import main

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "seed-4090.md"
TEXT = DOC.read_text(encoding="utf-8")


def _files() -> dict[str, str]:
    """The YAML blocks whose first line names a file (``# NAME.yaml``), by that name."""
    out = {}
    for block in re.findall(r"```yaml\n(.*?)```", TEXT, re.S):
        first = block.partition("\n")[0]
        if m := re.fullmatch(r"# ([\w.-]+\.yaml)", first):
            out[m.group(1)] = block
    return out


def _sessions() -> list[tuple[str, str]]:
    """(command, expected output) for each ``$ cdigen`` line of the console blocks."""
    out = []
    for block in re.findall(r"```console\n(.*?)```", TEXT, re.S):
        lines = block.splitlines()
        for at, line in enumerate(lines):
            if line.startswith("$ cdigen "):
                rest = lines[at + 1 :]
                end = next((k for k, x in enumerate(rest) if x.startswith("$ ")), len(rest))
                out.append((line[2:], "\n".join(rest[:end])))
    return out


FILES = _files()
SESSIONS = _sessions()


def test_the_page_shows_both_wings() -> None:
    assert {"seed.yaml", "gpu-mps-4.yaml", "seed-a.yaml", "seed-b.yaml"} <= set(FILES)
    commands = [c for c, _ in SESSIONS]
    assert any(c.startswith("cdigen plugin config check") for c in commands)
    assert any(c.startswith("cdigen dra explain") for c in commands)


def test_the_seed_pod_asks_for_one_whole_gpu_and_nothing_else() -> None:
    pod = yaml.safe_load(FILES["seed.yaml"])
    (container,) = pod["spec"]["containers"]
    assert container["resources"] == {"limits": {"nvidia.com/gpu": 1}}
    assert "resourceClaims" not in pod["spec"]


@pytest.mark.parametrize(("command", "expected"), SESSIONS, ids=[c for c, _ in SESSIONS])
def test_each_session_prints_what_the_page_says(
    command: str,
    expected: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name, body in FILES.items():
        (tmp_path / name).write_text(body, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    code = main(shlex.split(command)[1:])
    # the page says which one fails: the claim the whole-GPU default leaves without a GPU
    assert code == (1 if "not allocatable" in expected else 0)
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

"""cdigen as installed (issue 35 point 4): the wheel built from this checkout, installed with pip
into a fresh venv, runs every console session of README.md and docs/*.md that needs no GPU,
cluster or root, from a temp working dir (not the checkout), and prints what the doc shows with
the exit code its output implies; and it puts nothing in site-packages but ``cdigen`` and its
dist-info (its dependencies bring their own).

One venv per test session; pip's cache makes the install quick after the first.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers.doc_sessions import (
    REPO,
    Session,
    docs,
    expected_exit,
    not_runnable,
    sessions,
    shown_files,
    words,
)

EXAMPLES = REPO / "deploy" / "dra" / "examples"
# Shell commands a doc runs on what cdigen wrote, run after it as shown.
FOLLOW_UPS = ("grep", "cat")


def _misspelt_policy(doc: str) -> str:
    """docs/policies.md checks 'my-policy.yaml', its example with the typo its output shows."""
    block = re.search(
        r"^```yaml\n(apiVersion: cdigen/v1alpha1\nkind: AllocationPolicy\n.*?)^```",
        doc,
        re.S | re.M,
    )
    assert block, "docs/policies.md: the policy file example is gone"
    return block.group(1).replace("productName.startsWith", "productNmae.startsWith", 1)


# Exit codes the doc states in its text where the output alone would say another.
STATED_EXITS = {
    # docs/dra.md: "A field outside those is refused, exit 1, one line naming the file"
    "cdigen dra check old-claim.yaml": 1,
    # docs/sharing.md: "(exit 1; `plugin serve` refuses the same config at start, exit 2)"
    "cdigen plugin config check overlap.yaml --node builtin:rtx4090": 1,
}
# Files a session reads that its doc describes but does not show under a '# NAME' line.
DERIVED: dict[tuple[str, str], Callable[[str], str]] = {
    ("docs/policies.md", "my-policy.yaml"): _misspelt_policy,
}


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # built from a copy of the sources: pip builds in the tree it is given, and a build/ left
    # there by an earlier build (of other package names) would go into the wheel
    source = tmp_path_factory.mktemp("source") / "cdigen"
    shutil.copytree(
        REPO,
        source,
        symlinks=True,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache"
        ),
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(source)],
        check=True,
        capture_output=True,
    )
    (path,) = out.glob("cdigen-*.whl")
    return path


@pytest.fixture(scope="session")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, set[str]]:
    """A fresh venv with the wheel pip-installed; and what its site-packages held before."""
    venv = tmp_path_factory.mktemp("venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
    before = {p.name for p in site_packages(venv).iterdir()}
    pip = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)],
        capture_output=True,
        text=True,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    assert pip.returncode == 0, pip.stderr[-3000:]
    return venv, before


def site_packages(venv: Path) -> Path:
    (path,) = (venv / "lib").glob("python3*/site-packages")
    return path


def owners(site: Path) -> dict[str, set[str]]:
    """Each installed distribution's top-level entries in ``site``, from its RECORD."""
    out: dict[str, set[str]] = {}
    for record in site.glob("*.dist-info/RECORD"):
        tops = {
            row.split(",", 1)[0].split("/", 1)[0]
            for row in record.read_text(encoding="utf-8").splitlines()
            if row and not row.startswith("..")  # scripts: ../../../bin/NAME
        }
        out[record.parent.name] = {t for t in tops if t != "__pycache__"}
    return out


def test_the_wheel_holds_only_the_cdigen_package(wheel: Path) -> None:
    tops = {name.split("/", 1)[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert tops == {"cdigen", wheel.name.split("-py3")[0] + ".dist-info"}


def test_site_packages_gains_cdigen_and_its_dependencies_only(
    installed: tuple[Path, set[str]],
) -> None:
    venv, before = installed
    site = site_packages(venv)
    gained = {p.name for p in site.iterdir()} - before - {"__pycache__"}
    by_dist = owners(site)
    (ours,) = (d for d in by_dist if d.startswith("cdigen-"))
    unowned = gained - set().union(*by_dist.values()) - set(by_dist)
    assert not unowned, f"in site-packages but in no distribution's RECORD: {sorted(unowned)}"
    # the shipped data: DeviceClasses, schemas, built-in nodes and policies
    package = site / "cdigen"
    assert (package / "dra_files" / "deviceclasses.yaml").is_file()
    assert any((package / "schema_files").glob("*.schema.json"))
    assert by_dist[ours] == {"cdigen", ours}


def runnable() -> list[Session]:
    out = []
    for session in sessions():
        reason = not_runnable(session)
        if reason is None or (
            reason == "not a cdigen command" and words(session.command)[:1] == ["grep"]
        ):
            out.append(session)
    return out


SESSIONS = runnable()


def test_the_docs_have_sessions_to_run() -> None:
    assert len(SESSIONS) >= 15
    assert {s.doc for s in SESSIONS} >= {"docs/dra.md", "docs/sharing.md", "docs/labels.md"}


def _workdir(doc: str, root: Path) -> Path:
    """The temp dir a doc's sessions run in, one per doc (a session may read what the one
    before it wrote): the DRA example claims and the files the doc shows."""
    here = root / doc.replace("/", "_")
    if here.exists():
        return here
    shutil.copytree(EXAMPLES, here)
    # as in a checkout, for a session that names the examples by their path there
    shutil.copytree(EXAMPLES, here / EXAMPLES.relative_to(REPO))
    text = (REPO / doc).read_text(encoding="utf-8")
    # a doc may run a file another doc shows (plugin.md checks sharing.md's split.yaml); its own
    # files win
    others = [str(p.relative_to(REPO)) for p in docs()]
    shown = {n: c for other in others if other != doc for n, c in shown_files(other).items()}
    shown.update(shown_files(doc))
    for name, content in shown.items():
        (here / name).write_text(content, encoding="utf-8")
    for (of, name), make in DERIVED.items():
        if of == doc:
            (here / name).write_text(make(text), encoding="utf-8")
    (here / "tmp").mkdir()
    return here


def _matches(shown: list[str], printed: list[str]) -> bool:
    if shown and shown[-1].strip() in ("...", "…"):
        return printed[: len(shown) - 1] == shown[:-1]
    return printed == shown


@pytest.mark.parametrize("session", SESSIONS, ids=[s.id for s in SESSIONS])
def test_the_session_runs_as_the_doc_shows(
    session: Session,
    installed: tuple[Path, set[str]],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    venv, _ = installed
    first = words(session.command)[0]
    if first != "cdigen" and first not in FOLLOW_UPS:
        pytest.skip(f"{first} is not run here")
    tool = re.search(r"\| (\w+)", session.command)
    if tool and shutil.which(tool.group(1)) is None:
        pytest.skip(f"{tool.group(1)} is not installed")
    root = tmp_path_factory.getbasetemp() / "doc-sessions"
    here = _workdir(session.doc, root)
    # /tmp/... in a doc is scratch space: this session's own
    command = session.command.replace("/tmp/", f"{here}/tmp/")
    result = subprocess.run(
        ["bash", "-c", f'{command}\necho "exit=${{PIPESTATUS[0]}}" >&2'],
        cwd=here,
        capture_output=True,
        text=True,
        timeout=120,
        env={
            "PATH": f"{venv / 'bin'}:/usr/bin:/bin",
            "HOME": str(here),
            "LANG": "C.UTF-8",
            "COLUMNS": "100",
        },
    )
    err = result.stderr.splitlines()
    code = int(err.pop().removeprefix("exit="))
    out = result.stdout.splitlines()
    shown = [line.replace("/tmp/", f"{here}/tmp/") for line in session.shown]
    where = f"{session.id}: $ {session.command}"
    expected = STATED_EXITS.get(session.command, expected_exit(session))
    assert code == expected, f"{where}\n{result.stderr}"
    if shown:
        candidates = (out, err, err + out, out + err)
        assert any(_matches(shown, printed) for printed in candidates), (
            f"{where}\nshown:\n" + "\n".join(shown) + "\nprinted:\n" + "\n".join(err + out)
        )

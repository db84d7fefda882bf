"""Consistent names and messages (issue 11, point 6): built-in policies with or without
``builtin:``, a hint for a bare built-in node name, a missing spec dir said, and ``validate``
reporting every good file and passing the troubleshooting recipe on a healthy node."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cdigen.cli import main
from cdigen.errors import InputError
from cdigen.plugin.deviceplugin.config import ResourceConfig
from cdigen.plugin.deviceplugin.runner import PolicySet
from cdigen.policies.policy import BUILTIN_NAMES, load_policy

EXPLAIN = ["policy", "explain", "--node", "builtin:dgx1-v100", "--available", "0,2,3,5"]


@pytest.mark.parametrize("name", ["single-numa", "builtin:single-numa"])
def test_cli_policy_with_and_without_prefix(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*EXPLAIN, "--size", "2", "--policy", name, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["devices"]


@pytest.mark.parametrize("name", ["pack", "builtin:pack"])
def test_plugin_config_policy_with_and_without_prefix(name: str) -> None:
    policy = PolicySet({}, {}).for_resource(ResourceConfig("nvidia.com/gpu", name))
    assert policy.name == load_policy("builtin:pack").name == "pack"


def test_a_policy_file_named_like_a_builtin_wins_over_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("spread").write_text("not: a policy\n")
    with pytest.raises(InputError, match="spread"):
        load_policy("spread")  # the file is read, and it is not a policy
    assert load_policy("builtin:spread").name == "spread"
    assert set(BUILTIN_NAMES) >= {"spread", "pack", "single-numa", "default"}


def test_unknown_policy_name_in_config_lists_both_forms() -> None:
    with pytest.raises(InputError, match="no policy named 'builtin:nope'"):
        PolicySet({}, {}).for_resource(ResourceConfig("nvidia.com/gpu", "builtin:nope"))


def test_bare_builtin_node_name_suggests_the_prefix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["discover", "--node", "rtx4090"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "cdigen: error: rtx4090: no such node file; "
        "for the built-in sample write --node builtin:rtx4090"
    )
    assert main(["discover", "--node", "nonsuch"]) == 2  # not a sample: the plain message
    assert "node file not found" in capsys.readouterr().err


def test_list_says_an_explicit_spec_dir_is_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing"
    assert main(["list", "--spec-dir", str(missing)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"cdigen: error: --spec-dir: no such directory: {missing}")
    assert len(err.splitlines()) == 1

    good = tmp_path / "cdi"
    assert main(["generate", "--node", "builtin:rtx4090", "--output-dir", str(good)]) == 0
    capsys.readouterr()
    assert main(["list", "--spec-dir", str(good), "--spec-dir", str(missing)]) == 0
    captured = capsys.readouterr()
    assert captured.err == f"cdigen: warning: --spec-dir {missing}: no such directory\n"
    assert "nvidia.com/gpu=all" in captured.out


@pytest.fixture
def spec_dirs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Path, Path, Path]:
    """A healthy node: our spec in etc/cdi, nothing in run/cdi; plus a dir with a bad spec."""
    etc, run, bad_dir = tmp_path / "etc/cdi", tmp_path / "run/cdi", tmp_path / "bad"
    assert main(["generate", "--node", "builtin:rtx4090", "--output-dir", str(etc)]) == 0
    run.mkdir(parents=True)
    bad_dir.mkdir()
    (bad_dir / "old.yaml").write_text("cdiVersion: 0.5.0\nkind: x.com/y\ndevices: []\n")
    capsys.readouterr()
    return etc, run, bad_dir


def test_validate_prints_ok_for_good_files_when_another_fails(
    spec_dirs: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    etc, _, bad_dir = spec_dirs
    good, bad = etc / "nvidia.com-gpu.yaml", bad_dir / "old.yaml"
    assert main(["validate", str(bad), str(good)]) == 1
    captured = capsys.readouterr()
    assert captured.out == f"{good}: ok\n"
    assert captured.err.startswith(f"{bad}: devices: [] should be non-empty")
    assert captured.err.endswith("cdigen: 2 file(s) checked: 1 problem(s)\n")


def test_troubleshooting_recipe_passes_on_a_healthy_node(
    spec_dirs: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """Both forms: directories, and the old glob recipe with patterns the shell left as they are
    (no *.json file, nothing in /var/run/cdi)."""
    etc, run, _ = spec_dirs
    assert main(["validate", str(etc), str(run)]) == 0
    captured = capsys.readouterr()
    assert captured.out == f"{etc}/nvidia.com-gpu.yaml: ok\n"
    assert captured.err == f"cdigen: note: no CDI spec files (*.yaml, *.json) in {run}\n"

    recipe = [f"{etc}/nvidia.com-gpu.yaml", f"{etc}/*.json", f"{run}/*"]  # as the shell passes them
    assert main(["validate", *recipe]) == 0
    captured = capsys.readouterr()
    assert captured.out == f"{etc}/nvidia.com-gpu.yaml: ok\n"
    assert captured.err.splitlines() == [
        f"cdigen: note: no files match {etc}/*.json",
        f"cdigen: note: no files match {run}/*",
    ]


def test_validate_without_arguments_reads_the_runtimes_spec_dirs(
    spec_dirs: tuple[Path, Path, Path],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    etc, run, _ = spec_dirs
    monkeypatch.setattr("cdigen.cdi.specdir.DEFAULT_SPEC_DIRS", (etc, run / "missing"))
    assert main(["validate"]) == 0
    assert capsys.readouterr().out == f"{etc}/nvidia.com-gpu.yaml: ok\n"

    monkeypatch.setattr("cdigen.cdi.specdir.DEFAULT_SPEC_DIRS", (run,))
    assert main(["validate"]) == 2
    assert f"no CDI spec files (*.yaml, *.json) in {run}" in capsys.readouterr().err


def test_validate_a_missing_file_is_still_a_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = os.path.join(tmp_path, "gone.yaml")
    assert main(["validate", missing]) == 2  # bad input, as for every subcommand
    assert (
        capsys.readouterr().err == f"cdigen: error: {missing}: CDI spec not found; check the path\n"
    )


def test_validate_a_glob_that_matched_nothing_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Rough edge 12 of issue 26: 'note: no files match …' then 'error: no files match …'."""
    pattern = f"{tmp_path}/*.json"  # as the shell passes it when nothing matched
    assert main(["validate", pattern]) == 2
    assert capsys.readouterr().err == (
        f"cdigen: error: no files match {pattern}; name CDI spec files, or directories that hold "
        "*.yaml or *.json specs\n"
    )

"""``cdigen generate`` runs at every node boot: it imports only what the run needs (issue 17),
and the logging it defers still reaches the user in the CLI's format."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cdigen.nodefile import dump_node
from tests.cdihost import build_host, make_node

# Heavy or unneeded on generate's path; each was imported there once (see docs/cdi.md).
NOT_ON_THE_BOOT_PATH = (
    "jsonschema",  # the full validator: `cdigen validate` only
    "logging",  # ~8 ms; imported once something logs (cdigen.logs)
    "shutil",  # argparse asks it for the terminal width; tempfile needs it to write
    "tempfile",
    "importlib.resources",  # the sample names in --help come from the package dir
    "importlib.metadata",  # the wings' entry points: core commands skip them
    "cdigen.cdi.cache",  # the spec loader: only when other spec files are in the dir
    "pynvml",
    "grpc",
    "networkx",
    "celpy",
)

PROBE = """
import sys
from cdigen.cli import main
code = main(sys.argv[1:])
print("MODULES", " ".join(sorted(sys.modules)), file=sys.stderr)
sys.exit(code)
"""


def _modules_after(*args: str) -> set[str]:
    run = subprocess.run(
        [sys.executable, "-c", PROBE, *args], capture_output=True, text=True, check=True
    )
    line = next(x for x in run.stderr.splitlines() if x.startswith("MODULES "))
    return set(line.split()[1:])


@pytest.fixture(scope="module")
def host_args(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    base = tmp_path_factory.mktemp("host")
    host = build_host(base, make_node(2))
    node_file = base / "node.yaml"
    node_file.write_text(dump_node(host.node, "yaml"))
    return [
        "--node", str(node_file), "--driver-root", str(host.driver_root),
        "--dev-root", str(host.dev_root), "--sysfs-root", str(host.sysfs_root),
    ]  # fmt: skip


@pytest.mark.parametrize("write", [False, True], ids=["dry-run", "write"])
def test_generate_imports_only_what_it_needs(
    host_args: list[str], tmp_path: Path, write: bool
) -> None:
    where = ["--output-dir", str(tmp_path / "cdi")] if write else ["--dry-run"]
    loaded = _modules_after("generate", *host_args, *where)
    assert "cdigen.cdi.spec" in loaded  # the probe saw the run
    needed = {"tempfile", "shutil"} if write else set()  # mkstemp, for the atomic write
    assert not [m for m in NOT_ON_THE_BOOT_PATH if m in loaded and m not in needed]


def test_another_spec_file_in_the_dir_is_still_checked_for_conflicts(
    host_args: list[str], tmp_path: Path
) -> None:
    spec_dir = tmp_path / "cdi"
    first = subprocess.run(
        [sys.executable, "-m", "cdigen.cli", "generate", *host_args, "--output-dir", str(spec_dir)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert first.stdout.startswith("wrote ")
    (spec_dir / "nvidia.com-gpu.yaml").rename(spec_dir / "other.yaml")  # now someone else's
    again = subprocess.run(
        [sys.executable, "-m", "cdigen.cli", "generate", *host_args, "--output-dir", str(spec_dir)],
        capture_output=True,
        text=True,
    )
    assert again.returncode != 0
    assert "other.yaml" in again.stderr
    assert not (spec_dir / "nvidia.com-gpu.yaml").exists()


def test_deferred_logging_keeps_the_cli_format() -> None:
    probe = (
        "import sys\n"
        "from cdigen import logs\n"
        "logs.configure('info')\n"
        "assert 'logging' not in sys.modules, 'configure imported logging'\n"
        "logs.logger().info('removed %s', 'x.tmp')\n"
        "logs.logger().debug('not shown at info')\n"
    )
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert run.stderr == "cdigen: INFO: removed x.tmp\n"


def test_a_stale_temp_file_is_reported_at_info_level(host_args: list[str], tmp_path: Path) -> None:
    spec_dir = tmp_path / "cdi"
    spec_dir.mkdir()
    stale = spec_dir / ".nvidia.com-gpu.yaml.abcd1234.tmp"
    stale.write_text("half a spec")
    run = subprocess.run(
        [sys.executable, "-m", "cdigen.cli", "--log-level", "info", "generate", *host_args,
         "--output-dir", str(spec_dir)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert f"cdigen: INFO: removed {stale}, left by an interrupted cdigen run" in run.stderr
    assert not stale.exists()

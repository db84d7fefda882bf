"""podman as the CDI consumer of a test: what a container given CDI devices gets, or why podman
refuses them (recipe: ../shared/reference/podman-cdi.md).

podman vendors the CDI library: ``podman run --device <vendor>/<class>=<name>`` refreshes a
registry over /etc/cdi and /var/run/cdi (bind-mounted from the test's own folders in a private
mount namespace), resolves the names and injects their edits. One container run reports what the
edits made: the environment, the character devices under /dev (major, minor), the mount table
and the text of the files a test asks for. With ``debug=True`` podman's debug log also gives the
library's load errors ("refreshing the CDI registry"); use it only for a run podman refuses
before a container starts: with debug logging podman 4.3 waits out conmon's 20 s timeout after
a container exits.

What podman cannot show: the order of the environment (podman rebuilds it from a map) and the
exact order of the OCI mounts (podman sorts mounts by depth itself). Debian 12's podman 4.3.1
vendors CDI library 0.5.x, which reads ``cdiVersion`` up to :data:`MAX_CDI_VERSION`; cdigen
models v1.1.0, so a spec that needs a later version is a known difference, not a failure.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.helpers.podman import Podman, missing_tools

MAX_CDI_VERSION = (0, 5, 0)  # podman 4.3.1's CDI library (Debian 12, as .ci/run installs it)
UNRESOLVABLE = "unresolvable CDI devices"
PROBE = "cdigen.invalid/probe=none"  # a name no spec defines: podman refuses it before a container
_LOAD_ERRORS = re.compile(r'refreshing the CDI registry: (.*?)"$', re.M)


def cdi_version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("."))


@dataclass(frozen=True)
class Container:
    """One ``podman run`` with CDI devices: what its container saw, or podman's refusal."""

    ok: bool
    error: str  # podman's last stderr line where it refused, else ""
    env: dict[str, str] = field(default_factory=dict)
    nodes: dict[str, tuple[int, int]] = field(default_factory=dict)  # /dev path -> major, minor
    mounts: dict[str, list[str]] = field(default_factory=dict)  # destination -> mount options
    files: dict[str, str] = field(default_factory=dict)  # path asked -> its text, if a file
    load_errors: tuple[str, ...] = ()  # the library's errors loading spec files (debug=True)

    def unresolvable(self) -> bool:
        """podman refused the names: the library could not resolve (or load) them."""
        return not self.ok and UNRESOLVABLE in self.error


class CdiRuntime:
    """podman with a busybox root; each :meth:`run` reads its specs from the folders given."""

    def __init__(self, work: Path, store: Path) -> None:
        self.podman = Podman(work, store)
        # through an overlay: the mount points runc makes in one run must not show in the next
        self.podman.overlay = True
        self.empty = work / "empty"

    def run(
        self,
        etc_cdi: Path,
        names: Sequence[str],
        *,
        var_run_cdi: Path | None = None,
        read: Sequence[str] = (),
        debug: bool = False,
    ) -> Container:
        """Start a container given ``names`` with ``etc_cdi`` over /etc/cdi (and
        ``var_run_cdi``, default empty, over /var/run/cdi); ``read``: files whose text to report."""
        self.podman.etc_cdi = etc_cdi
        self.podman.var_run_cdi = var_run_cdi or self.empty
        script = (
            'echo @ENV; env; echo @NODES; find /dev -type c -exec stat -c "%n %t %T" {} +; '
            "echo @MOUNTS; cat /proc/mounts; "
            + "".join(f"test -f {p} && echo && echo @FILE {p} && cat {p}; " for p in read)
            + "echo; echo @END"  # a file's text may not end in a newline
        )
        run = self.podman.run(script, *names, global_args="--log-level=debug" if debug else "")
        errors = tuple(
            e.strip().removeprefix("* ")
            for found in _LOAD_ERRORS.findall(run.stderr)
            for e in found.replace("\\n", "\n").replace("\\t", "\t").replace('\\"', '"').split("\n")
            if e.strip().startswith("* ")
        )
        if run.returncode != 0 or "@END" not in run.stdout:
            last = [line for line in run.stderr.splitlines() if line.startswith("Error")]
            return Container(False, (last or [run.stderr.strip()])[-1], load_errors=errors)
        return _parse(run.stdout, errors)

    def load_errors(self, etc_cdi: Path, *, var_run_cdi: Path | None = None) -> tuple[str, ...]:
        """The library's errors loading the spec files of these folders (load errors and
        conflicts; ``()`` where every file loads)."""
        seen = self.run(etc_cdi, [PROBE], var_run_cdi=var_run_cdi, debug=True)
        assert seen.unresolvable(), seen.error
        return seen.load_errors


def _parse(out: str, errors: tuple[str, ...]) -> Container:
    found = Container(True, "", load_errors=errors)
    section, current = "", ""
    for line in out.splitlines():
        if line.startswith("@"):
            section, _, current = line[1:].partition(" ")
            if section == "FILE":
                found.files[current] = ""
            continue
        if section == "ENV" and "=" in line:
            key, _, value = line.partition("=")
            found.env[key] = value
        elif not line.strip() and section != "FILE":
            continue
        elif section == "NODES":
            path, major, minor = line.split()
            found.nodes[path] = (int(major, 16), int(minor, 16))
        elif section == "MOUNTS":
            parts = line.split()
            found.mounts[parts[1]] = parts[3].split(",")
        elif section == "FILE":
            found.files[current] += line + "\n"
    for path, text in found.files.items():  # less the newline echoed before the next marker
        found.files[path] = text[:-1]
    return found


def cdi_runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CdiRuntime]:
    """A module's podman (the body of a fixture); skips, saying why, where podman cannot run a
    container at all (not root, not installed: ``.ci/run`` installs it)."""
    reason = missing_tools()
    if reason:
        pytest.skip(reason)
    store = Path(tempfile.mkdtemp(prefix="cdigen-podman-", dir="/tmp"))  # a short runroot path
    try:
        runtime = CdiRuntime(tmp_path_factory.mktemp("podman"), store)
        smoke = runtime.podman.run("true")
        if smoke.returncode != 0:
            pytest.skip(f"this machine cannot run containers at all: {smoke.stderr.strip()[-300:]}")
        yield runtime
    finally:
        shutil.rmtree(store, ignore_errors=True)

"""``cdigen`` as a user runs it, and ``cdigen plugin serve`` as a real process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path


def cdigen(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run the CLI as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "cdigen.cli", *args], capture_output=True, text=True, check=check
    )


class ServedPlugin:
    """A ``cdigen plugin serve`` subprocess; its stderr goes to ``log``."""

    def __init__(self, tmp: Path, *args: str, own_group: bool = False) -> None:
        """``own_group``: the plugin leads a process group of its own, as a shell's foreground
        job does, so that :meth:`signal_group` reaches it and every process it started."""
        self.plugin_dir = tmp / "plugins"
        self.log = tmp / "plugin.log"
        self._log_file = self.log.open("w")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "cdigen.cli",
                "plugin",
                "serve",
                "--plugin-dir",
                str(self.plugin_dir),
                *args,
            ],
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            # a process killed by a signal of its own (SIGABRT from a native library at exit)
            # leaves its threads' Python stacks in the log
            env={**os.environ, "PYTHONFAULTHANDLER": "1"},
            process_group=0 if own_group else None,
        )

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def signal_group(self, signum: int) -> None:
        """``signum`` to the plugin's whole process group (a terminal's Ctrl-C)."""
        os.killpg(self.proc.pid, signum)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=10)
        finally:
            self._log_file.close()
        if code < 0:  # killed by a signal: pytest shows this with the failure
            print(f"plugin serve ended by signal {-code}; its log ends:", file=sys.stderr)
            print(self.logs()[-4000:], file=sys.stderr)
        return code

    def logs(self) -> str:
        return self.log.read_text()

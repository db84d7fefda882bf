"""Regenerate the Python stubs of ``deviceplugin.proto``: ``python -m plugin.api.generate [OUT]``.

Run from anywhere; the proto is compiled with the repository root as the include path, so the
generated ``deviceplugin_pb2_grpc.py`` imports ``from plugin.api import deviceplugin_pb2`` and
works once installed. ``OUT`` (default: the repository root) receives ``plugin/api/*_pb2*``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from cdigen.errors import CdigenError

PROTO = "plugin/api/deviceplugin.proto"
REPO_ROOT = Path(__file__).resolve().parents[2]
GENERATED = ("deviceplugin_pb2.py", "deviceplugin_pb2.pyi", "deviceplugin_pb2_grpc.py")


def generate(out_root: Path, repo_root: Path = REPO_ROOT) -> list[Path]:
    """Compile the proto into ``out_root/plugin/api``; return the files written."""
    from grpc_tools import protoc

    target = out_root / "plugin" / "api"
    target.mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"-I{repo_root}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        str(repo_root / PROTO),
    ]
    if protoc.main(args) != 0:
        raise CdigenError(f"protoc failed on {PROTO}", hint="see the messages above")
    return [target / name for name in GENERATED]


def main(argv: list[str]) -> int:
    """Entry point: regenerate into ``argv[0]`` or the repository root."""
    out = Path(argv[0]) if argv else REPO_ROOT
    for path in generate(out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

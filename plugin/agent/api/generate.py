"""Regenerate the Python stubs of the kubelet protos, every wing's and the core's:
``python -m cdigen.plugin.agent.api.generate [OUT]``.

It lives in the node-agent core, the one package both wings build on. Run from anywhere; each
proto is compiled with the repository root as the include path, so the generated
``*_pb2_grpc.py`` files import ``from cdigen.plugin.deviceplugin.api import deviceplugin_pb2`` (or
``cdigen.plugin.dra.api``, ``cdigen.plugin.agent.api``) and work once installed. ``OUT`` (default:
the repository root) receives the ``*_pb2*`` files beside each proto.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from cdigen.errors import CdigenError

# Every proto is cdigen's own definition of a kubelet API, written from its facts (package, names,
# field numbers, types); the k8s.io/kubelet API it matches is named at the top of each file.
PROTOS = (
    "plugin/deviceplugin/api/deviceplugin.proto",
    "plugin/dra/api/dra_v1.proto",
    "plugin/dra/api/dra_v1beta1.proto",
    "plugin/dra/api/pluginregistration_v1.proto",
    "plugin/dra/api/dra_health_v1alpha1.proto",
    "plugin/agent/api/podresources_v1.proto",
)
PROTO = PROTOS[0]
REPO_ROOT = Path(__file__).resolve().parents[3]
SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")
GENERATED = tuple(f"deviceplugin{suffix}" for suffix in SUFFIXES)


def generated_paths(proto: str) -> list[str]:
    """The stub paths (relative to the repository root) that ``proto`` compiles into."""
    stem = proto.removesuffix(".proto")
    return [f"{stem}{suffix}" for suffix in SUFFIXES]


def generate(out_root: Path, repo_root: Path = REPO_ROOT) -> list[Path]:
    """Compile every proto into ``out_root``; return the files written."""
    from grpc_tools import protoc

    written: list[Path] = []
    for proto in PROTOS:
        (out_root / proto).parent.mkdir(parents=True, exist_ok=True)
        args = [
            "grpc_tools.protoc",
            f"-I{repo_root}",
            f"--python_out={out_root}",
            f"--pyi_out={out_root}",
            f"--grpc_python_out={out_root}",
            str(repo_root / proto),
        ]
        if protoc.main(args) != 0:
            raise CdigenError(f"protoc failed on {proto}", hint="see the messages above")
        written.extend(out_root / path for path in generated_paths(proto))
        # protoc names the stubs' package by the proto's path (plugin/...); the package is
        # installed as cdigen.plugin.
        grpc_stub = out_root / generated_paths(proto)[2]
        text = grpc_stub.read_text(encoding="utf-8")
        grpc_stub.write_text(
            re.sub(r"(?m)^from plugin\.", "from cdigen.plugin.", text), encoding="utf-8"
        )
    return written


def main(argv: list[str]) -> int:
    """Entry point: regenerate into ``argv[0]`` or the repository root."""
    out = Path(argv[0]) if argv else REPO_ROOT
    for path in generate(out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

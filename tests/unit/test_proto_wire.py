"""The rewritten .proto files speak the same bytes as the stubs generated before the rewrite.

``tests/fixtures/proto_golden`` holds what the earlier stubs wrote for every message with fields,
their compiled descriptors, and the gRPC method paths (see ``capture.py`` there).
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.descriptor import Descriptor, FileDescriptor
from google.protobuf.message_factory import GetMessageClass

from cdigen.plugin.agent.api.generate import PROTOS, REPO_ROOT
from tests.fixtures.proto_golden.capture import HERE, MODULES, fill, method_paths, stem

GOLDEN = sorted(p for p in HERE.glob("*.bin") if not p.name.endswith(".descriptor.bin"))


def _new_file(module: str) -> FileDescriptor:
    file: FileDescriptor = importlib.import_module(module).DESCRIPTOR
    return file


def _old_file(module: str) -> FileDescriptor:
    """The descriptor the earlier stubs were compiled from, in a pool of its own."""
    proto = descriptor_pb2.FileDescriptorProto.FromString(
        (HERE / f"{stem(module)}.descriptor.bin").read_bytes()
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return pool.FindFileByName(proto.name)


def _case(path: Path) -> tuple[str, str, bool]:
    """``dra_v1.Device.defaults.bin`` -> (module, message name, defaults?)."""
    parts = path.name.removesuffix(".bin").split(".")
    module = next(m for m in MODULES if stem(m) == parts[0])
    return module, parts[1], parts[2:] == ["defaults"]


def test_every_message_with_fields_has_a_golden_case() -> None:
    cases = {(m, name) for m, name, _ in map(_case, GOLDEN)}
    expected = {
        (m, d.name)
        for m in MODULES
        for d in _new_file(m).message_types_by_name.values()
        if d.fields
    }
    assert cases == expected
    assert len(GOLDEN) >= 40


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: p.name)
def test_old_bytes_read_by_new_stub_and_new_bytes_read_by_old(path: Path) -> None:
    module, name, defaults = _case(path)
    golden = path.read_bytes()
    new: Descriptor = _new_file(module).message_types_by_name[name]
    old: Descriptor = _old_file(module).message_types_by_name[name]

    # old -> new: the earlier stub's bytes parse into every field set, nothing left unknown.
    parsed = GetMessageClass(new).FromString(golden)
    assert parsed == fill(new, defaults)
    # new -> old: the new stub writes the same bytes, and the earlier classes read them back.
    wire = fill(new, defaults).SerializeToString(deterministic=True)
    assert wire == golden
    assert GetMessageClass(old).FromString(wire) == fill(old, defaults)


def _shape(file: FileDescriptor) -> dict[str, object]:
    """Everything in a file that decides the bytes and the gRPC paths; no comments, no order."""

    def message(d: Descriptor) -> object:
        fields = {
            f.number: (
                f.name,
                f.type,
                f.is_repeated,
                f.has_presence,
                f.message_type and message(f.message_type),
                f.enum_type and f.enum_type.full_name,
            )
            for f in d.fields
        }
        return (d.full_name, d.GetOptions().map_entry, fields)

    return {
        "package": file.package,
        "messages": {n: message(d) for n, d in file.message_types_by_name.items()},
        "enums": {
            n: {v.name: v.number for v in e.values} for n, e in file.enum_types_by_name.items()
        },
        "services": {
            s.full_name: {
                m.name: (
                    m.input_type.full_name,
                    m.output_type.full_name,
                    m.client_streaming,  # type: ignore[attr-defined]
                    m.server_streaming,  # type: ignore[attr-defined]
                )
                for m in s.methods
            }
            for s in file.services_by_name.values()
        },
    }


@pytest.mark.parametrize("module", MODULES)
def test_descriptor_matches_the_earlier_one(module: str) -> None:
    assert _shape(_new_file(module)) == _shape(_old_file(module))


def test_grpc_paths_are_unchanged() -> None:
    recorded = (HERE / "paths.txt").read_text().split()
    assert [p for m in MODULES for p in method_paths(_new_file(m))] == recorded
    assert "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources" in recorded
    assert "/pluginregistration.Registration/GetInfo" in recorded
    # The generated clients call these paths; the servers register these services.
    stubs = "".join((REPO_ROOT / p.replace(".proto", "_pb2_grpc.py")).read_text() for p in PROTOS)
    for path in recorded:
        assert f"'{path}'" in stubs
        assert f"add_registered_method_handlers('{path[1:].split('/')[0]}'" in stubs

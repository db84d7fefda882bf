"""Small CDI spec files written by hand for plugin tests."""

from __future__ import annotations

from pathlib import Path


def write_spec(spec_dir: Path, uuids: list[str]) -> None:
    """A minimal CDI spec that defines every GPU by UUID."""
    spec_dir.mkdir()
    devices = "".join(
        f"- name: {u}\n  containerEdits:\n    deviceNodes: [{{path: /dev/nvidia{i}}}]\n"
        for i, u in enumerate(uuids)
    )
    (spec_dir / "nvidia.yaml").write_text(
        f"cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n{devices}"
    )

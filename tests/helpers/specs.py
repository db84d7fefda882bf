"""Small CDI spec files written by hand for plugin tests, and the upstream CDI schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.helpers.shared import require_shared


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


def upstream_validator() -> Any:
    """A validator of the CDI project's own JSON schema (``../shared/reference/cdi-schema``);
    skips the calling test where it is absent."""
    import jsonschema
    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT7

    where = require_shared("reference/cdi-schema")
    schema = json.loads((where / "schema.json").read_text())
    defs = json.loads((where / "defs.json").read_text())
    registry = Registry().with_resource("defs.json", Resource.from_contents(defs, DRAFT7))
    return jsonschema.Draft7Validator(schema, registry=registry)


def upstream_schema_errors(spec: Any) -> list[str]:
    """What the upstream CDI schema says of ``spec`` (a generated spec document)."""
    return [e.message for e in upstream_validator().iter_errors(json.loads(json.dumps(spec)))]

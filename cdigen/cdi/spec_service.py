"""The spec service: a node's spec checked against the host, generated, checked and written.

``cdigen generate`` and the device plugin's ``generateSpecs`` both call :func:`node_spec`, so
every guard applies to both: roots that exist and the running driver's libraries
(:func:`cdigen.cdi.checks.check_host`), then the schema and the CDI library's rules, the spec
dir's lock, the refusal of names another spec defines, the atomic write with fsync and the
untouched unchanged file (:func:`cdigen.cdi.write.write_spec`). DRA's per-claim specs take the
same checks through :func:`cdigen.cdi.write.write_claim_spec`, after ``dra serve`` checked the
host once at start.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cdigen.cdi.checks import check_host
from cdigen.cdi.hostfs import HostFS
from cdigen.cdi.names import spec_file_name
from cdigen.cdi.spec import SpecOptions, generate, missing_capability_devices
from cdigen.cdi.types import SpecDoc
from cdigen.cdi.validate import check_spec
from cdigen.cdi.write import WriteResult, write_spec
from cdigen.model import Node


@dataclass(frozen=True)
class NodeSpec:
    """What the service made: the spec, where it went, and what the caller should say."""

    spec: SpecDoc
    written: WriteResult | None  # None: not written (a dry run)
    host_warning: str | None  # e.g. a simulated node: the spec lists device nodes only
    # capabilities asked for as devices that got none: the driver root lacks their files
    missing_capabilities: tuple[str, ...]


def node_spec(
    node: Node,
    options: SpecOptions,
    *,
    source: str,
    fs: HostFS,
    output_dir: Path | None = None,
    fmt: str = "yaml",
    output: Path | None = None,
) -> NodeSpec:
    """Check the host, generate ``node``'s spec and write it to ``output``, or to cdigen's own
    file in ``output_dir``; with neither, only check it (a dry run). ``source`` is where the
    node came from (``nvml``, a node file, ``builtin:…``): a simulated node may lack driver
    libraries, a discovered one may not. InputError, WriteError or SpecConflictError on a
    failed guard; nothing is written then."""
    warning = check_host(
        node,
        source=source,
        driver_root=options.driver_root,
        dev_root=options.dev_root,
        sysfs_root=options.sysfs_root,
        hook_path=options.hook_path,
        fs=fs,
    )
    spec = generate(node, options, fs)
    missing = missing_capability_devices(spec, options)
    if output is None and output_dir is not None:
        output = output_dir / spec_file_name(options.vendor, options.cls, fmt)
    if output is None:
        check_spec(spec, where="generated spec")
        return NodeSpec(spec, None, warning, missing)
    return NodeSpec(spec, write_spec(spec, output, fmt), warning, missing)

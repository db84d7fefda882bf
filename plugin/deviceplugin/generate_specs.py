"""The plugin's CDI spec (``generateSpecs``): written as ``cdigen generate`` writes it, with the
capability devices the resources ask for."""

from __future__ import annotations

import logging
from pathlib import Path

from cdigen.errors import InputError
from cdigen.model import Node
from cdigen.plugin.deviceplugin.config import PluginConfig

log = logging.getLogger("cdigen.plugin")


def write_specs(node: Node, config: PluginConfig) -> Path:
    """Generate the CDI spec for ``node`` into the first spec dir (as ``cdigen generate``)."""
    from cdigen.cdi.driverfiles import find_hook
    from cdigen.cdi.hostfs import HostFS
    from cdigen.cdi.names import capability_device_name, split_kind
    from cdigen.cdi.spec import SpecOptions
    from cdigen.cdi.spec_service import node_spec

    if not config.spec_dirs:
        raise InputError("generateSpecs needs a spec dir", where="specDir")
    vendor, cls = split_kind(config.cdi_kind)
    fs = HostFS(config.host_root)
    options = SpecOptions(
        vendor=vendor,
        cls=cls,
        driver_root=config.driver_root,
        dev_root=config.dev_root,
        sysfs_root=config.sysfs_root,
        host_root=config.host_root,
        hook_path=find_hook(config.driver_root, fs),
        capabilities=config.capabilities,
        capability_devices=config.capability_devices,
    )
    # the guards of `cdigen generate`, the same service: roots, driver libraries, checks, lock
    made = node_spec(node, options, source=config.node, fs=fs, output_dir=config.spec_dirs[0])
    assert made.written is not None
    if made.host_warning:
        log.warning("%s", made.host_warning)
    for cap in made.missing_capabilities:
        log.warning(
            "no %s files under the driver root %s: the CDI spec has no %s device, and "
            "containers of the resources that ask for %s will not start",
            cap,
            config.driver_root,
            capability_device_name(cap),
            cap,
        )
    log.info(
        "%s CDI spec %s (%d devices)",
        "wrote" if made.written.changed else "unchanged",
        made.written.path,
        len(made.spec["devices"]),
    )
    return made.written.path

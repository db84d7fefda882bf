"""What a serving device plugin watches, chosen from its config: the CDI spec dirs (for the
names it hands out), the node source (a node file; NVML or a re-discovery, every
``rescanIntervalSeconds``) and NVML's Xid events. :class:`cdigen.plugin.deviceplugin.runner.Plugin`
polls them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from cdigen.cdi.cache import SpecCache
from cdigen.model import Node
from cdigen.plugin.agent.health import HealthBoard
from cdigen.plugin.agent.health_watchers import NodeWatcher, Pollable, SpecDirWatcher
from cdigen.plugin.agent.xid import XidHealth
from cdigen.plugin.deviceplugin.config import PluginConfig
from cdigen.plugin.deviceplugin.layout import Layout


def is_node_file(source: str) -> bool:
    """True when the node source is a file the plugin can watch for health changes."""
    return source != "nvml" and not source.startswith("builtin:")


class Watchers(NamedTuple):
    """The watchers to poll, and the two the plugin talks to again later."""

    all: list[Pollable]
    spec: SpecDirWatcher | None  # told the new CDI names on a new layout
    xid: XidHealth | None  # started after the servers, stopped with the plugin


def plugin_watchers(
    config: PluginConfig,
    node: Node,
    layout: Layout,
    board: HealthBoard,
    spec_cache: SpecCache,
    *,
    discover: Callable[[str], Node],
    apply_node: Callable[[Node], object],
    rediscover: Callable[[], Node] | None,
    nvml: Any,
) -> Watchers:
    """The watchers of a plugin serving ``layout`` of ``node`` (as its source gave it);
    the spec dirs are read once now, before
    the first device list goes out, and the Xid event set is opened."""
    watchers: list[Pollable] = []
    spec = None
    if config.device_list_strategy != "envvar":  # envvar hands out no CDI names
        names = layout.cdi_names()
        spec = SpecDirWatcher(spec_cache, names, board, config.node)
        spec.poll()  # at startup, before the first device list goes out
        watchers.append(spec)
    if is_node_file(config.node):
        path = Path(config.node)
        watchers.append(NodeWatcher(lambda: discover(str(path)), apply_node, path=path))
    elif rediscover is not None or (config.node == "nvml" and nvml is not None):
        again = rediscover or (lambda: discover(config.node))
        watchers.append(NodeWatcher(again, apply_node, interval_s=config.rescan_interval_s))
    xid = None
    if nvml is not None:
        xid = XidHealth(
            nvml,
            board,
            [g.uuid for g in sorted(node.gpus, key=lambda g: g.index)],
            ignored_xids=config.health.ignored_xids,
            recover_after_s=config.health.recover_after_s,
        )
        xid.open()
        watchers.append(xid)
    return Watchers(watchers, spec, xid)

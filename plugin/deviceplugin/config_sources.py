"""Where the plugin's settings come from, read into overrides (names as in :data:`ENV_VARS`)
that :func:`cdigen.plugin.deviceplugin.config.load_config` applies: the config file's document, the
``CDIGEN_*`` variables (NVIDIA's names read as ours), and the value checks they share with the
flags."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from cdigen.errors import InputError
from cdigen.model import MIG_STRATEGIES
from cdigen.plugin.agent.logs import LOG_FORMATS, LOG_LEVELS
from cdigen.plugin.agent.xid import parse_xids
from cdigen.plugin.deviceplugin.defaults import STRATEGIES

# Environment variables and the overrides they map to (same value rules as the flags).
ENV_VARS = {
    "CDIGEN_NODE": "node",
    "CDIGEN_PLUGIN_DIR": "plugin_dir",
    "CDIGEN_SPEC_DIR": "spec_dirs",  # os.pathsep-separated list
    "CDIGEN_CDI_KIND": "cdi_kind",
    "CDIGEN_DEVICE_LIST_STRATEGY": "device_list_strategy",
    "CDIGEN_POLICY_DIR": "policy_dir",
    "CDIGEN_RESOURCE": "resource",
    "CDIGEN_LOG_LEVEL": "log_level",
    "CDIGEN_LOG_FORMAT": "log_format",
    "CDIGEN_HEALTH_POLL_INTERVAL": "health_poll_interval",
    "CDIGEN_IGNORED_XIDS": "ignored_xids",  # comma-separated
    "CDIGEN_METRICS_ADDRESS": "metrics_address",
    "CDIGEN_MIG_STRATEGY": "mig_strategy",
    "CDIGEN_GENERATE_SPECS": "generate_specs",  # true/false
    "CDIGEN_CAPABILITIES": "capabilities",  # comma-separated, as generate --capabilities
    "CDIGEN_DRIVER_ROOT": "driver_root",
    "CDIGEN_DEV_ROOT": "dev_root",
}


# Config-file keys taken as they are, and the override each sets.
_PLAIN_KEYS = {
    "node": "node",
    "pluginDir": "plugin_dir",
    "cdiKind": "cdi_kind",
    "deviceListStrategy": "device_list_strategy",
    "policyDir": "policy_dir",
    "migStrategy": "mig_strategy",
    "metricsAddress": "metrics_address",
    "generateSpecs": "generate_specs",
    "driverRoot": "driver_root",
    "devRoot": "dev_root",
    "hostRoot": "host_root",
    "rescanIntervalSeconds": "rescan_interval_s",
    "sysfsRoot": "sysfs_root",
    "procRoot": "proc_root",
}


def overrides_from_file(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The overrides a validated config document asks for (keys as in :data:`ENV_VARS`;
    ``resources``: each resource's :class:`~cdigen.plugin.deviceplugin.config.ResourceConfig`
    fields)."""
    out: dict[str, Any] = {}
    for key, name in _PLAIN_KEYS.items():
        if key in doc:
            out[name] = doc[key]
    if "capabilities" in doc:
        caps = doc["capabilities"]
        out["capabilities"] = "all" if "all" in caps else ",".join(caps)
    if "specDir" in doc:
        spec = doc["specDir"]
        out["spec_dirs"] = [spec] if isinstance(spec, str) else list(spec)
    health = doc.get("health", {})
    if "ignoredXids" in health:
        out["ignored_xids"] = list(health["ignoredXids"])
    if "pollIntervalSeconds" in health:
        out["health_poll_interval"] = health["pollIntervalSeconds"]
    if "recoverAfterSeconds" in health:
        out["recover_after_s"] = health["recoverAfterSeconds"]
    log = doc.get("log", {})
    if "level" in log:
        out["log_level"] = log["level"]
    if "format" in log:
        out["log_format"] = log["format"]
    if "resources" in doc:
        from cdigen.plugin.deviceplugin.gpu_selector import selector_from_doc
        from cdigen.plugin.deviceplugin.sharing import sharing_from_doc

        out["resources"] = [
            {
                "name": r["name"],
                "policy": r.get("policy"),
                "sharing": sharing_from_doc(r.get("sharing"), where=f"resources[{i}].sharing"),
                "capabilities": capability_list(
                    r["capabilities"], where=f"resources[{i}].capabilities"
                )
                if "capabilities" in r
                else None,
                "gpus": selector_from_doc(r["gpus"], where=f"resources[{i}].gpus")
                if "gpus" in r
                else None,
            }
            for i, r in enumerate(doc["resources"])
        ]
    return out


def capability_list(value: Any, *, where: str) -> tuple[str, ...]:
    """A config file's capability list (``[compute, graphics]``; ``all`` in it means every
    one); InputError naming ``where`` on an unknown one."""
    from cdigen.cdi.capabilities import CAPABILITIES, parse_capabilities

    if not isinstance(value, list) or not all(isinstance(c, str) for c in value):
        raise InputError(
            f"expected a list of capability names, got {value!r}",
            where=where,
            hint="e.g. [compute, utility, graphics]",
        )
    named = [c for c in value if c != "all"]
    caps = parse_capabilities(",".join(named), where=where) if named or not value else ()
    return CAPABILITIES if "all" in value else caps


def overrides_from_env(env: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for var, name in ENV_VARS.items():
        value = env.get(var)
        if value is None or value == "":
            continue
        if name == "spec_dirs":
            out[name] = [p for p in value.split(os.pathsep) if p]
        elif name == "ignored_xids":
            out[name] = parse_xids(value, where=var)
        elif name == "health_poll_interval":
            out[name] = parse_seconds(value, where=var)
        elif name == "generate_specs":
            out[name] = parse_bool(value, where=var)
        elif name == "capabilities":
            from cdigen.cdi.capabilities import parse_capabilities

            parse_capabilities(value, where=var)  # here, so that the error names the variable
            out[name] = value
        elif name in CHOICES:
            choices, what = CHOICES[name]
            out[name] = check_choice(value, choices, what=what, where=var)
        else:
            out[name] = value
    return out


def parse_bool(text: str, *, where: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise InputError(f"expected true or false, got {text!r}", where=where)


def parse_seconds(value: Any, *, where: str) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = -1.0
    if not 0 < seconds <= 3600:
        raise InputError(f"expected seconds in (0, 3600], got {value!r}", where=where)
    return seconds


def check_choice(
    value: str, choices: tuple[str, ...], *, what: str, where: str | None = None
) -> str:
    if value not in choices:
        raise InputError(
            f"unknown {what} {value!r}", where=where, hint=f"use one of: {', '.join(choices)}"
        )
    return value


CHOICES = {
    "device_list_strategy": (STRATEGIES, "device list strategy"),
    "log_level": (LOG_LEVELS, "log level"),
    "log_format": (LOG_FORMATS, "log format"),
    "mig_strategy": (MIG_STRATEGIES, "MIG strategy"),
}


def with_nvidia_env(env: Mapping[str, str]) -> Mapping[str, str]:
    """``env`` with NVIDIA's variable names read as ours, each use logged as deprecated."""
    from cdigen.plugin.deviceplugin.nvidia_env import NVIDIA_ENV_VARS, nvidia_env

    if not any(env.get(name) for name in NVIDIA_ENV_VARS):
        return env
    import logging

    mapped, lines = nvidia_env(env)
    for line in lines:
        logging.getLogger("cdigen.plugin").warning("%s", line)
    return {**env, **mapped}

"""NVIDIA's device-plugin environment variables, read as the ``CDIGEN_*`` ones where they mean
the same (their DaemonSets set them; ``cdigen plugin serve`` takes them with a deprecation line).
"""

from __future__ import annotations

from collections.abc import Mapping

from cdigen.plugin.deviceplugin.nvidia_format import LIST_STRATEGIES

# Their environment variables that mean the same as ours.
NVIDIA_ENV_VARS = {
    "MIG_STRATEGY": "CDIGEN_MIG_STRATEGY",
    "DEVICE_LIST_STRATEGY": "CDIGEN_DEVICE_LIST_STRATEGY",
    "NVIDIA_DRIVER_ROOT": "CDIGEN_DRIVER_ROOT",
    "NVIDIA_DEV_ROOT": "CDIGEN_DEV_ROOT",
}


def nvidia_env(env: Mapping[str, str]) -> tuple[dict[str, str], tuple[str, ...]]:
    """The ``CDIGEN_*`` variables NVIDIA's names in ``env`` stand for, where ours are unset,
    and one deprecation line per name used."""
    mapped: dict[str, str] = {}
    lines: list[str] = []
    for theirs, ours in NVIDIA_ENV_VARS.items():
        value = env.get(theirs)
        if not value:
            continue
        if theirs == "DEVICE_LIST_STRATEGY":
            value = _env_list_strategy(value)
            if value is None:
                lines.append(
                    f"{theirs}={env[theirs]} has no equivalent here (use {ours}: "
                    f"{', '.join(LIST_STRATEGIES)}); ignored"
                )
                continue
        if env.get(ours):
            lines.append(f"{theirs} is NVIDIA's name; {ours} is set too and wins")
            continue
        mapped[ours] = value
        lines.append(f"{theirs} is NVIDIA's name for {ours}; read it as that (deprecated)")
    return mapped, tuple(lines)


def _env_list_strategy(value: str) -> str | None:
    usable = [n for n in value.split(",") if n.strip() in LIST_STRATEGIES]
    return usable[0].strip() if usable else None

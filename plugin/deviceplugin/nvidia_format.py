"""NVIDIA's device-plugin config format (``version: v1``, k8s-device-plugin api/config/v1) as
cdigen reads it: its keys per level, the values of its settings that mean what cdigen does
anyway, and the strict reader that refuses anything else
(:mod:`cdigen.plugin.deviceplugin.nvidia_config` converts what it reads into ours).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cdigen.errors import InputError, close_match
from cdigen.plugin.deviceplugin.defaults import STRATEGIES

# What cdigen's MPS component (deploy/kubernetes/components/mps) runs the daemon with.
MPS_PIPE_DIRECTORY = "/run/nvidia/mps"
MPS_SHM_DIRECTORY = "/run/nvidia/mps-shm"

# Their list strategies that mean the same here; volume-mounts has no equivalent.
# ours less native, which NVIDIA's plugin has not
LIST_STRATEGIES = tuple(s for s in STRATEGIES if s != "native")
THEIR_LIST_STRATEGIES = (*LIST_STRATEGIES, "volume-mounts")

# The keys of their v1 format, per level (k8s-device-plugin api/config/v1).
TOP_KEYS = ("version", "flags", "resources", "sharing", "imex")
FLAG_KEYS = (
    "migStrategy",
    "failOnInitError",
    "mpsRoot",
    "nvidiaDriverRoot",
    "nvidiaDevRoot",
    "gdsEnabled",
    "mofedEnabled",
    "useNodeFeatureAPI",
    "deviceDiscoveryStrategy",
    "plugin",
    "gfd",
)
PLUGIN_KEYS = (
    "passDeviceSpecs",
    "deviceListStrategy",
    "deviceIDStrategy",
    "cdiAnnotationPrefix",
    "nvidiaCTKPath",
    "containerDriverRoot",
)
SHARING_KEYS = ("timeSlicing", "mps")
REPLICATED_KEYS = ("renameByDefault", "failRequestsGreaterThanOne", "resources")
REPLICATED_RESOURCE_KEYS = ("name", "rename", "devices", "replicas")
RESOURCE_KEYS = ("gpus", "mig")
PATTERN_KEYS = ("pattern", "name")

# Settings whose value cdigen cannot honour: (their value that means what cdigen does anyway,
# what cdigen does instead). A value other than the first is refused unless dropped by request.
FLAGS_AS_OURS: dict[str, tuple[object, str]] = {
    "failOnInitError": (True, "cdigen exits with a one-line error when it cannot start"),
    "gdsEnabled": (False, "no GDS injection; add the GDS devices to the CDI spec yourself"),
    "mofedEnabled": (False, "no MOFED injection"),
    "useNodeFeatureAPI": (False, "node labels come from `cdigen labels` (a feature file)"),
    "mpsRoot": (
        MPS_PIPE_DIRECTORY,
        f"cdigen's MPS directories are {MPS_PIPE_DIRECTORY} and {MPS_SHM_DIRECTORY}",
    ),
    "deviceDiscoveryStrategy": ("auto", "cdigen discovers through NVML (or a node file)"),
}
PLUGIN_FLAGS_AS_OURS: dict[str, tuple[object, str]] = {
    "passDeviceSpecs": (False, "device nodes reach the container through the CDI spec"),
    "deviceIDStrategy": ("uuid", "the kubelet gets GPU UUIDs"),
    "cdiAnnotationPrefix": ("cdi.k8s.io/", "cdigen uses the CDI default prefix cdi.k8s.io/"),
    "nvidiaCTKPath": (None, "cdigen writes its own CDI specs and needs no hook binary"),
    "containerDriverRoot": (None, "use hostRoot/driverRoot: see docs/install.md"),
}
NVML_DISCOVERY = ("auto", "nvml")


class Reader:
    """Their document read strictly: unknown keys and wrong types are refused at once (exit 2);
    settings cdigen cannot express are collected, refused at the end unless dropping them was
    asked for."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.unsupported: list[str] = []
        self.notes: list[str] = []

    def error(self, message: str, path: str, hint: str | None = None) -> InputError:
        return InputError(message, where=f"{self.where}: {path}", hint=hint)

    def mapping(self, value: object, path: str, known: Sequence[str]) -> Mapping[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise self.error(f"expected a mapping, got {shown(value)}", path)
        for key in value:
            if key not in known:
                guess = close_match(str(key), known)
                hint = f"did you mean {guess!r}?" if guess else f"known: {', '.join(known)}"
                raise self.error(f"unknown key {str(key)!r}", _join_path(path, str(key)), hint)
        return value

    def boolean(self, value: object, path: str) -> bool:
        if not isinstance(value, bool):
            quoted = " (a string: write it without quotes)" if isinstance(value, str) else ""
            raise self.error(f"expected true or false, got {shown(value)}{quoted}", path)
        return value

    def string(self, value: object, path: str) -> str:
        if not isinstance(value, str) or not value:
            raise self.error(f"expected a string, got {shown(value)}", path)
        return value

    def entries(self, value: object, path: str, known: Sequence[str]) -> list[Mapping[str, Any]]:
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.error(f"expected a list, got {shown(value)}", path)
        return [self.mapping(e, f"{path}[{i}]", known) for i, e in enumerate(value)]

    def cannot(self, path: str, why: str) -> None:
        self.unsupported.append(f"{path} ({why})")


def _join_path(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def shown(value: object) -> str:
    from cdigen.schemas import describe_value

    return describe_value(value)

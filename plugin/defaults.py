"""The plugin's defaults and choices: no imports, so registering ``cdigen plugin`` stays cheap."""

from __future__ import annotations

DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
DEFAULT_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
DEFAULT_RESOURCE = "nvidia.com/gpu"
DEFAULT_CDI_KIND = "nvidia.com/gpu"
MIG_STRATEGIES = ("none", "single", "mixed")
# the DRA plugin also makes MIG devices per claim (KEP-4815, docs/mig.md)
DRA_MIG_STRATEGIES = (*MIG_STRATEGIES, "dynamic")
STRATEGIES = ("cdi-cri", "cdi-annotations", "envvar", "native")
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")

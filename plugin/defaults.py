"""The plugin's defaults and choices: no imports, so registering ``cdigen plugin`` stays cheap."""

from __future__ import annotations

DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
DEFAULT_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
DEFAULT_RESOURCE = "nvidia.com/gpu"
DEFAULT_CDI_KIND = "nvidia.com/gpu"
STRATEGIES = ("cdi-cri", "cdi-annotations", "envvar", "native")

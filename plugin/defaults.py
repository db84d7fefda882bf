"""The plugin's defaults and choices: light imports only, so registering ``cdigen plugin``
stays cheap."""

from __future__ import annotations

from cdigen.cdi.specdir import DEFAULT_SPEC_DIRS as _SPEC_DIRS

DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
DEFAULT_SPEC_DIRS = tuple(str(d) for d in _SPEC_DIRS)
DEFAULT_RESOURCE = "nvidia.com/gpu"
DEFAULT_CDI_KIND = "nvidia.com/gpu"
STRATEGIES = ("cdi-cri", "cdi-annotations", "envvar", "native")

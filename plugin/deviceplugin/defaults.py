"""The plugin's defaults and choices: light imports only, so registering ``cdigen plugin``
stays cheap."""

from __future__ import annotations

from cdigen.cdi.names import DEFAULT_CLASS, DEFAULT_VENDOR
from cdigen.cdi.specdir import DEFAULT_SPEC_DIRS as _SPEC_DIRS
from cdigen.constants import GPU_RESOURCE, KUBELET_DIR

DEFAULT_PLUGIN_DIR = f"{KUBELET_DIR}/device-plugins"
DEFAULT_SPEC_DIRS = tuple(str(d) for d in _SPEC_DIRS)
DEFAULT_RESOURCE = GPU_RESOURCE
# the CDI kind of the generated specs: the same words as the resource, a different fact
DEFAULT_CDI_KIND = f"{DEFAULT_VENDOR}/{DEFAULT_CLASS}"
STRATEGIES = ("cdi-cri", "cdi-annotations", "envvar", "native")
DEFAULT_STRATEGY = STRATEGIES[0]

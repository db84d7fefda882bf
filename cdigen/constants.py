"""Facts that more than one layer needs (the CDI generator, the policy engine, both wings): each
is defined here once and imported wherever it is used; ``tests/unit/test_one_owner.py`` fails on
a second copy. Light imports only: ``cdigen --help`` reads them."""

from __future__ import annotations

# The DRA driver's default name: its ResourceSlices, DeviceClasses and attribute domain.
DRA_DRIVER = "gpu.cdigen.dev"
# The kubelet's root directory (--root-dir): device-plugins/, plugins/, plugins_registry/ and
# pod-resources/ lie under it.
KUBELET_DIR = "/var/lib/kubelet"
# The extended resource of a whole GPU, as NVIDIA's device plugin names it.
GPU_RESOURCE = "nvidia.com/gpu"
# A mebibyte: memory sizes (NVML, MIG profiles, slices) in bytes.
MIB = 1 << 20

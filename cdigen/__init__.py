"""cdigen: CDI specs, topology-aware allocation and a device plugin for NVIDIA GPUs."""

__version__ = "0.1.0"

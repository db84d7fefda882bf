"""The one-GPU node the CEL dialect tests evaluate against (the reference table's device)."""

from __future__ import annotations

from cdigen.model import Gpu, Node

DEVICE_A = Gpu(
    index=0,
    minor=0,
    uuid="GPU-aaaaaaaa-0000-0000-0000-000000000000",
    name="NVIDIA A100-SXM4-80GB",
    architecture="Ampere",
    cuda_compute_capability="8.0",
    memory_bytes=80 * 2**30,
    pci_bus_id="0000:07:00.0",
    numa_node=3,
)
NODE_A = Node(gpus=(DEVICE_A,), driver_version="550.54.15", cuda_driver_version="12.4")

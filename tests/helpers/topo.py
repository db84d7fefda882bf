"""Made-up ``nvidia-smi topo -m`` texts of any size, for tests and benchmarks."""

from __future__ import annotations


def big_matrix(count: int) -> str:
    """A tab-separated ``topo -m`` of ``count`` GPUs: NVLink within eights, SYS between, eight
    NUMA nodes."""
    head = "\t" + "\t".join(f"GPU{i}" for i in range(count)) + "\tCPU Affinity\tNUMA Affinity"
    rows = [
        f"GPU{i}\t"
        + "\t".join(
            " X " if i == j else "NV12" if i // 8 == j // 8 else "SYS" for j in range(count)
        )
        + f"\t0-15\t{i // 8 % 8}"
        for i in range(count)
    ]
    return "\n".join([head, *rows]) + "\n"

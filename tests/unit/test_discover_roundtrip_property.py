"""Property: any well-formed node survives node file -> load, and the NVML double -> discovery."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdigen.discover import load_node
from cdigen.discover.products import PRODUCTS
from cdigen.model import PCIE_LEVELS, Gpu, Link, MigDevice, Node
from cdigen.nodefile import dump_node, load_node_file
from tests.fakes.fake_pynvml import FakeNvml

PROFILES = ("1g.10gb", "2g.20gb", "3g.40gb", "1c.3g.40gb")


@st.composite
def nodes(draw: st.DrawFn) -> Node:
    count = draw(st.integers(1, 6))
    minors = draw(st.permutations(range(count)))
    buses = draw(st.lists(st.integers(1, 0xFE), min_size=count, max_size=count, unique=True))
    gpus = []
    for index in range(count):
        product = draw(st.sampled_from(PRODUCTS))
        mig = product.architecture in ("Ampere", "Hopper") and draw(st.booleans())
        migs = tuple(
            MigDevice(
                uuid=f"MIG-{draw(st.uuids())}",
                profile=draw(st.sampled_from(PROFILES)),
                gi_id=gi,
                ci_id=draw(st.integers(0, 7)),
                memory_bytes=draw(st.integers(1, 2**36)),
                cap_minors=draw(st.sampled_from([(), (3 + gi * 9, 4 + gi * 9)])),
            )
            for gi in draw(st.lists(st.integers(0, 14), max_size=4, unique=True))
        )
        gpus.append(
            Gpu(
                index=index,
                minor=minors[index],
                uuid=f"GPU-{draw(st.uuids())}",
                name=product.name,
                architecture=product.architecture,
                cuda_compute_capability=product.cuda_compute_capability,
                memory_bytes=draw(st.integers(0, 2**40)),
                pci_bus_id=f"0000:{buses[index]:02x}:00.0",
                numa_node=draw(st.none() | st.integers(0, 200)),
                brand=product.brand,
                mig_enabled=mig,
                mig_devices=migs if mig else (),
            )
        )
    links = []
    for a in range(count):
        for b in range(a + 1, count):
            pcie = draw(st.none() | st.sampled_from(PCIE_LEVELS))
            nvlinks = draw(st.integers(0, 6))
            if pcie is not None or nvlinks:
                links.append(Link(a=a, b=b, pcie=pcie, nvlinks=nvlinks))
    version = draw(st.sampled_from(["550.54.15", "535.129.03", "470.182.03"]))
    cuda = draw(st.sampled_from(["12.4", "12.2", "11.4"]))
    return Node(
        gpus=tuple(gpus), links=tuple(links), driver_version=version, cuda_driver_version=cuda
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes(), st.sampled_from(["yaml", "json"]))
def test_any_node_survives_a_node_file(node: Node, fmt: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"node.{fmt}"
        path.write_text(dump_node(node, fmt))
        assert load_node_file(path) == node


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes(), st.booleans())
def test_any_node_survives_nvml_discovery(node: Node, legacy_bytes: bool) -> None:
    nvml = FakeNvml(node, legacy_bytes=legacy_bytes)
    with tempfile.TemporaryDirectory() as tmp:
        proc = Path(tmp) / "proc"
        nvml.write_host_files(proc_root=proc)
        assert load_node("nvml", sysfs_root=Path(tmp), proc_root=proc, nvml_module=nvml) == node

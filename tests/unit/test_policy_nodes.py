"""The shipped samples agree with the reference nodes of ``tests/helpers/nodes.py``."""

from __future__ import annotations

import pytest

from tests.helpers.nodes import dgx1_v100, dgx2_v100, dgx_a100


@pytest.mark.parametrize("name", ["dgx1-v100", "dgx-a100", "dgx2-v100"])
def test_builtin_samples_agree(name: str) -> None:
    """The shipped samples have the NVLink counts and NUMA nodes of these fixtures."""
    discover = pytest.importorskip("cdigen.discover.builtin")
    if name not in discover.names():
        pytest.skip(f"builtin:{name} not shipped yet")
    ours = {"dgx1-v100": dgx1_v100, "dgx-a100": dgx_a100, "dgx2-v100": dgx2_v100}[name]()
    theirs = discover.load_builtin(name)
    assert [g.numa_node for g in theirs.gpus] == [g.numa_node for g in ours.gpus]
    for link in ours.links:
        other = theirs.link(link.a, link.b)
        assert other is not None and other.nvlinks == link.nvlinks, (link.a, link.b)

"""Topology-aware claims: the example presets under deploy/dra/examples, run through the
scheduler's first fit over the slices cdigen publishes, pick the best-linked set of GPUs the
claim allows, checked by brute force over every subset (policies/graph.py set_score)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from cdigen.discover import load_node
from cdigen.plugin.dra.slices import build_slices
from cdigen.policies.device_view import device_views
from cdigen.policies.dra.claim_docs import Claim, load_manifests
from cdigen.policies.dra.claims import FirstFit
from cdigen.policies.dra.order import engine_order, ordered_views
from cdigen.policies.dra.slice_devices import slice_devices
from cdigen.policies.graph import build_topology

EXAMPLES = Path(__file__).resolve().parents[2] / "deploy" / "dra" / "examples"
DRIVER = "gpu.cdigen.dev"
NODES = ("builtin:dgx1-v100", "builtin:dgx-a100")
PRESETS = (
    "two-gpus-one-nvlink-clique.yaml",
    "four-gpus-one-nvlink-clique.yaml",
    "two-gpus-one-numa-node.yaml",
    "four-gpus-one-numa-node.yaml",
)


def _claim(name: str) -> tuple[Claim, dict[str, object]]:
    claims, classes = load_manifests([EXAMPLES / name, EXAMPLES.parent / "deviceclasses.yaml"])
    (claim,) = claims
    return claim, dict(classes)


@pytest.mark.parametrize("source", NODES)
@pytest.mark.parametrize("preset", PRESETS)
def test_first_fit_over_our_slices_picks_the_best_linked_set_the_preset_allows(
    source: str, preset: str
) -> None:
    node = load_node(source)
    views = ordered_views(device_views(node), node)
    slices = build_slices(views, driver=DRIVER, node_name="n", generation=1)
    claim, classes = _claim(preset)
    fit = FirstFit(slice_devices(slices), classes)  # type: ignore[arg-type]
    allocation = fit.allocate(claim)

    topology = build_topology(node)
    by_name = {v.name: v for v in views}
    (request,) = claim.requests
    (constraint,) = claim.constraints
    attribute = constraint.attribute.rpartition("/")[2]

    def allowed(names: tuple[str, ...]) -> bool:
        values = {
            next(a.value for k, a in by_name[n].attributes.items() if k.endswith(attribute))
            if any(k.endswith(attribute) for k in by_name[n].attributes)
            else None
            for n in names
        }
        return len(values) == 1 and None not in values

    def score(names: tuple[str, ...]) -> int:
        return topology.set_score(
            tuple(topology.position_by_uuid[by_name[n].gpu.uuid] for n in names)
        )

    candidates = [s for s in itertools.combinations(sorted(by_name), request.count) if allowed(s)]
    if not candidates:  # e.g. 4 GPUs on one NUMA node of a DGX A100 (2 GPUs per NUMA node)
        assert allocation.error and not allocation.picks
        return
    best = max(score(s) for s in candidates)
    assert not allocation.error
    assert allowed(allocation.devices)
    assert score(allocation.devices) == best, (allocation.devices, best)


def test_the_nested_order_beats_the_old_greedy_one_on_a_dgx1() -> None:
    # greedy (start at the best-connected GPU) gave 0, 3, 2, 1: a first fit for 2 GPUs took
    # 0+3 (230) while 2+3 are double-linked (250)
    order = engine_order(load_node("builtin:dgx1-v100"))
    assert order[:2] in ((2, 3), (3, 2))
    assert set(order[:4]) == {0, 1, 2, 3}
    assert set(order[4:6]) == {6, 7}
    assert sorted(order) == list(range(8))


def test_excluded_gpus_go_last_and_the_rest_is_reordered() -> None:
    order = engine_order(load_node("builtin:dgx1-v100"), frozenset({2, 6}))
    assert set(order[-2:]) == {2, 6}
    assert sorted(order) == list(range(8))


@pytest.mark.parametrize("source", ["builtin:dgx2-v100", "builtin:pcie-8x4090", "builtin:rtx4090"])
def test_every_builtin_order_is_a_permutation(source: str) -> None:
    node = load_node(source)
    assert sorted(engine_order(node)) == sorted(g.index for g in node.gpus)

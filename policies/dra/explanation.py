"""What ``cdigen dra explain`` prints for one claim: the picks (or why none), then every other
device and why first fit passed it; capacities in binary units. Before any device is looked at,
what refuses the claims as the API server would: selectors it does not compile, and requests
naming a DeviceClass not given."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from cdigen.policies.dra.claim_docs import Claim, DeviceClass
from cdigen.policies.dra.claims import Allocation
from cdigen.sizes import quantity_text


def render_explanation(
    claim: Claim,
    allocation: Allocation,
    reasons: Sequence[tuple[str, str]],
    *,
    node: str,
    link_score: int | None = None,
) -> list[str]:
    """``cdigen dra explain`` output: the picks (or the failure), then every other device and
    why it lost."""
    lines = []
    if allocation.error:
        lines.append(f"claim {claim.name} ({claim.source}) on {node}: not allocatable")
        lines.append(f"  {allocation.error}")
    else:
        picked = ", ".join(allocation.devices)
        lines.append(f"claim {claim.name} ({claim.source}) on {node}: first fit picks {picked}")
        for pick in allocation.picks:
            consumed = ", ".join(
                f"{name.rpartition('/')[2]} {quantity_text(amount)}"
                for name, amount in sorted(pick.consumed.items())
            )
            lines.append(
                f"  {pick.request}: {pick.device}" + (f" (consumes {consumed})" if consumed else "")
            )
        if link_score is not None:
            lines.append(f"  link score of the set: {link_score}")
    if reasons:
        lines.append("not picked:")
        width = max(len(name) for name, _ in reasons)
        lines += [f"  {name:<{width}}  {why}" for name, why in reasons]
    return lines


def refused_at_create(claims: Sequence[Claim], classes: Mapping[str, DeviceClass]) -> list[str]:
    """What the API server refuses when the claims and classes are created, one line each, in
    its words: every selector compiled as it compiles them."""
    from cdigen.policies.cel import CelCompileError, compile_expression
    from cdigen.policies.dra.claims import DEVICE_VARIABLES

    selectors = [s for c in classes.values() for s in c.selectors]
    for claim in claims:
        for request in claim.requests:
            for choice in request.alternatives or (request,):
                selectors += choice.selectors
    lines = []
    for selector in selectors:
        try:
            compile_expression(selector.expression, DEVICE_VARIABLES)
        except CelCompileError as exc:
            lines.append(
                f"{selector.source}: {selector.field}: CEL line {exc.line}, column {exc.column}: "
                f"{exc} (the API server refuses it at create)"
            )
    return lines


def unknown_classes(claims: Sequence[Claim], classes: Mapping[str, DeviceClass]) -> list[str]:
    """A line for each request naming a DeviceClass that is not among ``classes``."""
    from cdigen.policies.dra.check import unknown_class_message

    lines = []
    for claim in claims:
        for request in claim.requests:
            for choice in request.alternatives or (request,):
                if choice.class_name not in classes:
                    lines.append(
                        f"{claim.source}: claim {claim.name}: request {choice.name!r}: "
                        + unknown_class_message(choice.class_name, classes)
                    )
    return lines

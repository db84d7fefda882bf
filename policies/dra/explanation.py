"""What ``cdigen dra explain`` prints for one claim: the picks (or why none), then every other
device and why first fit passed it; capacities in binary units."""

from __future__ import annotations

from collections.abc import Sequence

from cdigen.sizes import quantity_text
from policies.dra.claim_docs import Claim
from policies.dra.claims import Allocation


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

"""The parts of the objective key a set has whatever the request (terms 1, 3 and 4), which
the subset tables sort by; kept apart from :mod:`cdigen.policies.objective` so that
:mod:`cdigen.policies.table` can use them without the two importing each other."""

from __future__ import annotations

# Fragmentation looks at what stays free for the next request: the best set of this size (the
# commonest multi-GPU job after a pair), then the best split into pairs.
NEXT_SET_SIZE = 4

StaticTerms = tuple[int, int, int]


def static_terms(selector_failures: int, link_score: int, numa_span: int) -> StaticTerms:
    """Terms 1, 3 and 4 of the key, which a set has whatever the request: the exact search's
    tables sort by them (then by term 9)."""
    return (selector_failures, -link_score, numa_span)

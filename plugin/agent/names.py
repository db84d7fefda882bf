"""Kubernetes' rules for the names a plugin registers under."""

from __future__ import annotations

import re

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def is_dns_subdomain(text: str, longest: int = 253) -> bool:
    """Whether ``text`` is a DNS subdomain (RFC 1123) of at most ``longest`` characters, as
    Kubernetes requires of resource-name domains (253), node (253) and driver (63) names."""
    return len(text) <= longest and _DNS_SUBDOMAIN.fullmatch(text) is not None

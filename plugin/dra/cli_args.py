"""What the ``cdigen dra`` subcommands share: the default driver name and the checks of their
common options. Light imports only: ``--help`` stays cheap."""

from __future__ import annotations

from cdigen.constants import DRA_DRIVER

DEFAULT_DRIVER = DRA_DRIVER


def dns_subdomain(value: str, flag: str, longest: int = 63, example: str = DEFAULT_DRIVER) -> None:
    """InputError naming ``flag`` unless ``value`` is a DNS subdomain of at most ``longest``
    characters, as Kubernetes requires of driver (63) and node (253) names."""
    from cdigen.errors import InputError, shortened
    from plugin.agent.names import is_dns_subdomain

    if not is_dns_subdomain(value, longest):
        raise InputError(
            f"{shortened(value, 80)!r} is not a DNS subdomain of at most {longest} characters",
            where=flag,
            hint=f"use lowercase letters, digits, '-' and '.', e.g. {example}",
        )


def api_timeout(seconds: float) -> None:
    from cdigen.errors import InputError

    if not seconds > 0 or seconds > 3600:
        raise InputError(
            f"{seconds:g} is not a timeout",
            where="--api-timeout",
            hint="pass seconds between 0 and 3600, e.g. 5",
        )


def quantity_bytes(text: str, flag: str) -> int:
    """``text`` as a positive whole number of bytes; InputError naming ``flag`` otherwise."""
    from cdigen.errors import InputError
    from policies.cel import parse_quantity

    try:
        value = parse_quantity(text)
    except ValueError:
        value = None
    if value is None or value < 1 or value != int(value):
        raise InputError(
            f"{text!r} is not a positive whole quantity of bytes", where=flag, hint="e.g. 1Gi"
        )
    return int(value)

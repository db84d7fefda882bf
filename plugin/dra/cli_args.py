"""What the ``cdigen dra`` subcommands share: the default driver name and the checks of their
common options. Light imports only: ``--help`` stays cheap."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING

from cdigen.constants import DRA_DRIVER
from cdigen.plugin.agent.kubeapi import DEFAULT_API_TIMEOUT_S

if TYPE_CHECKING:
    from cdigen.memory_shares import MemoryShares
    from cdigen.policies.device_view import DeviceView

DEFAULT_DRIVER = DRA_DRIVER


def dns_subdomain(value: str, flag: str, longest: int = 63, example: str = DEFAULT_DRIVER) -> None:
    """InputError naming ``flag`` unless ``value`` is a DNS subdomain of at most ``longest``
    characters, as Kubernetes requires of driver (63) and node (253) names."""
    from cdigen.errors import InputError, shortened
    from cdigen.plugin.agent.names import is_dns_subdomain

    if not is_dns_subdomain(value, longest):
        raise InputError(
            f"{shortened(value, 80)!r} is not a DNS subdomain of at most {longest} characters",
            where=flag,
            hint=f"use lowercase letters, digits, '-' and '.', e.g. {example}",
        )


def add_api_options(parser: argparse.ArgumentParser) -> None:
    """``--kubeconfig`` and ``--api-timeout``, as every ``dra`` subcommand that calls the API
    server takes them (the timeout's default is the API client's own)."""
    parser.add_argument("--kubeconfig", metavar="FILE", help="default: the in-cluster config")
    parser.add_argument(
        "--api-timeout",
        type=float,
        default=DEFAULT_API_TIMEOUT_S,
        metavar="SECONDS",
        help=f"give up on an API server call after this long (default {DEFAULT_API_TIMEOUT_S:g})",
    )


def add_fit_options(
    parser: argparse.ArgumentParser, *, driver_help: str, class_note: str = "", mig_note: str = ""
) -> None:
    """``--class``, ``--driver-name``, ``--mig-strategy`` and the sharing options, as the
    subcommands that fit claims on the devices ``dra serve`` would publish take them (``dra
    check``, ``dra explain``); each names what the driver is to it, and may add a word to the
    defaults of --class and --mig-strategy."""
    from cdigen.memory_shares import add_share_options
    from cdigen.model import DRA_MIG_STRATEGY, MIG_STRATEGIES

    parser.add_argument(
        "--class",
        dest="classes",
        action="append",
        default=[],
        metavar="FILE",
        help="DeviceClass manifest(s); repeatable (default: the classes deploy/dra installs"
        f"{class_note})",
    )
    parser.add_argument(
        "--driver-name",
        default=DEFAULT_DRIVER,
        help=f"{driver_help} (default {DEFAULT_DRIVER})",
    )
    parser.add_argument(
        "--mig-strategy",
        choices=MIG_STRATEGIES,
        default=DRA_MIG_STRATEGY,
        help="how MIG-enabled GPUs are published, as `dra serve --mig-strategy` "
        f"(default {DRA_MIG_STRATEGY}{mig_note})",
    )
    add_share_options(parser.add_argument_group("sharing, as `dra serve` takes it"))


def api_timeout(seconds: float) -> None:
    from cdigen.errors import InputError

    if not seconds > 0 or seconds > 3600:
        raise InputError(
            f"{seconds:g} is not a timeout",
            where="--api-timeout",
            hint="pass seconds between 0 and 3600, e.g. 5",
        )


def shares_problem(shares: MemoryShares | None, views: Sequence[DeviceView]) -> None:
    """InputError naming the flag that set the default share when the API server would refuse
    it for one of the whole GPUs among ``views`` (:func:`cdigen.memory_shares.check_shares`)."""
    from cdigen.memory_shares import check_shares

    check_shares(shares, whole_gpu_memory(views))


def whole_gpu_memory(views: Sequence[DeviceView]) -> dict[str, int]:
    """Memory by device name of the whole GPUs among ``views``."""
    return {v.name: v.capacity.get("memory", 0) for v in views if v.mig is None}

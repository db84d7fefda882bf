"""What the ``cdigen dra`` subcommands share: the default driver name and the checks of their
common options. Light imports only: ``--help`` stays cheap."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from plugin.dra.slices import MemoryShares
    from policies.device_view import DeviceView

DEFAULT_DRIVER = "gpu.cdigen.dev"  # policies.device_view.DRA_DRIVER; kept here so --help is cheap


class _ArgumentAdder(Protocol):
    """A parser or an argument group."""

    def add_argument(self, *names: str, **kwargs: Any) -> Any: ...


def dns_subdomain(
    value: str, flag: str, longest: int = 63, example: str = "gpu.cdigen.dev"
) -> None:
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
    """``text`` as a positive whole number of bytes, spelt as every memory flag takes it
    (:func:`cdigen.sizes.parse_bytes`); InputError naming ``flag`` otherwise."""
    from cdigen.sizes import parse_bytes

    return parse_bytes(text, flag)


def add_share_options(group: _ArgumentAdder) -> None:
    """``--memory-step`` and what a claim that names no memory takes (``--default-share`` or
    ``--shares-per-gpu``): the same flags, one meaning, for ``dra serve``, ``dra explain`` and
    ``labels``."""
    group.add_argument(
        "--memory-step",
        metavar="QUANTITY",
        help="publish whole GPUs as consumable capacity (KEP-5075, Kubernetes 1.36 beta): "
        "several claims each take memory in steps of QUANTITY (e.g. 1Gi or 1GiB)",
    )
    group.add_argument(
        "--default-share",
        metavar="QUANTITY",
        help="with --memory-step: what a claim that names no memory takes of a GPU, e.g. an "
        "unchanged nvidia.com/gpu: 1 pod through the extended-resource class; a multiple of "
        "the step (default: the whole GPU, which such a claim then never shares)",
    )
    group.add_argument(
        "--shares-per-gpu",
        type=int,
        metavar="N",
        help="with --memory-step, instead of --default-share: a claim that names no memory "
        "takes the GPU's memory / N, rounded down to the step",
    )


def memory_shares(args: Any) -> MemoryShares | None:
    """The :class:`MemoryShares` the share options describe (None: no ``--memory-step``);
    InputError for a setting that cannot be published, naming its flag."""
    from cdigen.errors import InputError
    from cdigen.shares import MAX_REPLICAS
    from plugin.dra.slices import MemoryShares, quantity_text

    if args.memory_step is None:
        for flag, value in (("--default-share", args.default_share),
                            ("--shares-per-gpu", args.shares_per_gpu)):  # fmt: skip
            if value is not None:
                raise InputError(
                    "is a size of a memory share, and there are none",
                    where=flag,
                    hint="add --memory-step (e.g. --memory-step 1Gi) to share GPUs by memory",
                )
        return None
    step = quantity_bytes(args.memory_step, "--memory-step")
    if args.default_share is not None and args.shares_per_gpu is not None:
        raise InputError(
            "and --shares-per-gpu both say what a claim naming no memory takes",
            where="--default-share",
            hint="give one of them",
        )
    default = None
    if args.default_share is not None:
        default = quantity_bytes(args.default_share, "--default-share")
        if default % step:
            low = default // step * step
            near = [quantity_text(v) for v in (low, low + step) if v]
            raise InputError(
                f"{args.default_share!r} is not a whole number of --memory-step "
                f"{quantity_text(step)}",
                where="--default-share",
                hint=f"give a multiple of the step, e.g. {' or '.join(near)}",
            )
    if args.shares_per_gpu is not None and not 1 <= args.shares_per_gpu <= MAX_REPLICAS:
        raise InputError(
            f"{args.shares_per_gpu} is not in 1-{MAX_REPLICAS}", where="--shares-per-gpu"
        )
    return MemoryShares(step=step, default=default, per_gpu=args.shares_per_gpu)


def shares_problem(shares: MemoryShares | None, views: Sequence[DeviceView]) -> None:
    """InputError naming the flag that set the default when it cannot be published for one of
    ``views`` (a default above a GPU's memory, N shares below one step each)."""
    from cdigen.errors import InputError

    problem = shares.refusal(views) if shares is not None else ""
    if problem:
        flag = "--shares-per-gpu" if shares and shares.per_gpu else "--default-share"
        raise InputError(problem, where=flag, hint="give a smaller share, or fewer shares")

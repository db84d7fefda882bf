"""Memory shares of whole GPUs, as ``cdigen dra serve --memory-step`` publishes them
(consumable capacity, KEP-5075): the step, what a claim that names no memory takes, and the
flags that say so. One owner for ``dra serve``, ``dra explain`` and ``labels``.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from cdigen.constants import MIB
from cdigen.errors import InputError
from cdigen.shares import MAX_REPLICAS
from cdigen.sizes import parse_bytes, quantity_text

MAX_SHARES_PER_GPU = MAX_REPLICAS  # as many as the device plugin's replicas


@dataclass(frozen=True)
class MemoryShares:
    """Whole GPUs published for consumable capacity: each allows multiple allocations and its
    ``memory`` is consumed in ``step`` bytes.

    What a request that names no memory takes (the capacity's ``requestPolicy.default``) is the
    operator's: ``default`` bytes, or with ``per_gpu`` N the GPU's memory / N rounded down to the
    step, or, with neither, the whole GPU (all the steps it has), so that such a claim never
    shares its GPU.
    """

    step: int = 1 << 30
    default: int | None = None
    per_gpu: int | None = None

    def top(self, total: int) -> int:
        """The most a claim may take of a GPU with ``total`` bytes: whole steps."""
        return total - total % self.step

    def shares(self, total: int) -> bool:
        """Whether a GPU of ``total`` bytes is published as shares: the API server refuses a
        range whose ``min + step`` is above the capacity."""
        return total >= 2 * self.step

    def default_for(self, total: int) -> int:
        """What a request naming no memory takes of a GPU with ``total`` bytes."""
        if self.default is not None:
            return self.default
        if self.per_gpu:
            return total // self.per_gpu // self.step * self.step
        return self.top(total)

    def described(self) -> str:
        """The setting, for a note: ``6Gi``, ``1/4 of the GPU's memory, in whole steps``,
        ``the whole GPU``."""
        if self.default is not None:
            return quantity_text(self.default)
        if self.per_gpu:
            return f"1/{self.per_gpu} of the GPU's memory, in whole steps"
        return "the whole GPU"

    def refusal(self, totals: Mapping[str, int]) -> str:
        """Why the default cannot be published for one of the whole GPUs ``totals`` (memory by
        name) as the API server would refuse it (a default within min..max, on a step), or
        ""."""
        for name, total in totals.items():
            if not self.shares(total):
                continue
            amount, top = self.default_for(total), self.top(total)
            if amount < self.step or amount > top:
                return (
                    f"a claim naming no memory would take {quantity_text(amount)} of {name}, "
                    f"which offers {quantity_text(self.step)} to {quantity_text(top)} in steps "
                    f"of {quantity_text(self.step)}"
                )
        return ""

    def policy(self, total: int) -> dict[str, Any]:
        """The ``requestPolicy`` of a GPU with ``total`` bytes of memory."""
        return {
            "default": quantity_text(self.default_for(total)),
            "validRange": {
                "min": quantity_text(self.step),
                "max": quantity_text(self.top(total)),
                "step": quantity_text(self.step),
            },
        }

    def labels(self, totals: Mapping[str, int]) -> dict[str, str]:
        """``dra.memory-step`` and ``dra.default-share`` (MiB, as GFD writes memory; under
        ``cdigen.dev/``): the step and what a claim that names no memory (an unchanged
        ``nvidia.com/gpu: 1`` pod) takes, the least over the shared GPUs; none if none is."""
        defaults = [self.default_for(t) for t in totals.values() if self.shares(t)]
        if not defaults:
            return {}
        return {
            "dra.memory-step": str(self.step // MIB),
            "dra.default-share": str(min(defaults) // MIB),
        }


class ArgumentAdder(Protocol):
    """A parser or an argument group."""

    def add_argument(self, *names: str, **kwargs: Any) -> Any: ...


def add_share_options(group: ArgumentAdder) -> None:
    """``--memory-step`` and what a claim that names no memory takes (``--default-share`` or
    ``--shares-per-gpu``): the same flags, one meaning, wherever they are taken."""
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


def memory_shares(args: argparse.Namespace) -> MemoryShares | None:
    """The :class:`MemoryShares` the share options describe (None: no ``--memory-step``);
    InputError for a setting that cannot be published, naming its flag."""
    if args.memory_step is None:
        for flag, value in (("--default-share", args.default_share),
                            ("--shares-per-gpu", args.shares_per_gpu)):  # fmt: skip
            if value is not None:
                raise InputError(
                    "needs --memory-step: without it no GPU is shared by memory",
                    where=flag,
                    hint="add --memory-step, e.g. --memory-step 1Gi",
                )
        return None
    step = parse_bytes(args.memory_step, "--memory-step")
    if args.default_share is not None and args.shares_per_gpu is not None:
        raise InputError(
            "cannot go with --shares-per-gpu: both set what a claim naming no memory takes",
            where="--default-share",
            hint="give one of them",
        )
    default = None
    if args.default_share is not None:
        default = parse_bytes(args.default_share, "--default-share")
        if default % step:
            low = default // step * step
            near = [quantity_text(v) for v in (low, low + step) if v]
            raise InputError(
                f"{args.default_share!r} is not a whole number of --memory-step "
                f"{quantity_text(step)}",
                where="--default-share",
                hint=f"give a multiple of the step, e.g. {' or '.join(near)}",
            )
    if args.shares_per_gpu is not None and not 1 <= args.shares_per_gpu <= MAX_SHARES_PER_GPU:
        raise InputError(
            f"{args.shares_per_gpu} is not in 1-{MAX_SHARES_PER_GPU}", where="--shares-per-gpu"
        )
    return MemoryShares(step=step, default=default, per_gpu=args.shares_per_gpu)


def check_shares(shares: MemoryShares | None, totals: Mapping[str, int]) -> None:
    """InputError naming the flag that set the default when it cannot be published for one of
    the whole GPUs ``totals`` (a default above a GPU's memory, N shares below one step each)."""
    problem = shares.refusal(totals) if shares is not None else ""
    if problem:
        flag = "--shares-per-gpu" if shares and shares.per_gpu else "--default-share"
        raise InputError(problem, where=flag, hint="give a smaller share, or fewer shares")

"""The claim commands of ``cdigen dra``: ``explain`` and ``check`` (offline claim tools,
:mod:`plugin.dra.explain_cli`, :mod:`plugin.dra.check_cli`) and ``why`` (a live cluster,
:mod:`plugin.dra.why_cli`)."""

from __future__ import annotations

import argparse

from plugin.dra.check_cli import register_check
from plugin.dra.explain_cli import register_explain
from plugin.dra.why_cli import register_why


def register(dra_sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``dra explain``, ``dra check`` and ``dra why`` to ``dra_sub``."""
    register_explain(dra_sub)
    register_check(dra_sub)
    register_why(dra_sub)

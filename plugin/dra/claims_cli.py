"""The claim commands of ``cdigen dra``: ``explain`` and ``check`` (offline claim tools,
:mod:`cdigen.plugin.dra.explain_cli`, :mod:`cdigen.plugin.dra.check_cli`) and ``why`` (a live
cluster,
:mod:`cdigen.plugin.dra.why_cli`)."""

from __future__ import annotations

import argparse

from cdigen.plugin.dra.check_cli import register_check
from cdigen.plugin.dra.explain_cli import register_explain
from cdigen.plugin.dra.why_cli import register_why


def register(dra_sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``dra explain``, ``dra check`` and ``dra why`` to ``dra_sub``."""
    register_explain(dra_sub)
    register_check(dra_sub)
    register_why(dra_sub)

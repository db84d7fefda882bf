"""Subcommands of this part (being written)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add this part's subcommands to ``sub``."""

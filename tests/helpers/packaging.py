"""Where pyproject.toml's packages come from in the checkout, and go to in the wheel."""

from __future__ import annotations

import tomllib
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@cache
def package_folders() -> dict[str, str]:
    """Each package pyproject lists -> its folder in the checkout (relative), by the
    ``package-dir`` mapping as setuptools reads it: the longest mapped prefix wins."""
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"][
        "setuptools"
    ]
    mapped: dict[str, str] = setuptools.get("package-dir", {})
    out = {}
    for package in setuptools["packages"]:
        parts = package.split(".")
        for cut in range(len(parts), 0, -1):
            prefix = ".".join(parts[:cut])
            if prefix in mapped:
                out[package] = "/".join([mapped[prefix], *parts[cut:]])
                break
        else:
            out[package] = "/".join(parts)
    return out


def wheel_path(folder: str) -> str:
    """Where the checkout's ``folder`` (e.g. ``policies/builtin``) is in the wheel."""
    best = max(
        (p for p, f in package_folders().items() if folder == f or folder.startswith(f + "/")),
        key=lambda p: len(package_folders()[p]),
    )
    rest = folder.removeprefix(package_folders()[best]).lstrip("/")
    return "/".join([best.replace(".", "/"), *([rest] if rest else [])])

"""Files cdigen ships as package data that live elsewhere in the repository (pyproject's
``package-dir`` maps them), found where the install put them."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from cdigen.errors import InputError

_CHECKOUT = Path(__file__).resolve().parent.parent


def shipped_file(package: str, name: str, *, checkout: str) -> Path:
    """The file ``name`` of package-data package ``package`` (e.g. ``cdigen.dra_files``).

    An install (wheel or editable) has the package; a checkout run without one
    (``PYTHONPATH=.``) has the file at ``checkout``, relative to the repository root. A missing
    file is an install without it: InputError saying so.
    """
    try:
        found = files(package).joinpath(name)
    except ModuleNotFoundError:
        found = _CHECKOUT / checkout
    if isinstance(found, Path) and found.is_file():
        return found
    raise InputError(
        f"{name} is not installed with cdigen ({package})",
        hint="reinstall cdigen (pip install .), or name the file explicitly",
    )

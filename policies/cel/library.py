"""Every extension function of the Kubernetes CEL dialect, by the name CEL calls it: the core
(:mod:`policies.cel.functions`), the strings and regex libraries, the lists and sets libraries,
and Kubernetes' URL, IP/CIDR and named-format libraries."""

from __future__ import annotations

from typing import Any

from policies.cel.functions import CORE_FUNCTIONS
from policies.cel.lists_library import LIST_FUNCTIONS
from policies.cel.named_formats import FORMAT_FUNCTIONS
from policies.cel.network import NETWORK_FUNCTIONS
from policies.cel.strings_library import STRING_FUNCTIONS
from policies.cel.urls import URL_FUNCTIONS

FUNCTIONS: dict[str, Any] = {
    **CORE_FUNCTIONS,
    **STRING_FUNCTIONS,
    **LIST_FUNCTIONS,
    **URL_FUNCTIONS,
    **NETWORK_FUNCTIONS,
    **FORMAT_FUNCTIONS,
}

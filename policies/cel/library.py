"""Every extension function of the Kubernetes CEL dialect, by the name CEL calls it: the
operators, Kubernetes' quantity and semver libraries, the strings and regex libraries, the lists
and sets libraries, and Kubernetes' URL, IP/CIDR and named-format libraries."""

from __future__ import annotations

from typing import Any

from cdigen.policies.cel.lists_library import LIST_FUNCTIONS
from cdigen.policies.cel.named_formats import FORMAT_FUNCTIONS
from cdigen.policies.cel.network import NETWORK_FUNCTIONS
from cdigen.policies.cel.operators import OPERATOR_FUNCTIONS
from cdigen.policies.cel.quantity_semver_library import QUANTITY_SEMVER_FUNCTIONS
from cdigen.policies.cel.strings_library import STRING_FUNCTIONS
from cdigen.policies.cel.urls import URL_FUNCTIONS

FUNCTIONS: dict[str, Any] = {
    **OPERATOR_FUNCTIONS,
    **QUANTITY_SEMVER_FUNCTIONS,
    **STRING_FUNCTIONS,
    **LIST_FUNCTIONS,
    **URL_FUNCTIONS,
    **NETWORK_FUNCTIONS,
    **FORMAT_FUNCTIONS,
}

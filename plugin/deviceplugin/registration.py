"""One registration with the kubelet: the ``Register`` call and how it failed, and the names
the kubelet checks (the resource name, our socket's file name).
:mod:`cdigen.plugin.deviceplugin.kubelet` decides when to register."""

from __future__ import annotations

import re
import threading
from pathlib import Path

from cdigen.errors import CdigenError
from cdigen.plugin.agent.names import is_dns_subdomain

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"

_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")


class RegistrationError(CdigenError):
    """Registration did not happen (one of the three kinds below)."""


class KubeletRefused(RegistrationError):
    """The kubelet answered ``Register`` with an error: it refused the registration."""


class KubeletUnreachable(RegistrationError):
    """No answer from the kubelet: its socket refused the connection or the connection broke."""


class RegistrationTimeout(RegistrationError):
    """Our own deadline passed before the kubelet answered ``Register``."""


class RegistrationCancelled(RegistrationError):
    """We gave up on a registration in flight because the plugin is stopping."""


def resource_name_problem(name: str) -> str | None:
    """Why the kubelet would refuse ``name`` as an extended resource, or None if it is fine."""
    if "/" not in name:
        return f"resource name {name!r} has no domain (DOMAIN/NAME)"
    domain, _, short = name.partition("/")
    if domain == "kubernetes.io" or domain.endswith(".kubernetes.io"):
        return f"resource name {name!r} uses a kubernetes.io domain, reserved for native resources"
    if name.startswith("requests."):
        return f"resource name {name!r} must not start with 'requests.'"
    if not is_dns_subdomain(domain):
        return f"resource name {name!r}: {domain!r} is not a DNS subdomain"
    # The kubelet checks that "requests.<name>" is a qualified name: the part after the slash is
    # at most 63 characters of [-A-Za-z0-9_.], starting and ending alphanumeric.
    if len(short) > 63 or not _QUALIFIED_NAME.match(short):
        return f"resource name {name!r}: {short!r} is not a valid name (63 chars, [-A-Za-z0-9_.])"
    return None


def socket_name(resource: str) -> str:
    """The file name of our socket for ``resource``: ``cdigen-nvidia.com-gpu.sock``."""
    return "cdigen-" + resource.replace("/", "-") + ".sock"


# Status codes that mean the call never got an answer from the kubelet's Register handler: the
# transport failed (UNAVAILABLE, INTERNAL for a broken HTTP/2 stream, CANCELLED by the far side)
# or our deadline passed. A handler that returns an error gives UNKNOWN (a plain Go error) or the
# code it chose: that, and only that, is a refusal.
_NOT_ANSWERED = frozenset({"UNAVAILABLE", "INTERNAL", "CANCELLED"})

# The kubelet dials back to the plugin inside Register with a 10 s timeout of its own; our
# deadline is longer, so that the kubelet always answers first (a refusal we can retry) and never
# finishes a registration we already gave up on (which would leave it with two).
REGISTER_TIMEOUT_S = 15.0


def register(
    plugin_dir: Path,
    *,
    endpoint: str,
    resource_name: str,
    timeout_s: float = REGISTER_TIMEOUT_S,
    cancel: threading.Event | None = None,
) -> None:
    """Register once with ``plugin_dir/kubelet.sock``.

    Raises :class:`KubeletRefused` when the kubelet's ``Register`` answered with an error,
    :class:`KubeletUnreachable` when it could not be reached, :class:`RegistrationTimeout` when our
    deadline passed first, and :class:`RegistrationCancelled` when ``cancel`` was set meanwhile.
    """
    import grpc

    from cdigen.plugin.deviceplugin.api import deviceplugin_pb2 as pb
    from cdigen.plugin.deviceplugin.api import deviceplugin_pb2_grpc as pb_grpc

    kubelet = plugin_dir / KUBELET_SOCKET
    request = pb.RegisterRequest(
        version=API_VERSION,
        endpoint=endpoint,
        resource_name=resource_name,
        options=pb.DevicePluginOptions(
            pre_start_required=False, get_preferred_allocation_available=True
        ),
    )
    with grpc.insecure_channel("unix:" + str(kubelet)) as channel:
        # Not wait_for_ready: a socket that refuses connections fails the call at once.
        call = pb_grpc.RegistrationStub(channel).Register.future(request, timeout=timeout_s)
        finished = threading.Event()
        call.add_done_callback(lambda _: finished.set())
        while not finished.wait(0.05):
            if cancel is not None and cancel.is_set():
                call.cancel()
                raise RegistrationCancelled(
                    f"registration of {resource_name} cancelled: the plugin is stopping",
                    where=str(kubelet),
                )
        if call.cancelled():  # only we cancel a call, and only above
            raise RegistrationCancelled(f"registration of {resource_name} cancelled")
        if call.code() != grpc.StatusCode.OK:
            raise _failure(call.code().name, call.details(), resource_name, kubelet, timeout_s)


def _failure(
    code: str, details: str | None, resource_name: str, kubelet: Path, timeout_s: float
) -> RegistrationError:
    """What a ``Register`` call that ended with the status ``code`` means."""
    details = details or code
    if code == "DEADLINE_EXCEEDED":
        return RegistrationTimeout(
            f"no answer to Register for {resource_name} within {timeout_s:g} s",
            where=str(kubelet),
            hint="the kubelet is slow or stuck; retrying",
        )
    if code in _NOT_ANSWERED:
        return KubeletUnreachable(
            f"kubelet not reachable ({code.lower()}: {details})",
            where=str(kubelet),
            hint="is the kubelet running?",
        )
    return KubeletRefused(
        f"kubelet refused registration of {resource_name}: {details}", where=str(kubelet)
    )

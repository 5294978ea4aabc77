"""How the ``policystore`` command joins a running Ray cluster: what a cluster address may be, and one quick look at
the cluster's GCS before ``ray.init`` (which, given a wrong address or token, retries for about 20 s and prints a
warning per try).

Token authentication (Ray 2.60 turns it on for every cluster a plain ``ray.init()`` or ``ray start`` creates): the
command reads the token the way Ray does, from ``RAY_AUTH_TOKEN``, else the file named by ``RAY_AUTH_TOKEN_PATH``,
else ``~/.ray/auth_token`` (where the head node wrote it). ``ray.init(address=HOST:PORT)`` sends it only with
``RAY_AUTH_MODE=token`` set; the command sets that for itself when it has a token and ``RAY_AUTH_MODE`` is unset,
so it joins whatever ``ray.init()`` on the same machine joins, and a cluster with authentication off accepts the
token too.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

from ..errors import StoreUnavailableError
from .output import UsageError

if TYPE_CHECKING:
    import grpc

PROBE_TIMEOUT_S = 3.0  # a GCS that takes longer to answer one small call is as good as down
_HOST_PORT = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")
AUTH_HELP = ("set RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH, a file) to the cluster's token: `ray get-auth-token` "
             "prints it on the head node")


def check_address(address: str, option: str = "--address") -> str:
    """``address`` if it names a running cluster as ``ray.init(address=...)`` takes it (HOST:PORT, ``auto``, or
    ``ray://HOST:PORT``); else UsageError (exit 2). ``local`` would start a new, empty cluster: refused."""
    if address == "auto" or address.startswith("ray://") and _HOST_PORT.match(address.removeprefix("ray://")):
        return address
    match = _HOST_PORT.match(address)
    if match is None or not 0 < int(match.group(2)) < 65536:
        hint = " (it starts a new, empty cluster)" if address == "local" else ""
        raise UsageError(f"{option} {address!r}{hint}: expected the head node's GCS address HOST:PORT (as `ray status` "
                         "or ray.init() prints it), auto, or ray://HOST:PORT")
    return address


def prepare(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Make sure ``ray.init(address)`` will get in, in seconds: the GCS answers and accepts this process's token
    (StoreUnavailableError naming the fix otherwise); turn on token mode for it when a token is at hand. Addresses
    Ray resolves itself (``auto``, ``ray://``) are left to Ray."""
    if not _HOST_PORT.match(address):
        return
    import grpc
    from ray._raylet import AuthenticationTokenLoader  # Ray's own token lookup: env, token file, ~/.ray
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    loader = AuthenticationTokenLoader.instance()
    mode = os.environ.get("RAY_AUTH_MODE")
    send = mode in (None, "token") and loader.has_token(ignore_auth_mode=True)
    metadata = list(loader.get_token_for_http_header().items()) if send else []
    with grpc.insecure_channel(address) as channel:
        try:
            gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).GetClusterId(
                gcs_service_pb2.GetClusterIdRequest(), timeout=timeout_s, metadata=metadata)
        except grpc.RpcError as exc:
            raise _refusal(address, exc, sent=send, mode=mode) from None
    if send and mode is None:  # ray.init sends the token only in token mode: turn it on as Ray's own setup does
        from ray._raylet import Config

        os.environ["RAY_AUTH_MODE"] = "token"
        Config.initialize("")


def _refusal(address: str, exc: grpc.RpcError, *, sent: bool, mode: str | None) -> StoreUnavailableError:
    import grpc

    if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
        if sent:
            why = "refused this machine's token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token)"
        elif mode not in (None, "token"):
            why = f"wants a token, and RAY_AUTH_MODE={mode} here sends none: unset it and {AUTH_HELP}"
            return StoreUnavailableError(f"the Ray cluster at {address} {why}")
        else:
            why = "wants a token, and this machine has none"
        return StoreUnavailableError(f"the Ray cluster at {address} {why}: {AUTH_HELP}")
    return StoreUnavailableError(
        f"no Ray cluster answers at {address} ({exc.details() or exc.code().name}): start one (ray start --head) or "
        "give the head node's address (ray status prints it)")

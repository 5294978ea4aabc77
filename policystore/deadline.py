"""Deadlines on remote calls: a call to an actor that does not answer in time is a DeadlineExceededError naming
the actor and the call, never a wait without end (a stopped catalog, a store stuck on a slow tier)."""

from __future__ import annotations

from typing import Any

import ray

from .errors import DeadlineExceededError


def wait(ref: ray.ObjectRef, timeout_s: float, what: str, call: str) -> Any:
    """``ray.get(ref)`` within ``timeout_s``; ``what`` names the actor and ``call`` its method in the error."""
    try:
        return ray.get(ref, timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        raise DeadlineExceededError(
            f"the {what} did not answer {call}() within {timeout_s:g} s (StoreConfig.call_timeout_s); it may be "
            "overloaded, stopped, or waiting on a slow tier"
        ) from None

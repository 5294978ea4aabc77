"""What test modules share besides fixtures: waiting for something to happen, always with a deadline."""

import time

import ray

from policystore import StoreUnavailableError

# ignore=: an actor coming back (Ray's errors on a raw call, StoreUnavailableError on the store's API)
RESTARTING = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError, StoreUnavailableError)
WAIT_S = 120.0  # how long a condition may take to come true on a loaded machine (not a timing claim)


def eventually(predicate, what: str = "the condition", timeout_s: float = WAIT_S, *, ignore=(), every_s=0.05):
    """``predicate()``'s first true value, asked again every ``every_s`` until ``timeout_s`` has passed, then
    AssertionError naming ``what``. Exceptions of the types in ``ignore`` (an actor restarting, say) count as
    not yet."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = predicate()
            if value:
                return value
        except ignore:
            pass
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        time.sleep(every_s)

"""How the store and the catalog run as Ray actors: their own methods on threads, their doorbell's waits as
coroutines, in one process.

Ray runs an actor's methods on threads (a threaded actor) or, once any method is a coroutine, all on event loops
(one per concurrency group), where a method that blocks stalls the others of its group. The store and the catalog
block (locks, disk, calls to each other), so they keep threads; their followers (every reader process, every
node's store) wait for news as coroutines, which hold no thread. A doorbell actor of its own beside each of them
was a second Ray worker process per node, about as big as the store. ``actor_class(cls, ...)`` is the one Ray
actor that does both: each public method of ``cls`` runs, unchanged, on a thread pool of its concurrency group
(the threads Ray would give a threaded actor's group), and ``bell_wait``/``bell_after_beats`` wait on the
instance's ``bell`` (``watch.Doorbell``) as coroutines of a group of their own.

The Ray actor is a facade over one instance of ``cls``: that instance's own calls to its methods stay plain calls,
and attributes read or set on the facade (``__ray_call__``) are the instance's.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import os
from collections.abc import Callable, Collection
from typing import Any

import ray

BELL_GROUP = "bell"  # the concurrency group of the followers' waits: coroutines, no threads
# Followers one doorbell serves at once: one coroutine each (no thread), so this only bounds a runaway caller.
MAX_WAITERS = 100_000


def actor_class(cls: type, threads: dict[str | None, int]) -> Any:
    """``cls`` as a Ray actor class that hosts its doorbell: ``threads`` maps each concurrency group (None: the
    default one) to its threads; the actor's options must give the default group the same ``max_concurrency``."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        # Ray warns once of a blocking ray.get in an async actor: here they run on the pools' threads, as intended
        os.environ["RAY_WARN_BLOCKING_GET_INSIDE_ASYNC"] = "0"
        object.__setattr__(self, "_hosted", cls(*args, **kwargs))
        object.__setattr__(self, "_pools", {
            group: concurrency_pool(n, group or "calls") for group, n in threads.items()})

    # (Ray's own class objects derive from this class too: they have no ``_hosted`` and keep their attributes)
    def __getattr__(self: Any, name: str) -> Any:
        hosted = self.__dict__.get("_hosted")
        if hosted is None:
            raise AttributeError(name)
        return getattr(hosted, name)

    def __setattr__(self: Any, name: str, value: Any) -> None:
        hosted = self.__dict__.get("_hosted")
        if hosted is None:
            object.__setattr__(self, name, value)
        else:
            setattr(hosted, name, value)

    @ray.method(concurrency_group=BELL_GROUP)
    async def bell_wait(self: Any, since: int, epoch: Any, timeout_s: float,
                        follows: Collection[str] | None = None) -> Any:
        """``watch.Doorbell.wait`` on this actor's doorbell."""
        return await self._hosted.bell.wait(since, epoch, timeout_s, follows)

    @ray.method(concurrency_group=BELL_GROUP)
    async def bell_after_beats(self: Any, since: int, epoch: str, timeout_s: float) -> Any:
        """``watch.Doorbell.after_beats`` on this actor's doorbell."""
        return await self._hosted.bell.after_beats(since, epoch, timeout_s)

    namespace: dict[str, Any] = {
        "__init__": __init__, "__getattr__": __getattr__, "__setattr__": __setattr__, "__doc__": cls.__doc__,
        "__module__": cls.__module__, "__qualname__": cls.__qualname__,
        "bell_wait": bell_wait, "bell_after_beats": bell_after_beats,
    }
    for name, fn in inspect.getmembers(cls, inspect.isfunction):
        if not name.startswith("_"):
            namespace[name] = _on_threads(fn, getattr(fn, "__ray_concurrency_group__", None))
    facade = type(cls.__name__, (), namespace)
    return ray.remote(concurrency_groups={
        **{g: n for g, n in threads.items() if g is not None}, BELL_GROUP: MAX_WAITERS})(facade)


def concurrency_pool(threads: int, name: str) -> concurrent.futures.ThreadPoolExecutor:
    return concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix=f"policystore-{name}")


def _on_threads(fn: Callable[..., Any], group: str | None) -> Callable[..., Any]:
    """``fn`` (a method of the hosted class) as a coroutine method of the facade that runs it on ``group``'s pool;
    it keeps ``fn``'s name, signature and Ray options (``functools.wraps`` copies them)."""

    @functools.wraps(fn)
    async def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        call = functools.partial(fn, self._hosted, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._pools[group], call)

    return method

"""Every call the package makes to a Ray actor, and the actors' names: one owner for deadlines and Ray's errors.

``call(actor, "method", *args, timeout_s=...)`` runs a method and waits for its answer at most ``timeout_s``;
``begin`` is ``call`` started now and waited for later; ``send`` starts one whose answer nobody waits for (or that
``get`` waits for later, with a deadline). Ray's own errors never reach a caller: a call without an answer in time
is a DeadlineExceededError naming the actor and the method, an actor that stopped or cannot be reached is a
StoreUnavailableError (Ray's error kept as its cause), an actor whose start failed raises its own policystore error,
and a policystore error raised inside the actor is raised here as itself. Calls that are safe to repeat pass
``retry_s`` to be asked again while Ray restarts the actor.

The project's actors are named, detached and found by name (``start`` finds the running one or starts it; creation
is atomic in Ray's GCS), in one Ray namespace whatever the league; their names carry the league.
"""

from __future__ import annotations

import concurrent.futures
import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

import ray
from ray.actor import ActorHandle

from . import errors, hosting
from .config import DEFAULT_LEAGUE
from .errors import DeadlineExceededError, PolicyStoreError, StoreUnavailableError, brief

WATCH_GROUP = "watch"  # the stores' and the catalog's concurrency group of the calls their followers make
NAMESPACE = "policystore"  # the Ray namespace of every league's actors (their names carry the league)
CATALOG_NAME = "policystore-catalog"  # the default league's catalog
_STORE_PREFIX = "policystore-"
_RETRY_EVERY_S = 0.1  # between the attempts of a call asked again while its actor restarts
_POLL_S = 0.1  # how often a stoppable wait checks whether to stop
_SETTING = "StoreConfig.call_timeout_s"  # what sets the deadlines of calls to the project's own actors
# glibc gives each thread of a process its own malloc arena (up to 8 per core), and a Ray worker's threads all take
# one before an actor's __init__ runs; each arena keeps the high-water mark of the calls that ran on it. Two arenas
# halved the store's growth and all but stopped the catalog's over a churning RLlib league (docs/rllib.md). Only an
# environment variable set when the process starts reaches them: a Ray option, at about 0.3 s per actor start.
_ACTOR_ENV = {"MALLOC_ARENA_MAX": "2"}

# A handle, or how to find one: ``find(again)`` is asked again with ``again=True`` after the actor it returned
# died for good (stopped, not restarting), so the next attempt reaches its successor.
Actor = ActorHandle | Callable[[bool], ActorHandle]

# actor id -> what error messages call it ("the catalog of league 'default'"), for the handles found by name here
_DESCRIBED: dict[Any, str] = {}


def catalog_name(league: str = DEFAULT_LEAGUE) -> str:
    """The league's catalog actor (the default league keeps the name it always had)."""
    return CATALOG_NAME if league == DEFAULT_LEAGUE else f"{CATALOG_NAME}@{league}"


def store_name(node_id: str, league: str = DEFAULT_LEAGUE) -> str:
    """The league's store actor on ``node_id`` (the default league keeps the name it always had)."""
    return f"{_STORE_PREFIX}{node_id}" if league == DEFAULT_LEAGUE else f"{_STORE_PREFIX}{node_id}@{league}"


def describe(name: str) -> str:
    """What errors call the actor named ``name``: "catalog of league 'x'", "store of league 'x' on node n"."""
    base, _, league = name.partition("@")
    league = league or DEFAULT_LEAGUE
    if base == CATALOG_NAME:
        return f"catalog of league {league!r}"
    if base.startswith(_STORE_PREFIX):
        return f"store of league {league!r} on node {base[len(_STORE_PREFIX):]}"
    return f"actor {name!r}"


def _named(handle: ActorHandle, name: str) -> ActorHandle:
    _DESCRIBED[handle._actor_id] = describe(name)
    return handle


def _description(handle: ActorHandle) -> str:
    found = _DESCRIBED.get(handle._actor_id)
    if found is not None:
        return found
    return f"{handle._ray_actor_creation_function_descriptor.class_name} actor {handle._actor_id.hex()[:8]}"


def detached(name: str) -> dict[str, object]:
    """Ray options of the project's named actors: found if ``name`` runs, else created (atomically, in Ray's GCS)
    detached, taking no CPU slot, and restarted by Ray whenever it dies. None of their calls leaves a task event
    (the default of every method, followers' waits included): Ray's GCS keeps a record of every task (up to
    100,000 of them), about 40 KiB a publish and delete of a snapshot, so a league that churns its opponents grew
    Ray's own memory by every call it ever made to its store. Their processes start with ``_ACTOR_ENV`` (merged
    by Ray into the job's ``runtime_env``)."""
    return {"name": name, "namespace": NAMESPACE, "get_if_exists": True, "lifetime": "detached", "num_cpus": 0,
            "max_restarts": -1, "enable_task_events": False, "runtime_env": {"env_vars": dict(_ACTOR_ENV)}}


@functools.cache
def _actor_class(cls: type, watchers: int | None, threads: int) -> Any:
    """``cls`` as a Ray actor class; ``watchers``: it hosts its doorbell (``hosting.py``, ``cls``'s ``bell``) and
    its ``watch`` calls run in their own group of that many threads, beside the ``threads`` of its other calls."""
    if watchers is None:
        return ray.remote(cls)
    return hosting.actor_class(cls, {None: threads, WATCH_GROUP: watchers})


def start(cls: type, name: str, *args: Any, watchers: int | None = None, options: dict[str, Any] | None = None,
          **kwargs: Any) -> ActorHandle:
    """The named actor ``name`` of ``cls``: found if it runs, else started (detached, see ``detached``) with
    ``cls(*args, **kwargs)`` and the Ray ``options`` given (over those defaults). ``watchers``: ``cls`` hosts its
    doorbell, followers' calls get that many threads of their own (``_actor_class``) and its other calls
    ``options["max_concurrency"]`` (one by default, as Ray gives a plain actor). Returns at once: its first call
    waits for its start."""
    options = {**detached(name), **(options or {})}
    threads = options.setdefault("max_concurrency", 1) if watchers is not None else 0
    actor = _actor_class(cls, watchers, threads).options(**options).remote(*args, **kwargs)
    return _named(actor, name)


def running(name: str, *, background: bool = False) -> ActorHandle | None:
    """The handle of the project's named actor ``name`` (a store, a catalog), or None when none runs.
    ``background``: never start Ray (see ``send_in_background``)."""
    get_actor = ray.get_actor
    if background:
        _check_running()
        get_actor = _without_auto_init(get_actor)
    try:
        return _named(get_actor(name, namespace=NAMESPACE), name)
    except ValueError:
        return None


def find(name: str, *, background: bool = False) -> ActorHandle:
    """The running actor ``name``; StoreUnavailableError if none runs (its start failed, or it was stopped).
    ``background``: never start Ray (see ``send_in_background``)."""
    actor = running(name, background=background)
    if actor is None:
        raise StoreUnavailableError(f"the {describe(name)} is not running (its start failed, or it was stopped; "
                                    "its log says why)")
    return actor


def kill(name: str, timeout_s: float = 30.0) -> bool:
    """Stop the actor ``name`` for good (Ray does not restart it) and wait up to ``timeout_s`` until its name is
    free for a successor; whether one was running."""
    actor = running(name)
    if actor is None:
        return False
    ray.kill(actor, no_restart=True)
    deadline = time.monotonic() + timeout_s
    while running(name) is not None and time.monotonic() < deadline:  # the name is released once the actor is gone
        time.sleep(0.05)
    return True


def died(exc: BaseException) -> bool:
    """Whether ``exc`` (raised by ``find``, ``call`` or ``get``) says the actor is gone for good (stopped, or not
    running): its successor, once started, must be looked up by name again."""
    cause = exc.__cause__
    return isinstance(exc, StoreUnavailableError) and not isinstance(exc, DeadlineExceededError) and (
        cause is None or isinstance(cause, ray.exceptions.ActorDiedError))


def send(actor: ActorHandle, method: str, *args: Any, **kwargs: Any) -> ray.ObjectRef:
    """Start ``actor.method(*args, **kwargs)`` without waiting: its answer is ``get``'s (with a deadline), or
    nobody's (a notice whose loss the next one makes good)."""
    return getattr(actor, method).remote(*args, **kwargs)


def send_in_background(actor: ActorHandle, method: str, *args: Any, **kwargs: Any) -> ray.ObjectRef:
    """``send`` from a background thread: it never starts Ray. (Ray's auto-init starts a new local Ray for an actor
    call made after ``ray.shutdown()``: a follower thread that raced a driver's shutdown would leave one running,
    and the driver's next ``ray.init`` would fail.) StoreUnavailableError if Ray is not running."""
    _check_running()
    bound = getattr(actor, method)
    return _without_auto_init(type(bound)._remote)(bound, args, kwargs)


def session_name() -> str | None:
    """The Ray session this process is connected to (None: none); never starts Ray."""
    if not ray.is_initialized():
        return None
    try:
        return _without_auto_init(ray.get_runtime_context)().get_session_name()
    except Exception:  # shut down meanwhile
        return None


def _check_running() -> None:
    if not ray.is_initialized():
        raise StoreUnavailableError("Ray is not running in this process (ray.shutdown() was called)")


def _without_auto_init(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Ray's ``fn`` without the wrapper that first starts a local Ray when none runs (its auto-init); where a Ray
    version has no such wrapper, ``fn`` itself."""
    return getattr(fn, "__wrapped__", fn)


def call(actor: Actor, method: str, *args: Any, timeout_s: float, retry_s: float = 0.0, **kwargs: Any) -> Any:
    """``actor.method(*args, **kwargs)``'s answer within ``timeout_s`` (see the module's docstring for its errors).

    ``retry_s``: for calls safe to repeat, how long to keep asking again (each attempt with ``timeout_s``) while
    the actor is unavailable (Ray restarts it) or died for good (``actor`` is then a finder, asked for its
    successor). A deadline that passes is never retried: the caller learns which actor was slow."""
    return begin(actor, method, *args, timeout_s=timeout_s, retry_s=retry_s, **kwargs)()


def begin(actor: Actor, method: str, *args: Any, timeout_s: float, retry_s: float = 0.0, **kwargs: Any
          ) -> Callable[[], Any]:
    """``call``, started now and answered later: returns a function that waits for the answer as ``call`` does
    (the deadline counts from now), so the caller can do its own work while the actor does its part."""
    find = actor if callable(actor) and not isinstance(actor, ActorHandle) else None
    handle = actor if find is None else find(False)
    give_up = time.monotonic() + retry_s
    sent, ref = time.monotonic(), send(handle, method, *args, **kwargs)

    def answer() -> Any:
        nonlocal handle, sent, ref
        while True:
            try:
                return get(ref, max(sent + timeout_s - time.monotonic(), 0.0), f"the {_description(handle)}",
                           method, setting=_SETTING if handle._actor_id in _DESCRIBED else None, limit_s=timeout_s)
            except StoreUnavailableError as exc:
                cause = exc.__cause__
                if isinstance(exc, DeadlineExceededError) or not isinstance(cause, ray.exceptions.RayActorError) \
                        or getattr(cause, "_actor_init_failed", False):
                    raise
                if find is not None and isinstance(cause, ray.exceptions.ActorDiedError):
                    handle = find(True)  # stopped for good: its successor (found, or started) takes the next call
                if time.monotonic() >= give_up:
                    raise
            time.sleep(_RETRY_EVERY_S)
            sent, ref = time.monotonic(), send(handle, method, *args, **kwargs)

    return answer


def get(ref: ray.ObjectRef | Sequence[ray.ObjectRef], timeout_s: float, what: str, method: str | None = None, *,
        stop: Callable[[], bool] | None = None, wake: concurrent.futures.Future | None = None,
        setting: str | None = None, limit_s: float | None = None) -> Any:
    """The value of ``ref`` (or a list of the values of ``ref``'s refs) within ``timeout_s``; ``what`` names what is
    waited for (an actor, with ``method`` the call it answers; a snapshot's copy) in the errors.

    ``stop``: asked every 0.1 s while waiting, and at once when ``wake`` completes; the wait ends (None) once it is
    true. A thread that must stop when Ray shuts down waits this way, never inside ``ray.get`` (which would be left
    waiting on freed memory).
    ``setting``: the option that sets ``timeout_s``, named in a DeadlineExceededError; ``limit_s``: the deadline
    the error names, where ``timeout_s`` is what is left of it."""
    limit_s = timeout_s if limit_s is None else limit_s
    try:
        if stop is None:
            return ray.get(ref, timeout=timeout_s)
        return _stoppable(ref, timeout_s, stop, wake)
    except ray.exceptions.GetTimeoutError as exc:
        if method is None:
            raise DeadlineExceededError(f"{what} did not arrive within {limit_s:g} s") from exc
        raise DeadlineExceededError(
            f"{what} did not answer {method}() within {limit_s:g} s{f' ({setting})' if setting else ''}; it may "
            "be overloaded, stopped, or waiting on a slow tier"
        ) from exc
    except ray.exceptions.RayTaskError as exc:
        if isinstance(exc.cause, PolicyStoreError):  # the actor's own error, as itself (not Ray's wrapping)
            raise exc.cause.with_traceback(None) from None
        raise
    except ray.exceptions.ActorDiedError as exc:
        if exc._actor_init_failed:  # it cannot start (bad settings, unusable folder): say why
            raise _start_failed(what, exc) from exc
        raise StoreUnavailableError(_unavailable(what, method, exc)) from exc
    except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError) as exc:
        raise StoreUnavailableError(_unavailable(what, method, exc)) from exc


def _stoppable(ref: ray.ObjectRef | Sequence[ray.ObjectRef], timeout_s: float, stop: Callable[[], bool],
               wake: concurrent.futures.Future | None) -> Any:
    """``ray.get`` waited for in Python, in slices (see ``get``'s ``stop`` and ``wake``)."""
    futures = [r.future() for r in ([ref] if isinstance(ref, ray.ObjectRef) else ref)]
    deadline = time.monotonic() + timeout_s
    values = []
    for future in futures:
        while not future.done():
            concurrent.futures.wait([future] if wake is None else [future, wake],
                                    timeout=min(_POLL_S, max(deadline - time.monotonic(), 0.0)),
                                    return_when=concurrent.futures.FIRST_COMPLETED)
            if future.done():
                break
            if stop():
                return None
            if time.monotonic() >= deadline:
                raise ray.exceptions.GetTimeoutError(f"not ready within {timeout_s:g} s") from None
        values.append(future.result())
    return values[0] if isinstance(ref, ray.ObjectRef) else values


def _unavailable(what: str, method: str | None, exc: Exception) -> str:
    during = f" during {method}()" if method else ""
    return f"{what} stopped or could not be reached{during} ({type(exc).__name__}: {brief(exc)})"


def _start_failed(what: str, exc: ray.exceptions.ActorDiedError) -> PolicyStoreError:
    """The error that stopped an actor's start, as its own policystore class when it is one (a spill folder that
    cannot be used is a SnapshotFolderError), else StoreUnavailableError; the message keeps the actor's words."""
    lines = [line for line in str(exc).splitlines() if line.strip()]
    last = lines[-1] if lines else str(exc)
    name, _, message = last.partition(": ")
    cls = getattr(errors, name.rsplit(".", 1)[-1], None)
    if not (isinstance(cls, type) and issubclass(cls, PolicyStoreError)):
        cls, message = StoreUnavailableError, last
    return cls(f"{what} could not start: {message}")

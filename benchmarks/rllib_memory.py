"""Stock RLlib against RLlib with the store: memory of N EnvRunners that PLAY K frozen league opponents.

    python -m benchmarks.rllib_memory --quick
    python -m benchmarks.rllib_memory --env-runners 2,4 --frozen 8,16,32 --hidden 1024
    python -m benchmarks.rllib_memory --job train --env-runners 2 --frozen 8,16,32 --modes rllib+store none
    python -m benchmarks.rllib_memory --job churn --env-runners 2 --hidden 1024 --modes rllib+store none rllib

For every (mode, N) it starts a fresh Ray session (object-store pages touched before would look free), builds PPO
on two-agent CartPole (examples/rllib_cartpole_league.py) with N remote EnvRunners plus RLlib's local one, trains
one iteration, measures the baseline, then freezes copies of ``main`` up to each K the way a league callback does,
with a mapping function that sends agent 1 to the frozen copies in turn. Before each reading every remote
EnvRunner plays K+1 episodes, so each one has run every frozen module. Stock RLlib freezes as RLlib's league
example does (``add_module`` + ``set_state``: the copy is also on the Learner); the store mode calls
``policystore.rllib.add_frozen``. ``--job freeze`` (the default) only freezes between readings; ``--job train``
runs one ``train()`` after every freeze, as a league job does (the Learner updates ``main``, weights are synced to
every EnvRunner, the freshly frozen copy is played in that iteration); ``--job churn`` is a league of at most
``--cap`` opponents that freezes one, drops the oldest and trains, every iteration, read every 10th. Mode ``none``
is the control: the same job on stock RLlib with nothing frozen (agent 1 plays ``main_v0``), i.e. RLlib's and Ray's
own growth over the same iterations. ``--learners 1`` puts the Learner in its own process (RLlib's default here, 0,
keeps it in the driver). Train and churn jobs warm up after the baseline: one iteration that freezes an opponent,
plays it and removes it (``none``: the iteration alone), so every process has paid what it pays once. Every reading
(and the baseline) comes after ``gc.collect()`` and glibc's ``malloc_trim(0)`` in each Python process of the job
(driver, EnvRunners, store and catalog actors): heap in use, not freed heap glibc keeps.

Rows (``what`` says which is which; PSS and USS in MiB):

- ``node``: the delta over the baseline summed over every process of the Ray session (driver, raylet with the
  object store, GCS, store and catalog actors, EnvRunners). PSS splits each shared page among its mappers, so the
  sum counts the one copy in the object store once; USS is private memory only (no shared page at all).
  ``copies_per_node`` = node PSS delta / (K x module size): 1.0 is the physical limit, one copy per node.
- ``node_live``: the same delta counted without the object store's page reuse (``live_mib``): every process's
  private and file PSS (shared object-store pages left out) plus the bytes of live objects in the object store.
  A freed object's pages stay touched, so once ``train()`` has moved weights through the object store new
  snapshots reuse those pages and the ``node`` PSS delta undercounts them (``--job train``); ``copies_live`` =
  live_mib / (K x module size). ``anon_mib`` is the private heap part alone (anonymous PSS) and ``copies_heap`` =
  (live objects + anon_mib) / (K x module size): the count without library pages, whose PSS share moves with
  every other process on the machine that maps the same files (another Ray session's torch), not with the league.
- ``env_runner``: the delta per remote EnvRunner (mean over the N). PSS = its private growth plus its share of
  the shared snapshots; USS = its private growth alone.
- ``store_actor``, ``catalog_actor`` (store mode): those processes' own PSS and USS, absolute (not deltas): the
  fixed cost per node (store) and per cluster (catalog), whatever N and K.
- ``process``: the node row's delta split by process (column ``process``): ``driver`` (with the Learner when
  ``--learners 0``), ``learner_<i>``, ``env_runner_<i>``, ``store_actor``, ``catalog_actor``, and ``rest`` (every
  other process of the session: raylet with the object store, GCS, Ray's helpers). ``live_mib`` is the process's
  part of ``node_live`` (its private and file PSS, object-store pages left out): the rows' ``live_mib`` plus the
  ``objects`` rows sum to ``node_live``; ``anon_mib`` is its private heap alone (anonymous PSS), the steadier
  reading: a process's file PSS (shared library code) moves whenever another process of the session maps or
  unmaps the same files, though the node's sum does not. USS also counts object-store pages that only this
  process has touched (a freed object's pages it wrote or read alone), which are neither heap nor live.
- ``fixed`` (train, churn): what the warm-up added to each process's heap (``anon_mib``, MiB; ``total``: their
  sum): the fixed cost of a league (the store client and its thread in every EnvRunner, the store's first publish
  and delete, RLlib's first module added and removed), paid once whatever K and the number of removed opponents.
  ``node_live``'s ``copies_heap_warm`` is ``copies_heap`` with it taken out.
- ``objects``: the bytes of live objects in the object store by the processes holding a reference to them
  (``process``: e.g. ``driver+env_runner_1+env_runner_2+store_actor``): the snapshots the league plays, and any
  object still alive or borrowed at the reading.
- ``summary`` (a run with ``rllib+store`` and ``none``): ``league_copies`` = the store's ``copies_live`` minus the
  control's ``control_copies_live``, and ``league_copies_heap`` the same for ``copies_heap``: the league's own
  share once RLlib's and Ray's growth over the same iterations is taken out; ``league_copies_heap_warm`` the same
  with each mode's fixed cost apart.
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from benchmarks.harness import (
    MiB,
    Results,
    int_list,
    make_parser,
    object_store_used_bytes,
    progress,
    pss_breakdown_bytes,
    ray_session,
    setup_logging,
)

ROOT = Path(__file__).resolve().parents[1]
MODES = ("rllib", "rllib+store", "none")
COLUMNS = ["job", "mode", "env_runners", "frozen", "iteration", "what", "process", "pss_mib", "uss_mib",
           "copies_per_node", "live_mib", "anon_mib", "copies_live", "copies_heap", "control_copies_live",
           "league_copies", "league_copies_heap", "copies_heap_warm", "league_copies_heap_warm", "held", "module_mib",
           "loadavg_1m"]
JOBS = ("freeze", "train", "churn")


def pss_uss(pids: list[int]) -> tuple[int, int]:
    """Summed PSS and USS of ``pids`` (processes that are gone count 0)."""
    pss = uss = 0
    for pid in pids:
        pss_, uss_ = per_pid(pid)
        pss, uss = pss + pss_, uss + uss_
    return pss, uss


def live_parts() -> tuple[int, int, int]:
    """The session's memory counted without the object store's page reuse: every process's private (anon) and file
    pages (PSS, shared object-store pages left out), and the bytes of live objects in the object store. The node PSS
    sum counts object-store pages once they are touched, and a freed object's pages stay touched: after ``train()``
    has moved weights through the object store, new snapshots reuse those pages and the node delta undercounts
    them."""
    parts = pss_breakdown_bytes([psutil.Process(pid) for pid in session_pids() if psutil.pid_exists(pid)])
    return parts["anon"], parts["file"], object_store_used_bytes()


def objects_by_holder(roles: dict[str, int]) -> dict[str, int]:
    """Bytes of the live objects in the object store, by the processes that hold a reference to each (``"store_actor"``,
    ``"driver+env_runner_1"``, ...; ``rest`` for any other process): where the object store's part of the live count
    is, and who keeps it alive."""
    import ray
    from ray._private.internal_api import node_stats

    node = ray._private.worker._global_node
    reply = node_stats(node.node_ip_address, node.node_manager_port, include_memory_info=True)
    role_of = {pid: role for role, pid in roles.items()}
    holders: dict[bytes, set[str]] = {}
    sizes: dict[bytes, int] = {}
    for worker in reply.core_workers_stats:
        for ref in worker.object_refs:
            if ref.object_size > 0:
                holders.setdefault(ref.object_id, set()).add(role_of.get(worker.pid, "rest"))
                sizes[ref.object_id] = ref.object_size
    out: dict[str, int] = {}
    for object_id, who in holders.items():
        key = "+".join(sorted(who))
        out[key] = out.get(key, 0) + sizes[object_id]
    return out


def per_pid(pid: int) -> tuple[int, int]:
    try:
        info = psutil.Process(pid).memory_full_info()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return 0, 0
    return info.pss, info.uss


def store_actors(algorithm: Any) -> tuple[tuple[str, str], ...]:
    """(role, actor name) of the league's store on this node and its catalog."""
    import ray

    from policystore.remote import catalog_name, store_name
    from policystore.rllib import league_store

    league = league_store(algorithm).league
    return (("store_actor", store_name(ray.get_runtime_context().get_node_id(), league)),
            ("catalog_actor", catalog_name(league)))


def process_roles(algorithm: Any, stock: bool) -> dict[str, int]:
    """Role -> pid of every process the ``process`` rows name (the rest of the session is ``rest``)."""
    roles = {"driver": os.getpid()}
    learners = algorithm.learner_group.foreach_learner(lambda learner: os.getpid()) \
        if not algorithm.learner_group.is_local else []
    for i, pid in enumerate(r.get() for r in learners):
        roles[f"learner_{i}"] = pid
    for i, pid in enumerate(env_runner_pids(algorithm), start=1):
        roles[f"env_runner_{i}"] = pid
    if not stock:
        for role, name in store_actors(algorithm):
            pid = actor_pid(name)
            if pid is not None:
                roles[role] = pid
    return roles


def by_process(roles: dict[str, int]) -> dict[str, tuple[int, int, int, int]]:
    """PSS, USS, live bytes (private and file PSS: ``live_parts`` without the objects) and anonymous PSS of each
    role, and of ``rest``: the session's other processes."""
    groups = {role: [pid] for role, pid in roles.items()}
    groups["rest"] = [pid for pid in session_pids() if pid not in set(roles.values())]
    out = {}
    for role, pids in groups.items():
        parts = pss_breakdown_bytes([psutil.Process(pid) for pid in pids if psutil.pid_exists(pid)])
        out[role] = (*pss_uss(pids), parts["anon"] + parts["file"], parts["anon"])
    return out


def session_pids() -> list[int]:
    from policystore.memory import session_processes

    return [p.pid for p in session_processes()]


def env_runner_pids(algorithm: Any) -> list[int]:
    return algorithm.env_runner_group.foreach_env_runner(lambda runner: os.getpid(), local_env_runner=False)


def actor_pid(name: str) -> int | None:
    """The pid of the named policystore actor (None if it is not running)."""
    import ray

    from policystore.remote import NAMESPACE

    try:
        actor = ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        return None
    return ray.get(actor.__ray_call__.remote(lambda self: os.getpid()))


def settle(algorithm: Any, stock: bool) -> None:
    """A GC and a heap trim (glibc's ``malloc_trim``) in every EnvRunner, the store's actors and here, then a short
    wait for frees and page accounting: the heap is then what the process uses, not what glibc keeps of what it
    freed (after a ``train()`` the driver held up to 18 MiB of freed heap, each other process a few MiB, and it
    moved between readings). Linux with glibc only, as the rest of the benchmark (smaps)."""
    import ray

    from policystore.remote import NAMESPACE

    # Lambdas that name only modules: a function of this module would make every process import the benchmark.
    algorithm.env_runner_group.foreach_env_runner(lambda runner: (gc.collect(), ctypes.CDLL(None).malloc_trim(0)),
                                                  local_env_runner=False)
    for _, name in () if stock else store_actors(algorithm):
        actor = ray.get_actor(name, namespace=NAMESPACE)
        ray.get(actor.__ray_call__.remote(lambda self: (gc.collect(), ctypes.CDLL(None).malloc_trim(0))))
    gc.collect()
    ctypes.CDLL(None).malloc_trim(0)
    time.sleep(0.5)


def module_mib(algorithm: Any) -> float:
    """Bytes of one frozen (inference-only) copy of ``main``."""
    state = algorithm.get_module("main").get_state(inference_only=True)
    return sum(v.nbytes for v in state.values()) / MiB


def readings(job: str, frozen: list[int], cap: int, iterations: int) -> list[tuple[int, int]]:
    """(frozen modules, iteration) at each reading: the K values (freeze, train), or every 10th iteration of a
    churning league of ``cap`` opponents and its last (churn)."""
    if job != "churn":
        return [(k, 0) for k in frozen]
    return [(0, i) for i in sorted({*range(10, iterations + 1, 10), iterations})]


def held(algorithm: Any, stock: bool) -> int:
    """Frozen snapshots the job holds: modules of the Learner other than the trained ones (stock), snapshots in the
    league's store (store): what a league that lets go of its removed opponents keeps at its cap."""
    if stock:
        found = algorithm.learner_group.foreach_learner(lambda learner: len(learner.module.keys()))
        return [r.get() for r in found][0] - 2  # all but main and main_v0
    from policystore.rllib import league_store

    return len(league_store(algorithm).list())


def measure(results: Results, job: str, mode: str, env_runners: int, frozen: list[int], hidden: int, learners: int,
            advance: Any, cap: int = 8, iterations: int = 30) -> None:
    """Emit the rows of one (job, mode, N): one Algorithm grown through the K values in ``frozen`` (freeze,
    train), or a league of at most ``cap`` opponents that freezes one and drops the oldest every iteration
    (churn)."""
    from examples.rllib_cartpole_league import freeze, ppo_config, round_robin_mapping, unfreeze

    stock, league = mode != "rllib+store", mode != "none"
    config = ppo_config(env_runners=env_runners, hidden=hidden, store=not stock).learners(num_learners=learners)
    algorithm = config.build_algo()
    try:
        algorithm.train()
        size = module_mib(algorithm)
        settle(algorithm, stock)
        runners = env_runner_pids(algorithm)
        roles = process_roles(algorithm, stock)
        base_node, base_runners, base_roles = pss_uss(session_pids()), pss_uss(runners), by_process(roles)
        base_live = live_parts()
        if job != "freeze":
            warm_anon = warm_up(results, algorithm, job, mode, env_runners, size, roles, base_roles)
        have: list[str] = []
        for k, iteration in readings(job, frozen, cap, iterations):
            while len(have) < k or algorithm.iteration < iteration:
                have.append(f"main_v{len(have) + 1}" if job != "churn" else f"main_v{algorithm.iteration}")
                if league:
                    freeze(algorithm, have[-1], round_robin_mapping(have[-cap:] if job == "churn" else have),
                           stock=stock)
                if job == "churn" and len(have) > cap:
                    dropped = have.pop(0)
                    if league:
                        unfreeze(algorithm, dropped, round_robin_mapping(have), stock=stock)
                if job != "freeze":
                    algorithm.train()
                advance()
            k = len(have)
            algorithm.env_runner_group.foreach_env_runner(
                lambda runner, n=k + 1: runner.sample(num_episodes=n), local_env_runner=False
            )
            settle(algorithm, stock)
            point = {"job": job, "mode": mode, "env_runners": env_runners, "frozen": k, "module_mib": round(size, 3),
                     "iteration": algorithm.iteration}
            node = pss_uss(session_pids())
            node_pss = (node[0] - base_node[0]) / MiB
            results.emit({**point, "what": "node", "pss_mib": round(node_pss, 1),
                          "uss_mib": round((node[1] - base_node[1]) / MiB, 1),
                          "copies_per_node": round(node_pss / (k * size), 2)})
            anon, file, objects = ((a - b) / MiB for a, b in zip(live_parts(), base_live, strict=True))
            live = anon + file + objects
            warm = {} if job == "freeze" else {"copies_heap_warm": round((anon - warm_anon + objects) / (k * size), 2)}
            results.emit({**point, "what": "node_live", "live_mib": round(live, 1), "anon_mib": round(anon, 1),
                          "copies_live": round(live / (k * size), 2),
                          "copies_heap": round((anon + objects) / (k * size), 2), **warm,
                          "held": held(algorithm, stock)})
            now = pss_uss(runners)
            results.emit({**point, "what": "env_runner",
                          "pss_mib": round((now[0] - base_runners[0]) / MiB / env_runners, 1),
                          "uss_mib": round((now[1] - base_runners[1]) / MiB / env_runners, 1)})
            for role, now_role in by_process(roles).items():
                base = base_roles.get(role, (0, 0, 0, 0))
                pss, uss, own, anon = ((a - b) / MiB for a, b in zip(now_role, base, strict=True))
                results.emit({**point, "what": "process", "process": role, "pss_mib": round(pss, 1),
                              "uss_mib": round(uss, 1), "live_mib": round(own, 1), "anon_mib": round(anon, 1)})
            for holders, nbytes in sorted(objects_by_holder(roles).items()):
                results.emit({**point, "what": "objects", "process": holders, "live_mib": round(nbytes / MiB, 1)})
            if not stock:
                emit_actors(results, point, algorithm)
    finally:
        algorithm.stop()


def warm_up(results: Results, algorithm: Any, job: str, mode: str, env_runners: int, size: float,
            roles: dict[str, int], base_roles: dict[str, tuple[int, int, int, int]]) -> float:
    """One iteration that freezes an opponent, plays it and removes it (``none``: the iteration alone), so that every
    process has paid what it pays once (the store client and its thread in each EnvRunner, the store's first publish
    and delete, imports, RLlib's first module added and removed). Emits that fixed cost process by process (``fixed``
    rows: heap deltas over the baseline) and returns the session's heap delta it adds up to (MiB)."""
    from examples.rllib_cartpole_league import first_mapping, freeze, round_robin_mapping, unfreeze

    stock = mode != "rllib+store"
    if mode != "none":
        freeze(algorithm, "warm_up", round_robin_mapping(["warm_up"]), stock=stock)
    algorithm.train()
    algorithm.env_runner_group.foreach_env_runner(lambda runner: runner.sample(num_episodes=2),
                                                  local_env_runner=False)
    if mode != "none":
        unfreeze(algorithm, "warm_up", first_mapping, stock=stock)
    settle(algorithm, stock)
    point = {"job": job, "mode": mode, "env_runners": env_runners, "frozen": 0, "module_mib": round(size, 3),
             "iteration": algorithm.iteration, "what": "fixed"}
    total = 0.0
    for role, now_role in by_process(roles).items():
        anon = (now_role[3] - base_roles.get(role, (0, 0, 0, 0))[3]) / MiB
        total += anon
        results.emit({**point, "process": role, "anon_mib": round(anon, 1)})
    results.emit({**point, "process": "total", "anon_mib": round(total, 1)})
    return total


def emit_actors(results: Results, point: dict[str, Any], algorithm: Any) -> None:
    for what, name in store_actors(algorithm):
        pid = actor_pid(name)
        if pid is not None:
            pss, uss = pss_uss([pid])
            results.emit({**point, "what": what, "pss_mib": round(pss / MiB, 1), "uss_mib": round(uss / MiB, 1)})


def league_copies(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``summary`` rows where a run measured both the store and ``none`` (the same training, nothing frozen): the
    league's own share of the live count, ``league_copies`` = the store's ``copies_live`` minus the control's
    (RLlib's and Ray's growth over the same iterations), and ``league_copies_heap`` the same of ``copies_heap``."""
    live = {(r["job"], r["mode"], r["env_runners"], r["frozen"], r["iteration"]): r
            for r in rows if r["what"] == "node_live"}
    out = []
    for (job, mode, n, k, iteration), row in live.items():
        control = live.get((job, "none", n, k, iteration))
        if mode == "rllib+store" and control is not None:
            out.append({"job": job, "mode": mode, "env_runners": n, "frozen": k, "iteration": iteration,
                        "what": "summary", "copies_live": row["copies_live"], "copies_heap": row["copies_heap"],
                        "control_copies_live": control["copies_live"],
                        "league_copies": round(row["copies_live"] - control["copies_live"], 2),
                        "league_copies_heap": round(row["copies_heap"] - control["copies_heap"], 2),
                        **warm_share(row, control)})
    return out


def warm_share(row: dict[str, Any], control: dict[str, Any]) -> dict[str, Any]:
    """``league_copies_heap_warm``: the league's share of ``copies_heap`` with the fixed cost apart (train, churn)."""
    if "copies_heap_warm" not in row or "copies_heap_warm" not in control:
        return {}
    return {"league_copies_heap_warm": round(row["copies_heap_warm"] - control["copies_heap_warm"], 2)}


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for mode in MODES:
        for n in sorted({r["env_runners"] for r in rows}):
            for job in JOBS:
                pts = [r for r in rows if r["mode"] == mode and r["env_runners"] == n and r["what"] == "node"
                       and r.get("job") == job]
                if pts:
                    ax.plot([r["frozen"] for r in pts], [r["pss_mib"] for r in pts], marker="o",
                            linestyle="-" if mode == "rllib+store" else "--",
                            label=f"{mode}, {n} EnvRunners, {job}")
    node = [r for r in rows if r["what"] == "node"]
    if node:
        ks = sorted({r["frozen"] for r in node})
        ax.plot(ks, [k * node[0]["module_mib"] for k in ks], color="grey", linewidth=0.8, label="one copy per node")
    ax.set_xlabel("frozen modules played (K)")
    ax.set_ylabel("node memory attributable to them (PSS, MiB)")
    ax.set_title("RLlib league: frozen opponents played, stock vs. policystore")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = make_parser("rllib_memory", __doc__)
    parser.add_argument("--env-runners", type=int_list, default=[2, 4], help="N values: remote EnvRunners")
    parser.add_argument("--frozen", type=int_list, default=[8, 16, 32], help="K values: frozen modules")
    parser.add_argument("--hidden", type=int, default=1024,
                        help="width of the two hidden layers (1024: a 4.0 MiB frozen module)")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--job", choices=JOBS, default="freeze",
                        help="freeze: only freeze between readings; train: one train() after every freeze; churn: "
                             "one freeze and one train() per iteration, the oldest opponent dropped beyond --cap")
    parser.add_argument("--cap", type=int, default=8, help="churn: opponents the league keeps")
    parser.add_argument("--iterations", type=int, default=30, help="churn: iterations (one freeze each)")
    parser.add_argument("--learners", type=int, default=0, help="remote Learners (0: the Learner is in the driver)")
    args = parser.parse_args(argv)
    if args.quick:
        args.env_runners, args.frozen, args.hidden, args.cap, args.iterations = [2], [4], 512, 2, 4
    setup_logging(args.verbose)
    # Ray workers of a local cluster inherit this environment: let them import the project and its examples.
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    frozen = sorted(args.frozen)
    results = Results("rllib_memory", args, {"env_runners": args.env_runners, "frozen": frozen,
                                             "hidden": args.hidden, "modes": args.modes, "job": args.job,
                                             "learners": args.learners, "cap": args.cap,
                                             "iterations": args.iterations,
                                             # the job's processes inherit it (docs/rllib.md: glibc's arenas)
                                             "malloc_arena_max": os.environ.get("MALLOC_ARENA_MAX", "default")})
    with progress() as bar:
        steps = args.iterations if args.job == "churn" else frozen[-1]
        task = bar.add_task("freezing league snapshots", total=len(args.modes) * len(args.env_runners) * steps)
        for mode in args.modes:
            for n in args.env_runners:
                with ray_session(object_store_bytes=1_500_000_000, num_cpus=2):
                    measure(results, args.job, mode, n, frozen, args.hidden, args.learners,
                            lambda: bar.advance(task), args.cap, args.iterations)
    for row in league_copies(results.rows):
        results.emit(row)
    results.finish(COLUMNS, plot, notes=[
        "node: delta over the same Algorithm with no frozen module, summed over every process of the Ray session; "
        "env_runner: delta per remote EnvRunner (mean); process: the node delta split by process; store_actor, "
        "catalog_actor: absolute. PSS shares each shared page among its mappers; USS is private memory only.",
    ])


if __name__ == "__main__":
    main(sys.argv[1:])

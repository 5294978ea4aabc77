"""Stock RLlib against RLlib with the store: node memory of N EnvRunners x K frozen league modules.

    python -m benchmarks.rllib_memory --quick
    python -m benchmarks.rllib_memory --env-runners 2 4 --frozen 0 8 16 32 --hidden 1024

For every point it builds PPO on a two-agent CartPole with N remote EnvRunners (plus RLlib's local one), freezes K
snapshots of the trained module the way a league callback does, and measures PSS:

- ``attributable_mib``: PSS of the whole Ray session (driver, raylet with the object store, store actor,
  EnvRunners, ...) minus the same Algorithm with no frozen module;
- ``env_runner_mib``: the same delta over the N remote EnvRunner processes only;
- ``copies_per_node``: ``attributable_mib / (K * module_mib)``: 1.0 is the physical limit, one copy per node.

Stock RLlib freezes as RLlib's league example does (``add_module`` + ``set_state``; the module also lands on the
Learner, which PPO needs when it is not told otherwise). With the store: ``policystore.rllib.add_frozen``.
One JSON object per point on stdout; rows.json, memory.png and table.md in ``--out``.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import psutil
import ray

from policystore.memory import MiB, pss_bytes, session_pss_bytes

ROOT = Path(__file__).resolve().parents[1]
ENV = "policystore_two_agent_cartpole"
MODES = ("rllib", "rllib+store")
log = logging.getLogger("rllib_memory")


def init_ray(object_store_bytes: int = 1_500_000_000, extra_paths: Iterable[Path] = ()) -> None:
    """A local Ray sized for this machine; workers import the project (and ``extra_paths``) from this checkout."""
    paths = os.pathsep.join(str(p) for p in (ROOT, *extra_paths))
    ray.init(
        num_cpus=2,
        object_store_memory=object_store_bytes,
        include_dashboard=False,
        logging_level="warning",
        runtime_env={"env_vars": {"PYTHONPATH": paths}},
    )


def ppo_config(*, env_runners: int = 2, hidden: int = 16, store: bool = True, league: str | None = None) -> Any:
    """PPO on two-agent CartPole: agent 0 plays the trained ``main``, agent 1 its opponent (``main_v0`` at first).

    ``store`` adds policystore (SharedEnvRunner + PolicyStoreCallback); otherwise it is stock RLlib.
    """
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    from ray.rllib.core.rl_module.multi_rl_module import MultiRLModuleSpec
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec
    from ray.rllib.examples.envs.classes.multi_agent import MultiAgentCartPole
    from ray.tune.registry import register_env

    register_env(ENV, lambda cfg: MultiAgentCartPole({"num_agents": 2}))
    model = DefaultModelConfig(fcnet_hiddens=[hidden, hidden] if hidden >= 256 else [hidden])
    config = (
        PPOConfig()
        .environment(ENV)
        .env_runners(num_env_runners=env_runners, num_cpus_per_env_runner=0.1, rollout_fragment_length="auto")
        .learners(num_learners=0)
        .training(train_batch_size_per_learner=400, minibatch_size=100, num_epochs=8, lr=3e-3)
        .fault_tolerance(restart_failed_env_runners=True, delay_between_env_runner_restarts_s=0.0)
        .multi_agent(
            policies={"main", "main_v0"},
            policy_mapping_fn=first_mapping,
            policies_to_train=["main"],
        )
        .rl_module(
            rl_module_spec=MultiRLModuleSpec(
                rl_module_specs={m: RLModuleSpec(model_config=model) for m in ("main", "main_v0")}
            )
        )
        .debugging(seed=0, log_level="ERROR")
    )
    if store:
        from policystore.rllib import with_policystore

        config = with_policystore(config, league=league)
    return config


def first_mapping(agent_id: Any, episode: Any, **kwargs: Any) -> str:
    return "main" if agent_id == 0 else "main_v0"


def opponent_mapping(opponent: str):
    """Matchmaking after a freeze: agent 1 plays ``opponent`` (a plain function: Ray ships it by value)."""

    def mapping(agent_id: Any, episode: Any, **kwargs: Any) -> str:
        return "main" if agent_id == 0 else opponent

    return mapping


def freeze_stock(algorithm: Any, module_id: str) -> None:
    """How RLlib's own league example freezes a copy of ``main``."""
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    main = algorithm.get_module("main")
    algorithm.add_module(module_id=module_id, module_spec=RLModuleSpec.from_module(main))
    state = algorithm.learner_group.get_state(components="learner/rl_module/main")["learner"]["rl_module"]
    algorithm.set_state({"learner_group": {"learner": {"rl_module": {module_id: state["main"]}}}})


def freeze_store(algorithm: Any, module_id: str) -> None:
    from policystore.rllib import add_frozen

    add_frozen(algorithm, module_id, "main")


def env_runner_pids(algorithm: Any) -> list[int]:
    return algorithm.env_runner_group.foreach_env_runner(lambda er: os.getpid(), local_env_runner=False)


def env_runner_pss(algorithm: Any) -> int:
    """PSS summed over the remote EnvRunner processes, after a GC in each."""
    algorithm.env_runner_group.foreach_env_runner(lambda er: gc.collect(), local_env_runner=False)
    time.sleep(0.3)
    return pss_bytes(psutil.Process(pid) for pid in env_runner_pids(algorithm))


def module_mib(algorithm: Any, module_id: str = "main") -> float:
    """Bytes one frozen (inference-only) copy of ``module_id`` takes."""
    state = algorithm.get_module(module_id).get_state(inference_only=True)
    return sum(v.nbytes for v in state.values()) / MiB


def measure(mode: str, env_runners: int, frozen: Iterable[int], hidden: int, progress: Any = None):
    """Rows for one (mode, N): the same Algorithm grown through the K values in ``frozen``.

    Run it in a fresh Ray session: object-store pages that an earlier point touched stay resident (and in the
    baseline PSS), so snapshots reusing them would look free.
    """
    algorithm = ppo_config(env_runners=env_runners, hidden=hidden, store=mode == "rllib+store").build_algo()
    try:
        algorithm.train()
        freeze = freeze_store if mode == "rllib+store" else freeze_stock
        size = module_mib(algorithm)
        if mode == "rllib+store":
            _warm_store()
        base_session, base_runners, have = session_pss_bytes(), env_runner_pss(algorithm), 0
        for k in sorted(frozen):
            while have < k:
                have += 1
                freeze(algorithm, f"main_v{have}")
                if progress is not None:
                    progress()
            algorithm.env_runner_group.foreach_env_runner(
                lambda er: er.sample(num_timesteps=50), local_env_runner=False
            )
            attributable = (session_pss_bytes() - base_session) / MiB
            yield {
                "mode": mode,
                "env_runners": env_runners,
                "frozen_modules": k,
                "module_mib": round(size, 3),
                "attributable_mib": round(attributable, 1),
                "env_runner_mib": round((env_runner_pss(algorithm) - base_runners) / MiB, 1),
                "copies_per_node": round(attributable / (k * size), 2) if k else None,
            }
    finally:
        algorithm.stop()
        _drop_snapshots()


def _warm_store() -> None:
    """One publish + get first, so the store actor's one-off start-up (imports, threads) is in the baseline.

    That fixed cost is one process per node, whatever N and K; docs/rllib.md gives it separately.
    """
    import numpy as np

    import policystore

    store = policystore.connect()
    store.get(store.publish("warmup", {"w": np.zeros(1024, np.float32)}).policy_id)
    store.delete("warmup")


def _drop_snapshots() -> None:
    """Free the store between points so one point's snapshots never sit in the next one's baseline."""
    import policystore

    store = policystore.connect()
    for policy_id in {info.id.policy_id for info in store.list()}:
        store.delete(policy_id)


def write_results(rows: list[dict[str, Any]], out: Path) -> None:
    """rows.json, memory.png (attributable memory against K) and table.md."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    (out / "rows.json").write_text(json.dumps(rows, indent=1))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for mode in MODES:
        for n in sorted({r["env_runners"] for r in rows}):
            pts = [r for r in rows if r["mode"] == mode and r["env_runners"] == n]
            if pts:
                ax.plot([r["frozen_modules"] for r in pts], [r["attributable_mib"] for r in pts],
                        marker="o", linestyle="-" if mode == "rllib+store" else "--", label=f"{mode}, {n} EnvRunners")
    if rows:
        ks = sorted({r["frozen_modules"] for r in rows})
        ax.plot(ks, [k * rows[0]["module_mib"] for k in ks], color="grey", linewidth=0.8, label="one copy per node")
    ax.set_xlabel("frozen modules (K)")
    ax.set_ylabel("node memory attributable to them (PSS, MiB)")
    ax.set_title("RLlib league: frozen opponents, stock vs. policystore")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "memory.png", dpi=120)
    plt.close(fig)
    head = "| mode | EnvRunners | K | module MiB | attributable MiB | EnvRunner MiB | copies per node |"
    lines = [head, "|---|---|---|---|---|---|---|"]
    for r in rows:
        copies = "" if r["copies_per_node"] is None else f"{r['copies_per_node']:.2f}"
        lines.append(
            f"| {r['mode']} | {r['env_runners']} | {r['frozen_modules']} | {r['module_mib']:.2f} | "
            f"{r['attributable_mib']:.1f} | {r['env_runner_mib']:.1f} | {copies} |"
        )
    (out / "table.md").write_text("\n".join(lines) + "\n")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.rllib_memory",
        description=__doc__.split("\n\n")[0],
        epilog="Rows go to stdout as JSON lines; progress and logs to stderr.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--env-runners", type=int, nargs="+", default=[2, 4], help="N values: remote EnvRunners")
    parser.add_argument("--frozen", type=int, nargs="+", default=[0, 8, 16, 32], help="K values: frozen modules")
    parser.add_argument("--hidden", type=int, default=1024,
                        help="width of the two hidden layers (1024: about 4.0 MiB per frozen module)")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--out", type=Path, default=Path("results/rllib_memory"), help="results folder")
    parser.add_argument("--quick", action="store_true",
                        help="a one-minute smoke run: 2 EnvRunners, K in 0 4 8, 512-wide layers")
    args = parser.parse_args(argv)
    if args.quick:
        args.env_runners, args.frozen, args.hidden = [2], [0, 4, 8], 512
    if 0 not in args.frozen:
        args.frozen = [0, *args.frozen]  # the baseline every point is measured against
    return args


def main(argv: list[str] | None = None) -> None:
    from rich.logging import RichHandler
    from rich.progress import Progress

    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", handlers=[RichHandler(show_path=False)])
    rows: list[dict[str, Any]] = []
    try:
        with Progress(transient=True) as progress:
            freezes = len(args.modes) * len(args.env_runners) * max(args.frozen)
            task = progress.add_task("freezing league snapshots", total=freezes)
            for mode in args.modes:
                for n in args.env_runners:
                    log.info("%s with %d EnvRunners, K in %s", mode, n, sorted(args.frozen))
                    init_ray()  # a fresh session per point: object-store pages touched before are not free
                    try:
                        for row in measure(mode, n, args.frozen, args.hidden, lambda: progress.advance(task)):
                            rows.append(row)
                            print(json.dumps(row), flush=True)
                    finally:
                        ray.shutdown()
    finally:
        ray.shutdown()
    write_results(rows, args.out)
    log.info("wrote %s", ", ".join(str(args.out / f) for f in ("rows.json", "memory.png", "table.md")))


if __name__ == "__main__":
    main(sys.argv[1:])

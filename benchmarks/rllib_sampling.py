"""EnvRunner sampling speed with frozen opponents played: stock RLlib against RLlib with the store, side by side.

    python -m benchmarks.rllib_sampling --quick
    python -m benchmarks.rllib_sampling --frozen 4 --hidden 1024 --steps 4000 --repeats 7

One Ray session, three Algorithms built from the same config (PPO on two-agent CartPole,
examples/rllib_cartpole_league.py, sampling in the driver's own EnvRunner: no actor call in the timing): stock RLlib
with K frozen copies of ``main`` added as RLlib's league example does (``add_module`` + ``set_state``), the store
with the same K copies added by ``policystore.rllib.add_frozen`` (read-only views of the node's one copy,
their forwards run under ``policystore.views.fast_reads()``), and the store without that fast path (``guarded``:
every op of a frozen forward goes through the views' write-guard dispatch), to show what the fast path saves.
Agent 0 plays ``main``, agent 1 the frozen copies in turn, so every step runs a forward pass of a frozen module.
The modes are timed in turn (the order reversed every other round), ``--repeats`` times each, so that drift in the
machine's load hits all alike.

Rows: one per (mode, repeat) with ``steps_per_s`` (env steps per wall second of ``EnvRunner.sample``) and
``cpu_ms_per_step`` (this process's CPU time per env step), then one ``summary`` row per mode with the medians and
``vs_stock`` (the mode's median steps/s over stock's). The load average is in every row: time it on a quiet
machine (load well under the number of cores) before quoting it.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import Results, make_parser, progress, ray_session, setup_logging

ROOT = Path(__file__).resolve().parents[1]
MODES = ("rllib", "rllib+store", "rllib+store guarded")
COLUMNS = ["mode", "repeat", "frozen", "hidden", "steps", "steps_per_s", "cpu_ms_per_step", "vs_stock", "loadavg_1m"]


def build(mode: str, frozen: int, hidden: int) -> Any:
    """An Algorithm sampling in its local EnvRunner, with ``frozen`` copies of ``main`` that agent 1 plays."""
    from examples.rllib_cartpole_league import freeze, ppo_config, round_robin_mapping

    stock = mode == "rllib"
    algorithm = ppo_config(env_runners=0, hidden=hidden, store=not stock).build_algo()
    names = [f"main_v{i}" for i in range(1, frozen + 1)]
    for i, name in enumerate(names):
        freeze(algorithm, name, round_robin_mapping(names[: i + 1]), stock=stock)
    if mode == "rllib+store guarded":
        for name in names:  # drop the adapter's fast-path wrappers: every op goes through the write guard
            for forward in ("forward_inference", "forward_exploration"):
                vars(algorithm.env_runner.module[name]).pop(forward)
    return algorithm


def timed_sample(algorithm: Any, steps: int) -> tuple[int, float, float]:
    """(env steps, wall seconds, CPU seconds of this process) of one ``sample`` of at least ``steps`` env steps."""
    wall, cpu = time.perf_counter(), time.process_time()
    episodes = algorithm.env_runner.sample(num_timesteps=steps, random_actions=False)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return sum(e.env_steps() for e in episodes), wall, cpu


def main(argv: list[str] | None = None) -> None:
    parser = make_parser("rllib_sampling", __doc__)
    parser.add_argument("--frozen", type=int, default=4, help="frozen modules (K), played in turn by agent 1")
    parser.add_argument("--hidden", type=int, default=1024,
                        help="width of the two hidden layers (1024: a 4.0 MiB frozen module)")
    parser.add_argument("--steps", type=int, default=4000, help="env steps per timed sample() call")
    parser.add_argument("--repeats", type=int, default=7, help="timed calls per mode, in alternation")
    args = parser.parse_args(argv)
    if args.quick:
        args.frozen, args.hidden, args.steps, args.repeats = 2, 256, 300, 2
    setup_logging(args.verbose)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    results = Results("rllib_sampling", args, {"frozen": args.frozen, "hidden": args.hidden, "steps": args.steps,
                                               "repeats": args.repeats})
    rates: dict[str, list[float]] = {mode: [] for mode in MODES}
    cpu: dict[str, list[float]] = {mode: [] for mode in MODES}
    with ray_session(object_store_bytes=500_000_000, num_cpus=2), progress() as bar:
        algorithms = {mode: build(mode, args.frozen, args.hidden) for mode in MODES}
        try:
            for algorithm in algorithms.values():
                timed_sample(algorithm, args.steps)  # warm-up: first episodes, lazy imports, allocator
            task = bar.add_task("timing sample()", total=args.repeats * len(MODES))
            for repeat in range(args.repeats):
                for mode in MODES if repeat % 2 == 0 else reversed(MODES):
                    steps, wall, cpu_s = timed_sample(algorithms[mode], args.steps)
                    rates[mode].append(steps / wall)
                    cpu[mode].append(1e3 * cpu_s / steps)
                    results.emit({"mode": mode, "repeat": repeat, "frozen": args.frozen, "hidden": args.hidden,
                                  "steps": steps, "steps_per_s": round(rates[mode][-1], 1),
                                  "cpu_ms_per_step": round(cpu[mode][-1], 3)})
                    bar.advance(task)
        finally:
            for algorithm in algorithms.values():
                algorithm.stop()
    stock = statistics.median(rates["rllib"])
    for mode in MODES:
        median = statistics.median(rates[mode])
        results.emit({"mode": mode, "repeat": "summary", "frozen": args.frozen, "hidden": args.hidden,
                      "steps": args.steps, "steps_per_s": round(median, 1),
                      "cpu_ms_per_step": round(statistics.median(cpu[mode]), 3), "vs_stock": round(median / stock, 3)})
    results.finish(COLUMNS, notes=["summary rows: medians over the repeats; vs_stock = median steps/s / stock's."])


if __name__ == "__main__":
    main(sys.argv[1:])

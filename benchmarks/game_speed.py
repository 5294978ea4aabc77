"""Game speed: each game's rollouts in the league against that game's own random-play stepping rate, on one core.

Per game, in one process with torch on one thread (a rollout worker's share of the machine), three rates in env
steps per CPU-second of this process (CPU time, not wall time, so that other jobs on the machine do not skew them):

* ``native``: random play through the game's own API, one state at a time (OpenSpiel: ``legal_actions``, a random
  pick, ``apply_action``, chance sampled); for the built-in ``connect4``, its vectorized env (as ``batched``);
* ``batched``: the league's env for the game (``--games`` envs as one ``VecGame``) stepped with random legal moves,
  one numpy draw per batch;
* ``rollout``: the same batch played the way a rollout worker plays a self-play match (``workers.play.play``:
  observations, one batched forward pass of the league's net per move, both sides' moves recorded, GAE at the end);
* ``net``: the league's net choosing moves (``league.model.act``: forward pass and sampling) for full batches of
  the game's observations, nothing else.

They alternate for ``--repeats`` rounds of ``--seconds`` each; the row holds the medians, ``rollout_x_native`` /
``rollout_x_batched`` (the goal: at least 0.5), and ``floor_x_native``: the most a rollout could reach with this env
and this net if recording the moves cost nothing, ``1 / (1 / batched + 1 / net)`` against native.

Games: tic-tac-toe, Leduc poker and Connect Four through the OpenSpiel path (``openspiel:<name>``), and the built-in
vectorized Connect Four (``connect4``) for comparison.

    python -m benchmarks.game_speed                 # 4 games, 512 envs, 3 rounds of 5 s each
    python -m benchmarks.game_speed --quick         # 32 envs, 1 round of 0.3 s (smoke test)
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from policystore.league.games import get_game
from policystore.league.model import act
from policystore.trainer.config import TrainConfig
from policystore.workers.play import net_policy, play

from . import harness

GAMES = ("openspiel:tic_tac_toe", "openspiel:leduc_poker", "openspiel:connect_four", "connect4")
OPENSPIEL = "openspiel:"
COLUMNS = ["game", "games", "hidden", "native_steps_per_s", "batched_steps_per_s", "net_steps_per_s",
           "rollout_steps_per_s", "rollout_x_native", "rollout_x_batched", "floor_x_native", "loadavg_1m"]


def native_rate(name: str, seconds: float) -> float:
    """Env steps per CPU-second of random play through OpenSpiel's own API, one state at a time."""
    import pyspiel

    game, rng = pyspiel.load_game(name), random.Random(0)
    steps, start = 0, time.process_time()
    while True:
        state = game.new_initial_state()
        while not state.is_terminal():
            if state.is_chance_node():
                actions, probs = zip(*state.chance_outcomes(), strict=True)
                state.apply_action(rng.choices(actions, probs)[0])
            else:
                state.apply_action(rng.choice(state.legal_actions()))
                steps += 1
        elapsed = time.process_time() - start
        if elapsed >= seconds:
            return steps / elapsed


def batched_rate(env: Any, rng: np.random.Generator, seconds: float) -> float:
    """Env steps per CPU-second of uniformly random legal play over the whole batch, whole batches at a time."""
    steps, start = 0, time.process_time()
    while True:
        env.reset()
        while True:
            ids = np.flatnonzero(~env.done)
            if ids.size == 0:
                break
            scores = rng.random((ids.size, env.num_actions))
            scores[~env.legal_mask(ids)] = -1.0
            env.step(scores.argmax(axis=1), ids)
            steps += ids.size
        elapsed = time.process_time() - start
        if elapsed >= seconds:
            return steps / elapsed


def rollout_rate(env: Any, net: torch.nn.Module, seconds: float) -> float:
    """Env steps per CPU-second of self-play matches as a rollout worker plays them (both sides recorded)."""
    policy = net_policy(net, torch.Generator().manual_seed(0))
    steps, start = 0, time.process_time()
    while True:
        steps += play(env, (policy, policy), record=(True, True)).steps
        elapsed = time.process_time() - start
        if elapsed >= seconds:
            return steps / elapsed


def net_rate(env: Any, net: torch.nn.Module, seconds: float) -> float:
    """Env steps per CPU-second of the net alone choosing moves for the whole batch (the first position's
    observations, all moves legal): what a rollout pays per move beyond stepping the env."""
    env.reset()
    ids = np.arange(env.num_envs)
    planes, legal = env.planes(ids), np.ones((env.num_envs, env.num_actions), dtype=bool)
    generator = torch.Generator().manual_seed(0)
    steps, start = 0, time.process_time()
    while True:
        act(net, planes, legal, generator)
        steps += env.num_envs
        elapsed = time.process_time() - start
        if elapsed >= seconds:
            return steps / elapsed


def measure(name: str, games: int, seconds: float, repeats: int, hidden: int) -> dict[str, Any]:
    game = get_game(name)
    env, net = game.make(games), game.net(hidden)
    rng = np.random.default_rng(0)
    rollout_rate(env, net, 0.0)  # warm up: torch's first forward, the trajectory buffers' pages
    rates: dict[str, list[float]] = {"native": [], "batched": [], "net": [], "rollout": []}
    for _ in range(repeats):
        batched = batched_rate(env, rng, seconds)
        rates["batched"].append(batched)
        rates["native"].append(native_rate(name[len(OPENSPIEL):], seconds) if name.startswith(OPENSPIEL)
                               else batched)
        rates["net"].append(net_rate(env, net, seconds))
        rates["rollout"].append(rollout_rate(env, net, seconds))
    median = {k: float(np.median(v)) for k, v in rates.items()}
    floor = 1.0 / (1.0 / median["batched"] + 1.0 / median["net"])
    return {"game": name, "games": games, "hidden": hidden, "seconds": seconds, "repeats": repeats,
            **{f"{k}_steps_per_s": round(v) for k, v in median.items()},
            "rollout_x_native": round(median["rollout"] / median["native"], 3),
            "rollout_x_batched": round(median["rollout"] / median["batched"], 3),
            "floor_x_native": round(floor / median["native"], 3)}


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    x = np.arange(len(rows))
    for k, (kind, label) in enumerate((("native", "random play, the game's own API"),
                                       ("batched", "random play, the league's batched env"),
                                       ("rollout", "league rollouts"))):
        ax.bar(x + (k - 1) * 0.27, [r[f"{kind}_steps_per_s"] for r in rows], 0.27, label=label)
    ax.set_xticks(x, [f"{r['game']}\n{r['rollout_x_native']:.2f}x native" for r in rows], fontsize=8)
    ax.set_ylabel("env steps per CPU-second, one core")
    ax.set_yscale("log")
    ax.set_title("Rollouts against random play, per game")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = harness.make_parser("game_speed", __doc__)
    parser.add_argument("--games-list", default=",".join(GAMES), help="comma-separated --game names "
                        f"(default {','.join(GAMES)})")
    parser.add_argument("--games", type=int, default=None, help="envs per batch (default: the trainer's "
                        "games per match, 512; --quick 32)")
    parser.add_argument("--seconds", type=float, default=None, help="CPU-seconds per measurement (default 5, "
                        "--quick 0.3)")
    parser.add_argument("--repeats", type=int, default=None, help="rounds per game (default 3, --quick 1)")
    parser.add_argument("--hidden", type=int, default=TrainConfig().hidden, help="net width (default: the trainer's)")
    args = parser.parse_args(argv)
    games = args.games or (32 if args.quick else TrainConfig().games_per_match)
    seconds = args.seconds or (0.3 if args.quick else 5.0)
    repeats = args.repeats or (1 if args.quick else 3)
    names = [n for n in args.games_list.split(",") if n]
    harness.setup_logging(args.verbose)
    torch.set_num_threads(1)
    results = harness.Results("game_speed", args, {"games": games, "seconds": seconds, "repeats": repeats,
                                                   "hidden": args.hidden, "game_names": names})
    for name in names:
        results.emit(measure(name, games, seconds, repeats, args.hidden))
    results.finish(COLUMNS, plot)


if __name__ == "__main__":
    main()

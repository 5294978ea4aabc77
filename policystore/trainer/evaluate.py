"""Strength of a trained agent against fixed opponents, over both seats, with a 95% confidence interval.

    python -m policystore.trainer.evaluate --run-dir runs/quickstart   # main_0 vs scripted players, 1000 games per seat
    python -m policystore.trainer.evaluate --run-dir runs/quickstart --player main_exploiter_0 --games 500
    python -m policystore.trainer.evaluate --run-dir runs/quickstart --search 64    # the agent plays with a PUCT search
    python -m policystore.trainer.evaluate --run-dir runs/quickstart --opponents mcts100,mcts1000 --games 50
    python -m policystore.trainer.evaluate --run-dir runs/quickstart --judge 200    # a perfect solver judges 200 moves

Opponents: the game's scripted players (Connect Four: ``random``; ``winblock``: win if you can, block if you must;
``safe``: win/block that never opens a cell where the opponent wins) and, for Connect Four with the ``openspiel``
extra installed, ``mcts<N>``: OpenSpiel's MCTSBot with N simulations and random rollouts, a reference nobody in
this project wrote.

``--judge N`` plays no games: on N Connect Four positions from random play where the choice matters, it counts how
often the agent's move keeps the game-theoretic value (``trainer.judge``), and the same for the scripted players.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import numpy as np
from torch import nn

from policystore.league.baselines import BASELINES
from policystore.league.constants import DEFAULT_PLAYER
from policystore.league.games import CONNECT4, Game, get_game
from policystore.trainer import judge, progress
from policystore.trainer.openspiel_bots import available as openspiel_available
from policystore.trainer.openspiel_bots import is_mcts, mcts_policy
from policystore.trainer.policy import load_net
from policystore.trainer.rundir import RunDir
from policystore.trainer.usage import bad_input
from policystore.workers.play import Policy, net_policy, play, scripted_policy, search_policy

PROG = "python -m policystore.trainer.evaluate"


def wilson_interval(wins: float, games: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a rate (draws count as half a win where the caller says so)."""
    if games == 0:
        return 0.0, 1.0
    p = wins / games
    centre = (p + z * z / (2 * games)) / (1 + z * z / games)
    half = z * math.sqrt(p * (1 - p) / games + z * z / (4 * games * games)) / (1 + z * z / games)
    return max(0.0, centre - half), min(1.0, centre + half)


def check_opponents(names: tuple[str, ...], game: Game) -> tuple[str, ...]:
    """``names`` if ``game`` has each of them (its scripted players; ``mcts<N>`` for Connect Four); else ValueError."""
    for name in names:
        if is_mcts(name) and game.name != CONNECT4.name:
            raise ValueError(f"OpenSpiel opponents play Connect Four only, not {game.name!r}")
        if not is_mcts(name) and name not in game.baselines:
            more = " or mcts<simulations>" if game.name == CONNECT4.name else ""
            raise ValueError(f"unknown opponent {name!r} for {game.name}: choose from {list(game.baselines)}{more}")
    return names


def _opponent(name: str, num_envs: int, rng: np.random.Generator, seed: int) -> Policy:
    return mcts_policy(name, num_envs, seed) if is_mcts(name) else scripted_policy(BASELINES[name], rng)


def evaluate(net: nn.Module, game: Game = CONNECT4, games_per_seat: int = 1000, seed: int = 0, search: int = 0,
             opponents: tuple[str, ...] | None = None, show_progress: bool = False) -> dict[str, dict[str, float]]:
    """Greedy play (argmax, as ``load_policy`` plays; or the move of a ``search``-simulation PUCT search) against
    each opponent, half the games moving first. Rates are fractions of all games; ``win_first``/``win_second``
    split them by seat; ``win_low``/``win_high`` bound the win rate (95% Wilson interval); ``ms_per_batch_move`` is the
    agent's time per batched call (one move in every unfinished game). ``show_progress``: a bar per opponent
    (``trainer.progress``)."""
    if search and game.name != CONNECT4.name:
        raise ValueError(f"--search plays Connect Four only, not {game.name!r}")
    rng = np.random.default_rng(seed)
    env = game.make(2 * games_per_seat)
    first = np.arange(env.num_envs) % 2 == 0  # play() seats side 0 first in even games
    results = {}
    for name in check_opponents(opponents or game.baselines, game):
        agent = search_policy(net, search) if search else net_policy(net, greedy=True)
        with progress.task(f"vs {name}", env.num_envs, "games") if show_progress else nullcontext(None) as done:
            timed = _Timed(agent, done)
            outcome = play(env, (timed, _opponent(name, env.num_envs, rng, seed)))
        won = env.winner == np.where(first, 1, 2)
        low, high = wilson_interval(outcome.wins, env.num_envs)
        results[name] = {"win": outcome.wins / env.num_envs, "draw": outcome.draws / env.num_envs,
                         "loss": outcome.losses / env.num_envs, "win_first": float(won[first].mean()),
                         "win_second": float(won[~first].mean()), "win_low": low, "win_high": high,
                         "games": env.num_envs, "ms_per_batch_move": 1e3 * timed.seconds / max(timed.moves, 1)}
    return results


def judge_players(net: nn.Module, positions: int, seed: int = 0, search: int = 0,
                  stones: tuple[int, int] = judge.STONES, cache_dir: Path | None = judge.CACHE_DIR,
                  show_progress: bool = False) -> dict[str, dict[str, float]]:
    """On ``positions`` judged positions (``trainer.judge``, from ``seed``): the fraction where the agent's move
    (greedy, or a ``search``-simulation search) keeps the value, with its 95% Wilson interval, and the same for the
    scripted players as yardsticks; ``quiet_*`` the same on the quiet positions alone (no win in one, no threat
    to block); ``skipped``/``sampled`` say how the set was drawn. ``show_progress``: a bar while positions are
    drawn and solved (the long part)."""
    with progress.task("solving positions", positions, "positions") if show_progress else nullcontext(None) as done:
        found = judge.sample_positions(positions, seed, stones, cache_dir=cache_dir, done=done)
    quiet = np.array([p.quiet for p in found.positions], dtype=bool)
    rng = np.random.default_rng(seed)
    players = {"agent": search_policy(net, search) if search else net_policy(net, greedy=True),
               **{name: scripted_policy(player, rng) for name, player in BASELINES.items()}}
    results = {}
    for name, policy in players.items():
        kept = judge.score(policy, found.positions)
        low, high = wilson_interval(int(kept.sum()), positions)
        quiet_low, quiet_high = wilson_interval(int(kept[quiet].sum()), int(quiet.sum()))
        results[name] = {"kept": float(kept.mean()), "kept_low": low, "kept_high": high, "positions": positions,
                         "quiet_kept": float(kept[quiet].mean()) if quiet.any() else float("nan"),
                         "quiet_low": quiet_low, "quiet_high": quiet_high, "quiet_positions": int(quiet.sum()),
                         "skipped": found.skipped, "sampled": found.sampled}
    return results


class _Timed:
    """Wraps a policy, adding up the time its batched calls take (and telling ``done`` how many games ended)."""

    def __init__(self, policy: Policy, done: Callable[[int], None] | None = None):
        self.policy, self.seconds, self.moves, self.done = policy, 0.0, 0, done

    def __call__(self, env, ids, planes, legal):
        if self.done is not None:
            self.done(int(env.done.sum()))
        start = time.perf_counter()
        out = self.policy(env, ids, planes, legal)
        self.seconds += time.perf_counter() - start
        self.moves += 1
        return out


def _version(text: str) -> int | str:
    if text == "latest" or text.isdigit() and int(text) >= 1:
        return text if text == "latest" else int(text)
    raise argparse.ArgumentTypeError(f"expected latest or a version number >= 1, got {text!r}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", required=True, help="a directory written by `python -m policystore.trainer`")
    parser.add_argument("--player", default=DEFAULT_PLAYER, help=f"player or snapshot name (default: {DEFAULT_PLAYER})")
    parser.add_argument("--version", type=_version, default="latest",
                        help="store version of the player (default: latest)")
    parser.add_argument("--games", type=int, default=1000, help="games per seat and opponent (default 1000)")
    parser.add_argument("--search", type=int, default=0, metavar="N",
                        help="play with a PUCT search of N simulations per move (Connect Four; default 0: the net)")
    parser.add_argument("--opponents", default=None,
                        help="comma-separated: random, winblock, safe, mcts<N> (default: the game's scripted players)")
    parser.add_argument("--judge", type=int, default=0, metavar="N",
                        help="instead of games: judge the agent's moves on N positions with a perfect solver "
                             "(Connect Four; positions cached in ~/.cache/policystore/judge)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = parser.parse_args(argv)
    if args.games < 1 or args.search < 0 or args.judge < 0:
        parser.error("--games must be >= 1, --search and --judge >= 0")
    with bad_input(PROG):  # everything the command line names, before the long work
        game = get_game(RunDir(args.run_dir).load_config().game)
        if (args.judge or args.search) and game.name != CONNECT4.name:
            raise ValueError(f"--judge and --search play Connect Four only; {args.run_dir} trained {game.name!r}")
        opponents = check_opponents(tuple(args.opponents.split(",")) if args.opponents else game.baselines, game)
        if any(is_mcts(name) for name in opponents) and not openspiel_available():
            raise ImportError("OpenSpiel opponents need the openspiel extra: pip install 'policystore[openspiel]'")
        net = load_net(args.run_dir, args.player, args.version)
    if args.judge:
        _print_judge(args, net)
        return
    results = evaluate(net, game, args.games, args.seed, args.search, opponents, show_progress=True)
    if args.json:
        print(json.dumps({"player": args.player, "version": args.version, "search": args.search, **results}))
        return
    how = f"with a {args.search}-simulation search" if args.search else "greedy"
    print(f"{args.player} ({args.version}, {how}), {2 * args.games} games per opponent, both seats:")
    for name, r in results.items():
        print(f"  vs {name:9s} win {r['win']:6.1%} [{r['win_low']:.1%}, {r['win_high']:.1%}]  draw {r['draw']:6.1%}"
              f"  loss {r['loss']:6.1%}   (win moving first {r['win_first']:.1%}, second {r['win_second']:.1%};"
              f" {r['ms_per_batch_move']:.1f} ms per batched move)")


def _print_judge(args: argparse.Namespace, net: nn.Module) -> None:
    results = judge_players(net, args.judge, args.seed, args.search, show_progress=True)
    if args.json:
        print(json.dumps({"player": args.player, "version": args.version, "search": args.search, "judge": results}))
        return
    how = f"with a {args.search}-simulation search" if args.search else "greedy"
    first = next(iter(results.values()))
    print(f"a perfect solver's judgement on {args.judge} positions from random play where the choice matters "
          f"(seed {args.seed}; {first['sampled']} drawn, {first['skipped']} skipped as too slow to solve):")
    for name, r in results.items():
        who = f"{args.player} ({args.version}, {how})" if name == "agent" else name
        print(f"  {who} keeps the value in {r['kept']:.1%} of {args.judge} positions "
              f"[{r['kept_low']:.1%}, {r['kept_high']:.1%}] (95% Wilson interval); in {r['quiet_kept']:.1%} of "
              f"the {r['quiet_positions']} quiet ones [{r['quiet_low']:.1%}, {r['quiet_high']:.1%}]")
    print("  (quiet: no win in one and no threat to block, where winning and blocking alone do not find the move)")


if __name__ == "__main__":
    main()

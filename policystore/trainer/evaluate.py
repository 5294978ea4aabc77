"""Strength of a trained agent, by the measure that fits its game, over both seats, with 95% confidence intervals.

    python -m policystore.trainer.evaluate --run-dir runs/quickstart   # main_0 vs scripted players, 1000 games per seat
    python -m policystore.trainer.evaluate --run-dir runs/quickstart --player main_exploiter_0 --games 500
    python -m policystore.trainer.evaluate --run-dir runs/quickstart --search 64    # the agent plays with a PUCT search
    python -m policystore.trainer.evaluate --run-dir runs/quickstart --opponents mcts100,mcts1000 --games 50
    python -m policystore.trainer.evaluate --run-dir runs/quickstart --judge 200    # a perfect solver judges 200 moves
    python -m policystore.trainer.evaluate --run-dir runs/leduc          # poker: NashConv over the run, then games

The run folder says which game it trained (its config.json), so no command needs a --game.

Opponents: the game's scripted players (every game: ``random``; Connect Four also ``winblock``: win if you can,
block if you must; ``safe``: win/block that never opens a cell where the opponent wins) and, for a perfect-information
game with an OpenSpiel twin (Connect Four, ``openspiel:tic_tac_toe``, ...) and the ``openspiel`` extra installed,
``mcts<N>``: OpenSpiel's MCTSBot with N simulations and random rollouts, a reference nobody in this project wrote.
Each result has the agent's mean return per game in the game's own units (chips for poker) beside its win rate.

For a small imperfect-information game (``openspiel:kuhn_poker``, ``openspiel:leduc_poker``), the command first prints
the exact NashConv of the player's policy, computed by OpenSpiel (0 is a Nash equilibrium), and that of the main
agent's snapshots over the run (``trainer.reference``'s milestones), then plays its games.

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
from typing import Any

import numpy as np
from torch import nn

from policystore.league import exploitability
from policystore.league.baselines import BASELINES
from policystore.league.constants import DEFAULT_PLAYER, HISTORICAL
from policystore.league.games import CONNECT4, Game, get_game
from policystore.league.matchmaking import League
from policystore.trainer import judge, progress
from policystore.trainer.openspiel_bots import Moves, is_mcts, mcts_policy, mcts_unfit
from policystore.trainer.policy import load_net
from policystore.trainer.rundir import RunDir
from policystore.trainer.usage import bad_input
from policystore.workers.play import Policy, net_policy, play, scripted_policy, search_policy

PROG = "python -m policystore.trainer.evaluate"
SNAPSHOTS = 4  # frozen snapshots measured over the run besides the player now (milestones)


def wilson_interval(wins: float, games: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a rate (draws count as half a win where the caller says so)."""
    if games == 0:
        return 0.0, 1.0
    p = wins / games
    centre = (p + z * z / (2 * games)) / (1 + z * z / games)
    half = z * math.sqrt(p * (1 - p) / games + z * z / (4 * games * games)) / (1 + z * z / games)
    return max(0.0, centre - half), min(1.0, centre + half)


def milestones(summary: list[dict[str, Any]], player: str = DEFAULT_PLAYER, count: int = SNAPSHOTS
               ) -> list[tuple[str, int]]:
    """``(name, env steps)`` of ``count`` of ``player``'s snapshots evenly spread over the run, the last one
    included, then of ``player`` itself at the league's env steps now. Left out: snapshots frozen before any
    training (the initial weights) and those of a league saved before freeze steps were kept."""
    snaps = [(r["name"], r["frozen_at"]) for r in summary if r["parent"] == player and r.get("frozen_at")]
    n = len(snaps)
    picked = snaps if n <= count else [snaps[math.ceil(k * n / count) - 1] for k in range(1, count + 1)]
    return [*picked, (player, sum(r["steps"] for r in summary if r["kind"] != HISTORICAL))]


def check_opponents(names: tuple[str, ...], game: Game) -> tuple[str, ...]:
    """``names`` if ``game`` has each of them (its scripted players; ``mcts<N>`` where OpenSpiel's MCTS can play
    it); else ValueError."""
    for name in names:
        if is_mcts(name):
            reason = mcts_unfit(game)
            if reason:
                raise ValueError(f"opponent {name}: {reason}")
        elif name not in game.baselines:
            more = " or mcts<simulations>" if mcts_unfit(game) is None else ""
            raise ValueError(f"unknown opponent {name!r} for {game.name}: choose from {list(game.baselines)}{more}")
    return names


def evaluate(net: nn.Module, game: Game = CONNECT4, games_per_seat: int = 1000, seed: int = 0, search: int = 0,
             opponents: tuple[str, ...] | None = None, show_progress: bool = False) -> dict[str, dict[str, float]]:
    """Greedy play (argmax, as ``load_policy`` plays; or the move of a ``search``-simulation PUCT search) against
    each opponent, half the games moving first. Rates are fractions of all games (a win: a positive return);
    ``win_first``/``win_second`` split them by seat; ``win_low``/``win_high`` bound the win rate (95% Wilson
    interval); ``return`` is the agent's mean return per game in the game's units; ``ms_per_batch_move`` is the
    agent's time per batched call (one move in every unfinished game). ``show_progress``: a bar per opponent
    (``trainer.progress``)."""
    if search and game.search is None:
        raise ValueError(f"--search needs a game with a tree search (Connect Four), not {game.name!r}")
    rng = np.random.default_rng(seed)
    env = game.make(2 * games_per_seat)
    first = np.arange(env.num_envs) % 2 == 0  # play() seats side 0 first in even games
    results = {}
    for name in check_opponents(opponents or game.baselines, game):
        agent = search_policy(net, search) if search else net_policy(net, greedy=True)
        with progress.task(f"vs {name}", env.num_envs, "games") if show_progress else nullcontext(None) as done:
            timed = _Timed(agent, done)
            outcome = play(env, _seated(timed, name, game, env.num_envs, rng, seed))
        won = env.winner == np.where(first, 1, 2)
        low, high = wilson_interval(outcome.wins, env.num_envs)
        results[name] = {"win": outcome.wins / env.num_envs, "draw": outcome.draws / env.num_envs,
                         "loss": outcome.losses / env.num_envs, "win_first": float(won[first].mean()),
                         "win_second": float(won[~first].mean()), "win_low": low, "win_high": high,
                         "return": float(np.where(first, env.returns, -env.returns).mean()),
                         "games": env.num_envs, "ms_per_batch_move": 1e3 * timed.seconds / max(timed.moves, 1)}
    return results


def _seated(agent: Policy, name: str, game: Game, num_envs: int, rng: np.random.Generator, seed: int
            ) -> tuple[Policy, Policy]:
    """The agent and its opponent ``name``; against MCTS both write the moves they play to one record, from which
    the bot follows each game."""
    if not is_mcts(name):
        return agent, scripted_policy(BASELINES[name], rng)
    moves = Moves(num_envs)
    return moves.record(agent), moves.record(mcts_policy(name, game, moves, seed))


def nash_conv_curve(run_dir: str | Path, player: str = DEFAULT_PLAYER, version: int | str = "latest"
                    ) -> dict[str, Any]:
    """The exact NashConv (OpenSpiel's) of ``player`` at ``version`` and of the main agent at its milestones over the
    run, with the uniform policy's for scale: ``{"player", "nash_conv", "uniform_nash_conv", "points": [{"player",
    "steps", "nash_conv"}]}``. Raises ValueError for a game it does not fit (perfect information, no OpenSpiel
    twin)."""
    rd = RunDir(run_dir)
    game = get_game(rd.load_config().game)
    if game.perfect_information or game.openspiel is None:
        raise ValueError(f"NashConv needs an imperfect-information game with an OpenSpiel twin, not {game.name!r}")
    summary = League.from_dict(rd.read_json(rd.league, None)).summary() if rd.league.exists() else []
    points = [{"player": name, "steps": steps, "nash_conv": exploitability.nash_conv(load_net(rd.root, name),
                                                                                     game.openspiel)}
              for name, steps in (milestones(summary) if summary else [])]
    return {"player": player, "nash_conv": exploitability.nash_conv(load_net(rd.root, player, version), game.openspiel),
            "uniform_nash_conv": exploitability.uniform_nash_conv(game.openspiel), "points": points}


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
        if args.judge and game.name != CONNECT4.name:
            raise ValueError(f"--judge judges Connect Four only; {args.run_dir} trained {game.name!r}")
        if args.search and game.search is None:
            raise ValueError(f"--search needs a game with a tree search (Connect Four); {args.run_dir} trained "
                             f"{game.name!r}")
        opponents = check_opponents(tuple(args.opponents.split(",")) if args.opponents else game.baselines, game)
        net = load_net(args.run_dir, args.player, args.version)
        solvable = not game.perfect_information and exploitability.unfit(game.openspiel) is None
    if args.judge:
        _print_judge(args, net)
        return
    curve = nash_conv_curve(args.run_dir, args.player, args.version) if solvable else None
    if curve and not args.json:
        _print_nash_conv(args, curve)
    results = evaluate(net, game, args.games, args.seed, args.search, opponents, show_progress=True)
    if args.json:
        print(json.dumps({"player": args.player, "version": args.version, "search": args.search, **results}
                         | ({"nash_conv": curve} if curve else {})))
        return
    how = f"with a {args.search}-simulation search" if args.search else "greedy"
    print(f"{args.player} ({args.version}, {how}), {2 * args.games} games per opponent, both seats:")
    for name, r in results.items():
        print(f"  vs {name:9s} win {r['win']:6.1%} [{r['win_low']:.1%}, {r['win_high']:.1%}]  draw {r['draw']:6.1%}"
              f"  loss {r['loss']:6.1%}   mean return {r['return']:+.3f}   (win moving first {r['win_first']:.1%}, "
              f"second {r['win_second']:.1%}; {r['ms_per_batch_move']:.1f} ms per batched move)")


def _print_nash_conv(args: argparse.Namespace, curve: dict[str, Any]) -> None:
    print(f"{args.player} ({args.version}): NashConv {curve['nash_conv']:.4f} (exploitability "
          f"{curve['nash_conv'] / 2:.4f}; the uniform-random policy: {curve['uniform_nash_conv']:.4f}), computed "
          "exactly by OpenSpiel; 0 is a Nash equilibrium")
    if curve["points"]:
        print(f"  {DEFAULT_PLAYER} over the run: " + ", ".join(
            f"{p['player']} at {p['steps'] / 1e6:.2f} M steps {p['nash_conv']:.4f}" for p in curve["points"]))


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

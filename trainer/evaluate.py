"""Strength of a trained agent against the scripted players, over both seats.

    python -m trainer.evaluate --run-dir runs/demo            # main agent, 1000 games per seat
    python -m trainer.evaluate --run-dir runs/demo --player main_exploiter_0 --games 500
"""

from __future__ import annotations

import argparse
import json

import numpy as np
from torch import nn

from league.baselines import BASELINES
from league.constants import DEFAULT_PLAYER
from league.games import CONNECT4, Game, get_game
from trainer.policy import load_net
from trainer.rundir import RunDir
from workers.play import net_policy, play, scripted_policy


def evaluate(net: nn.Module, game: Game = CONNECT4, games_per_seat: int = 1000,
             seed: int = 0) -> dict[str, dict[str, float]]:
    """Greedy play (argmax, as ``load_policy`` plays) against each of the game's scripted opponents, half
    the games moving first. Rates are fractions of all games; ``win_first``/``win_second`` split them by seat."""
    rng = np.random.default_rng(seed)
    env = game.make(2 * games_per_seat)
    first = np.arange(env.num_envs) % 2 == 0  # play() seats side 0 first in even games
    results = {}
    for name in game.baselines:
        outcome = play(env, (net_policy(net, greedy=True), scripted_policy(BASELINES[name], rng)))
        won = env.winner == np.where(first, 1, 2)
        results[name] = {"win": outcome.wins / env.num_envs, "draw": outcome.draws / env.num_envs,
                         "loss": outcome.losses / env.num_envs, "win_first": float(won[first].mean()),
                         "win_second": float(won[~first].mean()), "games": env.num_envs}
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m trainer.evaluate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", required=True, help="a directory written by `python -m trainer`")
    parser.add_argument("--player", default=DEFAULT_PLAYER, help=f"player or snapshot name (default: {DEFAULT_PLAYER})")
    parser.add_argument("--version", default="latest", help="store version of the player (default: latest)")
    parser.add_argument("--games", type=int, default=1000, help="games per seat and opponent (default 1000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = parser.parse_args(argv)
    version = args.version if args.version == "latest" else int(args.version)
    net = load_net(args.run_dir, args.player, version)
    results = evaluate(net, get_game(RunDir(args.run_dir).load_config().game), args.games, args.seed)
    if args.json:
        print(json.dumps({"player": args.player, "version": args.version, **results}))
        return
    print(f"{args.player} ({args.version}), {2 * args.games} games per opponent, both seats:")
    for name, r in results.items():
        print(f"  vs {name:9s} win {r['win']:6.1%}  draw {r['draw']:6.1%}  loss {r['loss']:6.1%}   "
              f"(win moving first {r['win_first']:.1%}, second {r['win_second']:.1%})")


if __name__ == "__main__":
    main()

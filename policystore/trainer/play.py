"""Play a trained agent in the terminal, in the game its run trained (config.json says which), drawn by the game's
own text rendering.

    python -m policystore.trainer.play --run-dir runs/quickstart               # you move first
    python -m policystore.trainer.play --run-dir runs/quickstart --second      # the agent moves first
    python -m policystore.trainer.play --run-dir runs/quickstart --search 256  # Connect Four: the agent searches
    python -m policystore.trainer.play --run-dir runs/leduc                    # poker: you see only your own cards
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import numpy as np

from policystore.league.constants import DEFAULT_PLAYER
from policystore.league.games import get_game
from policystore.league.vecgame import Game
from policystore.trainer.policy import load_net
from policystore.trainer.rundir import RunDir
from policystore.trainer.usage import bad_input
from policystore.workers.play import Policy, net_policy, search_policy

PROG = "python -m policystore.trainer.play"


def action_names(game: Game, num_actions: int) -> list[str]:
    """Each action's name where the game's OpenSpiel twin has one (``Raise``, ``x(1,1)``), else its number."""
    names = [str(a) for a in range(num_actions)]
    if game.openspiel is None:
        return names
    try:
        import pyspiel
    except ImportError:
        return names
    twin = pyspiel.load_game(game.openspiel)
    for a in range(num_actions):
        name = twin.action_to_string(0, a)
        if not name.startswith("Action("):  # OpenSpiel's placeholder for a move that has no name out of context
            names[a] = f"{a} ({name})"
    return names


def play_game(game: Game, agent: Policy, human_player: int, read: Callable[[str], str] = input,
              write: Callable[[str], None] = print) -> float:
    """One game of ``game`` between you (player ``human_player``, 1 or 2) and ``agent``, drawn as you may see it
    (a hidden card stays hidden until the end); returns your return in the game's units (a win: 1)."""
    env = game.make(1)
    env.reset()
    ids = np.array([0])
    names = action_names(game, env.num_actions)
    while not env.done[0]:
        legal = np.flatnonzero(env.legal_mask(ids)[0])
        if env.to_move[0] == human_player:
            write(env.render(0, human_player))
            choices = ", ".join(names[a] for a in legal)
            answer = read(f"your move (player {human_player}): {choices}: ").strip()
            if not answer.isdigit() or int(answer) not in legal:
                write(f"'{answer}' is not a legal move; choose one of {legal.tolist()}")
                continue
            action = int(answer)
        else:
            actions, _, _ = agent(env, ids, env.planes(ids).astype(np.float32), env.legal_mask(ids))
            action = int(actions[0])
            write(f"agent plays {names[action]}")
        env.step(np.array([action]), ids)
    write(env.render(0))
    mine = float(env.returns[0]) * (1 if human_player == 1 else -1)
    write("draw" if mine == 0 else (f"you win {mine:g}" if mine > 0 else f"the agent wins {-mine:g}"))
    return mine


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", required=True, help="a directory written by `python -m policystore.trainer`")
    parser.add_argument("--player", default=None, help=f"player or snapshot to play (default: {DEFAULT_PLAYER})")
    parser.add_argument("--second", action="store_true", help="let the agent move first")
    parser.add_argument("--search", type=int, default=0, metavar="N",
                        help="the agent plays with a PUCT search of N simulations per move (Connect Four; "
                             "default 0: the net alone)")
    args = parser.parse_args(argv)
    if args.search < 0:
        parser.error("--search must be >= 0")
    with bad_input(PROG):
        game = get_game(RunDir(args.run_dir).load_config().game)
        if args.search and game.search is None:
            raise ValueError(f"--search needs a game with a tree search (Connect Four); {args.run_dir} trained "
                             f"{game.name!r}")
        net = load_net(args.run_dir, args.player)
    agent = search_policy(net, args.search) if args.search else net_policy(net, greedy=True)
    try:
        play_game(game, agent, human_player=2 if args.second else 1)
    except (KeyboardInterrupt, EOFError):
        print()


if __name__ == "__main__":
    main()

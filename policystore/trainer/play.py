"""Play Connect Four against a trained agent in the terminal.

    python -m policystore.trainer.play --run-dir runs/quickstart               # you move first
    python -m policystore.trainer.play --run-dir runs/quickstart --second      # the agent moves first
    python -m policystore.trainer.play --run-dir runs/quickstart --search 256  # the agent searches 256 simulations
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import numpy as np

from policystore.league.connect4 import COLS, VecConnectFour
from policystore.league.constants import DEFAULT_PLAYER
from policystore.trainer.policy import load_policy
from policystore.trainer.usage import bad_input

PROG = "python -m policystore.trainer.play"
SYMBOLS = {0: ".", 1: "X", 2: "O"}


def render(board: np.ndarray) -> str:
    rows = [" ".join(SYMBOLS[int(v)] for v in row) for row in board]
    return "\n".join(rows + [" ".join(str(c) for c in range(COLS))])


def play_game(agent: Callable, human_player: int, read: Callable[[str], str] = input,
              write: Callable[[str], None] = print) -> int:
    """One game; returns the winner (0 for a draw). ``read``/``write`` are swappable for tests."""
    env = VecConnectFour(1)
    ids = np.array([0])
    while not env.done[0]:
        write(render(env.boards[0]))
        legal = np.flatnonzero(env.legal_mask()[0])
        if env.to_move[0] == human_player:
            answer = read(f"your move ({SYMBOLS[human_player]}), column {legal.tolist()}: ").strip()
            if not answer.isdigit() or int(answer) not in legal:
                write(f"'{answer}' is not a playable column; choose one of {legal.tolist()}")
                continue
            column = int(answer)
        else:
            column = agent(env.boards[0], int(env.to_move[0]), legal)
            write(f"agent plays column {column}")
        env.step(np.array([column]), ids)
    write(render(env.boards[0]))
    winner = int(env.winner[0])
    write("draw" if winner == 0 else ("you win" if winner == human_player else "the agent wins"))
    return winner


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", required=True, help="a directory written by `python -m policystore.trainer`")
    parser.add_argument("--player", default=None, help=f"player or snapshot to play (default: {DEFAULT_PLAYER})")
    parser.add_argument("--second", action="store_true", help="let the agent move first")
    parser.add_argument("--search", type=int, default=0, metavar="N",
                        help="the agent plays with a PUCT search of N simulations per move (default 0: the net alone)")
    args = parser.parse_args(argv)
    if args.search < 0:
        parser.error("--search must be >= 0")
    with bad_input(PROG):
        agent = load_policy(args.run_dir, args.player, search=args.search)
    try:
        play_game(agent, human_player=2 if args.second else 1)
    except (KeyboardInterrupt, EOFError):
        print()


if __name__ == "__main__":
    main()

"""The main agent against a reference nobody here wrote, at a few points of the run: OpenSpiel's MCTS(100).

Measured once training has ended, never during it: on two cores an evaluation beside the league would take CPU
from the rollouts and the learners. A few of the main agent's frozen snapshots, evenly spread over the run, and
its final version each play a fixed number of games against the bot, half of them moving first, with a fixed
seed; the learning curve shows them at the env steps at which each snapshot was frozen. Without the openspiel
extra (or for a game other than Connect Four) the measurement is skipped and the record says why.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn

from league.constants import DEFAULT_PLAYER, HISTORICAL
from league.games import CONNECT4, Game, get_game
from trainer import openspiel_bots
from trainer.evaluate import evaluate
from trainer.policy import load_net
from trainer.rundir import RunDir

OPPONENT = "mcts100"
SNAPSHOTS = 4  # frozen snapshots measured besides the final version
RATES = ("win", "draw", "loss", "win_low", "win_high", "games")


def milestones(summary: list[dict[str, Any]], player: str = DEFAULT_PLAYER, count: int = SNAPSHOTS
               ) -> list[tuple[str, int]]:
    """``(name, env steps)`` of ``count`` of ``player``'s snapshots evenly spread over the run, the last one
    included, then of ``player`` itself at the league's env steps now. Left out: snapshots frozen before any
    training (the initial weights) and those of a league saved before freeze steps were kept."""
    snaps = [(r["name"], r["frozen_at"]) for r in summary if r["parent"] == player and r.get("frozen_at")]
    n = len(snaps)
    picked = snaps if n <= count else [snaps[math.ceil(k * n / count) - 1] for k in range(1, count + 1)]
    return [*picked, (player, sum(r["steps"] for r in summary if r["kind"] != HISTORICAL))]


def skip_reason(game: Game, games_per_seat: int) -> str | None:
    """Why the reference cannot be measured here, or None when it can."""
    if games_per_seat < 1:
        return "reference_games is 0"
    if game.name != CONNECT4.name:
        return f"OpenSpiel's MCTS plays Connect Four only, not {game.name!r}"
    if not openspiel_bots.available():
        return 'open_spiel is not installed (pip install -e ".[openspiel]")'
    return None


def play_point(net: nn.Module, game: Game, games_per_seat: int, seed: int) -> dict[str, float]:
    """One point: ``net`` (greedy) against the reference bot, both seats; rates and the win rate's 95% interval."""
    result = evaluate(net, game, games_per_seat, seed, opponents=(OPPONENT,))[OPPONENT]
    return {k: result[k] for k in RATES}


def play_point_of_run(run_dir: str | Path, player: str, games_per_seat: int, seed: int) -> dict[str, float]:
    """``play_point`` for a player or snapshot of a run, read from its store folder (what a Ray task runs)."""
    return play_point(load_net(run_dir, player), get_game(RunDir(run_dir).load_config().game), games_per_seat, seed)


def measure(summary: list[dict[str, Any]], game: Game, games_per_seat: int,
            play: Callable[[list[str]], list[dict[str, float]]]) -> dict[str, Any]:
    """The report's record: the opponent, games per point, the seconds it took and one point per milestone
    (player, env steps, rates), or ``skipped`` with the reason. ``play(names)`` plays the points (``play_point``
    for each name, in parallel where it can)."""
    record: dict[str, Any] = {"opponent": OPPONENT, "games_per_point": 2 * games_per_seat}
    reason = skip_reason(game, games_per_seat)
    if reason:
        return record | {"skipped": reason}
    start = time.perf_counter()
    marks = milestones(summary)
    results = play([name for name, _ in marks])
    points = [{"player": name, "steps": steps, **r} for (name, steps), r in zip(marks, results, strict=True)]
    return record | {"seconds": time.perf_counter() - start, "points": points}

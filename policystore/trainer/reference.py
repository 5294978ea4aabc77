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
from typing import Any

from torch import nn

from policystore.league.constants import DEFAULT_PLAYER, HISTORICAL
from policystore.league.games import CONNECT4, Game
from policystore.trainer import openspiel_bots
from policystore.trainer.evaluate import evaluate

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


def measure(summary: list[dict[str, Any]], load: Callable[[str], nn.Module], game: Game, games_per_seat: int,
            seed: int = 0) -> dict[str, Any]:
    """The report's record: the opponent, games per point, the seconds it took and one point per milestone
    (player, env steps, win/draw/loss rates, the win rate's 95% interval), or ``skipped`` with the reason.
    ``load(name)`` returns the net of a player or snapshot. In this process, one point after the other: a Ray
    task per point would start a process that imports torch and OpenSpiel, which on two busy cores costs more
    than the games."""
    record: dict[str, Any] = {"opponent": OPPONENT, "games_per_point": 2 * games_per_seat}
    reason = skip_reason(game, games_per_seat)
    if reason:
        return record | {"skipped": reason}
    start = time.perf_counter()
    points = []
    for name, steps in milestones(summary):
        result = evaluate(load(name), game, games_per_seat, seed, opponents=(OPPONENT,))[OPPONENT]
        points.append({"player": name, "steps": steps, **{k: result[k] for k in RATES}})
    return record | {"seconds": time.perf_counter() - start, "points": points}

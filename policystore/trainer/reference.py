"""The main agent judged by a referee nobody here wrote, at a few points of the run, by the measure that fits the game.

- Perfect-information games with an OpenSpiel twin (Connect Four, ``openspiel:tic_tac_toe``, ...): win rates against
  OpenSpiel's MCTS(100) (``trainer.openspiel_bots``), a fixed number of games per point, half of them moving first.
- Small imperfect-information games (``openspiel:kuhn_poker``, ``openspiel:leduc_poker``, ...): the exact NashConv
  of the agent's policy, computed by OpenSpiel (``league.exploitability``); 0 is a Nash equilibrium.

Measured once training has ended, never during it: on two cores a measurement beside the league would take CPU
from the rollouts and the learners. A few of the main agent's frozen snapshots, evenly spread over the run, and its
final version are measured (``evaluate.milestones``); the learning curve shows them at the env steps at which each
snapshot was frozen. A game neither measure fits (or a machine without the openspiel extra) skips it, and the
record says why.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from torch import nn

from policystore.league import exploitability
from policystore.league.vecgame import Game
from policystore.trainer import openspiel_bots
from policystore.trainer.evaluate import evaluate, milestones

OPPONENT = "mcts100"
MCTS, NASH_CONV = "mcts", "nash_conv"  # the two measures
RATES = ("win", "draw", "loss", "win_low", "win_high", "games")


def measure_of(game: Game) -> str:
    """The measure that fits ``game``: NashConv where players hide information, MCTS where they do not."""
    return MCTS if game.perfect_information else NASH_CONV


def skip_reason(game: Game, games_per_seat: int) -> str | None:
    """Why the game's measure cannot be taken here, or None when it can."""
    if games_per_seat < 1:
        return "reference_games is 0"
    if measure_of(game) == MCTS:
        return openspiel_bots.mcts_unfit(game)
    return exploitability.unfit(game.openspiel)


def measure(summary: list[dict[str, Any]], load: Callable[[str], nn.Module], game: Game, games_per_seat: int,
            seed: int = 0) -> dict[str, Any]:
    """The report's record: which measure, the seconds it took and one point per milestone (player, env steps,
    then for MCTS the win/draw/loss rates and the win rate's 95% interval, for NashConv its value and the uniform
    policy's beside it), or ``skipped`` with the reason. ``load(name)`` returns the net of a player or snapshot.
    In this process, one point after the other: a Ray task per point would start a process that imports torch
    and OpenSpiel, which on two busy cores costs more than the measurement."""
    kind = measure_of(game)
    record: dict[str, Any] = {"measure": kind}
    if kind == MCTS:
        record |= {"opponent": OPPONENT, "games_per_point": 2 * games_per_seat}
    reason = skip_reason(game, games_per_seat)
    if reason:
        return record | {"skipped": reason}
    start = time.perf_counter()
    points = []
    for name, steps in milestones(summary):
        points.append({"player": name, "steps": steps, **point(kind, load(name), game, games_per_seat, seed)})
    record["seconds"] = time.perf_counter() - start
    if kind == NASH_CONV:
        record |= {"game": game.openspiel, "uniform_nash_conv": exploitability.uniform_nash_conv(game.openspiel)}
    return record | {"points": points}


def point(kind: str, net: nn.Module, game: Game, games_per_seat: int, seed: int) -> dict[str, float]:
    """One net's figures under the measure ``kind``."""
    if kind == NASH_CONV:
        return {"nash_conv": exploitability.nash_conv(net, game.openspiel)}
    result = evaluate(net, game, games_per_seat, seed, opponents=(OPPONENT,))[OPPONENT]
    return {k: result[k] for k in RATES}

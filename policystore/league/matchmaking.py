"""The AlphaStar league: who plays whom, when to freeze a snapshot, when to reset.

Pure Python (no Ray, no torch) so that every rule is unit-tested; the trainer runs it inside a Ray actor.
Rules (Vinyals et al. 2019, "Grandmaster level in StarCraft II using multi-agent reinforcement learning", and
the pseudocode DeepMind published with it):

* main agents: a share of their matches (``scripted_share``) against the league's scripted players (a
  curriculum: ``win if you can, block if you must`` punishes every missed win and block), else
  50% PFSP-hard over all snapshots, 15% verification (snapshots of main exploiters they beat
  less than 30% of the time, then forgotten past selves under 70%), else self-play against a main agent
  (PFSP-var over its snapshots when losing to it: win rate <= 0.3). Snapshot every step budget, never reset.
* main exploiters: play the main agents (PFSP-var over a main's snapshots when winning <= 10% against it);
  snapshot when beating every main agent > 70% (after half the budget) or at the budget; always reset.
* league exploiters: PFSP-hard over all snapshots; snapshot when beating every snapshot > 70% (after half
  the budget) or at the budget; reset with probability 0.25.

Step budgets are fractions of the run: ``set_run_steps(total)`` (the trainer's estimate of the env steps the
whole run will take) sets them so that a run of any length produces the configured number of snapshots. Until
the trainer has measured its rate, the budgets assume ``LeagueConfig.first_run_steps``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from policystore.league.constants import (
    HISTORICAL,
    LEAGUE_EXPLOITER,
    MAIN,
    MAIN_EXPLOITER,
    SCRIPTED,
    TRAINABLE_KINDS,
    player_name,
    snapshot_name,
)
from policystore.league.elo import Elo
from policystore.league.payoff import Payoff
from policystore.league.pfsp import pfsp_probs, remove_monotonic_suffix


@dataclass
class LeagueConfig:
    main_agents: int = 1
    main_exploiters: int = 1
    league_exploiters: int = 1
    # Share of all env steps that the main agents get together; exploiters split the rest evenly.
    main_share: float = 0.6
    # Snapshots each player takes over the whole run at the latest (step budgets derive from these).
    main_snapshots: int = 10
    exploiter_snapshots: int = 4
    payoff_decay: float = 0.99
    elo_k: float = 16.0
    league_exploiter_reset_prob: float = 0.25
    # Scripted players (league.baselines names) in the league, and the share of the main agents' matches
    # against them (the rest follow the rules above). Rated and in the payoff table like every member.
    scripted: tuple[str, ...] = ()
    scripted_share: float = 0.0
    # Env steps the step budgets assume until the trainer measures the run's rate (after 20 s) and rescales them.
    # About a tenth of a default run (9 min at ~21,000 steps/s on 2 cores): short first budgets, so the first
    # seconds already give the main agents a few weak past selves to play.
    first_run_steps: int = 1_000_000

    def __post_init__(self) -> None:
        if self.main_agents < 1:
            raise ValueError("a league needs at least one main agent")
        if min(self.main_exploiters, self.league_exploiters) < 0:
            raise ValueError("exploiter counts cannot be negative")
        if not 0.0 < self.main_share <= 1.0:
            raise ValueError(f"main_share must lie in (0, 1], got {self.main_share}")
        if self.main_share == 1.0 and self.main_exploiters + self.league_exploiters > 0:
            raise ValueError("main_share 1.0 leaves no steps for the exploiters")
        if min(self.main_snapshots, self.exploiter_snapshots, self.first_run_steps) < 1:
            raise ValueError("snapshot counts and first_run_steps must be >= 1")
        self.scripted = tuple(self.scripted)  # a list when read back from JSON
        if not 0.0 <= self.scripted_share < 1.0:
            raise ValueError(f"scripted_share must lie in [0, 1), got {self.scripted_share}")


@dataclass
class Match:
    learner: str        # the trainable player whose moves are trained on
    opponent: str       # a trainable player (its latest version) or a frozen snapshot
    frozen: bool        # True when the opponent is a frozen snapshot
    scripted: bool = False  # True when the opponent is a scripted player (league.baselines), not a net


@dataclass
class MatchResult:
    learner: str
    opponent: str
    wins: int           # from the learner's side
    draws: int
    losses: int
    steps: int          # env steps (moves of both sides) the match took
    # the learner's points, per game (1 + return / max_return) / 2: for win/loss games wins + draws / 2 (None: that);
    # in poker the chips won, so the payoff and PFSP see by how much a player wins, not only how often
    score: float | None = None


@dataclass
class SnapshotRequest:
    player: str
    name: str           # the snapshot's league and store id
    reset: bool         # reset the player to its initial weights after the snapshot


@dataclass
class PlayerState:
    name: str
    kind: str
    parent: str | None = None        # snapshots: the player they were taken from
    steps: int = 0                   # trainable: env steps of its matches
    snapshot_step: int = 0           # trainable: `steps` at its last snapshot
    snapshots: int = 0               # trainable: snapshots taken so far
    frozen_at: int | None = None     # snapshots: the league's env steps (all trainable players) when it joined


class League:
    def __init__(self, config: LeagueConfig | None = None, seed: int = 0):
        self.config = config or LeagueConfig()
        self.rng = np.random.default_rng(seed)
        self.payoff = Payoff(self.config.payoff_decay)
        self.elo = Elo(self.config.elo_k)
        self.players: dict[str, PlayerState] = {}
        self.budgets: dict[str, int] = {}
        self._open: dict[str, SnapshotRequest] = {}   # requested and not yet added, by player
        self._new: list[SnapshotRequest] = []         # not yet handed out by pop_requests
        c = self.config
        for kind, count in ((MAIN, c.main_agents), (MAIN_EXPLOITER, c.main_exploiters),
                            (LEAGUE_EXPLOITER, c.league_exploiters)):
            for i in range(count):
                self._add(PlayerState(player_name(kind, i), kind))
        for name in c.scripted:
            self._add(PlayerState(name, SCRIPTED))
        # The main agents' initial weights are the first snapshots (the league's opening curriculum).
        for name in self.of_kind(MAIN):
            self._request(name, reset=False)
        self.set_run_steps(self.config.first_run_steps)

    # ---- membership -------------------------------------------------------------------------------------
    def _add(self, player: PlayerState, rating: float | None = None) -> None:
        self.players[player.name] = player
        self.payoff.add_player(player.name)
        self.elo.add(player.name, rating)

    def of_kind(self, kind: str) -> list[str]:
        return [p.name for p in self.players.values() if p.kind == kind]

    def trainable(self) -> list[str]:
        return [p.name for p in self.players.values() if p.kind in TRAINABLE_KINDS]

    def snapshots(self, parent: str | None = None, parent_kind: str | None = None) -> list[str]:
        """Frozen snapshots, oldest first, optionally only those of one player or one kind of player."""
        return [p.name for p in self.players.values() if p.kind == HISTORICAL
                and (parent is None or p.parent == parent)
                and (parent_kind is None or self.players[p.parent].kind == parent_kind)]

    # ---- budgets ----------------------------------------------------------------------------------------
    def total_steps(self) -> int:
        """Env steps of all the trainable players' matches: the run's clock."""
        return sum(self.players[n].steps for n in self.trainable())

    def share(self, name: str) -> float:
        """Fraction of all env steps that go to this trainable player."""
        c = self.config
        if self.players[name].kind == MAIN:
            return c.main_share / c.main_agents
        return (1.0 - c.main_share) / (c.main_exploiters + c.league_exploiters)

    def set_run_steps(self, total_steps: int) -> None:
        """Scale the snapshot step budgets to a run expected to take ``total_steps`` env steps."""
        c = self.config
        for name in self.trainable():
            count = c.main_snapshots if self.players[name].kind == MAIN else c.exploiter_snapshots
            self.budgets[name] = max(1, int(total_steps * self.share(name) / count))

    # ---- matchmaking ------------------------------------------------------------------------------------
    def next_learner(self) -> str:
        """The trainable player furthest behind its share of the env steps."""
        names = self.trainable()
        return min(names, key=lambda n: (self.players[n].steps / self.share(n), names.index(n)))

    def next_match(self, learner: str | None = None) -> Match:
        learner = learner or self.next_learner()
        kind = self.players[learner].kind
        if kind == MAIN:
            opponent = self._main_opponent(learner)
        elif kind == MAIN_EXPLOITER:
            opponent = self._main_exploiter_opponent(learner)
        elif kind == LEAGUE_EXPLOITER:
            opponent = self._pfsp(learner, self.snapshots(), "hard") or self._choice(self.of_kind(MAIN))
        else:
            raise ValueError(f"{learner!r} is a frozen snapshot, not a trainable player")
        opponent_kind = self.players[opponent].kind
        return Match(learner, opponent, opponent_kind == HISTORICAL, opponent_kind == SCRIPTED)

    def _choice(self, names: list[str]) -> str:
        return names[self.rng.integers(len(names))]

    def _pfsp(self, learner: str, candidates: list[str], weighting: str) -> str | None:
        if not candidates:
            return None
        probs = pfsp_probs(self.payoff.win_rates(learner, candidates), weighting)
        return candidates[self.rng.choice(len(candidates), p=probs)]

    def _main_opponent(self, learner: str) -> str:
        scripted = self.of_kind(SCRIPTED) if self.config.scripted_share else []
        if scripted and self.rng.random() < self.config.scripted_share:
            return self._choice(scripted)
        coin = self.rng.random()
        if coin < 0.5:
            chosen = self._pfsp(learner, self.snapshots(), "hard")
            if chosen:
                return chosen
        main = self._choice(self.of_kind(MAIN))
        if coin < 0.5 + 0.15:
            chosen = self._verification(learner, main)
            if chosen:
                return chosen
        # Self-play, unless this main agent is too strong for us: then a curriculum of its snapshots.
        if self.payoff.win_rate(learner, main) > 0.3:
            return main
        return self._pfsp(learner, self.snapshots(parent=main), "var") or main

    def _verification(self, learner: str, main: str) -> str | None:
        exploiters = self.snapshots(parent_kind=MAIN_EXPLOITER)
        if exploiters:
            rates = self.payoff.win_rates(learner, exploiters)
            if rates.min() < 0.3:
                return self._pfsp(learner, exploiters, "hard")
        past = self.snapshots(parent=main)
        rates, past = remove_monotonic_suffix(self.payoff.win_rates(learner, past), past)
        if len(past) and rates.min() < 0.7:
            return self._pfsp(learner, past, "hard")
        return None

    def _main_exploiter_opponent(self, learner: str) -> str:
        main = self._choice(self.of_kind(MAIN))
        if self.payoff.win_rate(learner, main) > 0.1:
            return main
        return self._pfsp(learner, self.snapshots(parent=main), "var") or main

    # ---- results and snapshots --------------------------------------------------------------------------
    def report(self, result: MatchResult) -> None:
        for name in (result.learner, result.opponent):
            if name not in self.players:
                raise KeyError(f"result names unknown player {name!r}")
        self.payoff.update(result.learner, result.opponent, result.wins, result.draws, result.losses, result.score)
        self.elo.update(result.learner, result.opponent, result.wins, result.draws, result.losses)
        player = self.players[result.learner]
        player.steps += result.steps
        if player.name not in self._open and self.ready_to_snapshot(player.name):
            reset_prob = {MAIN: 0.0, MAIN_EXPLOITER: 1.0,
                          LEAGUE_EXPLOITER: self.config.league_exploiter_reset_prob}[player.kind]
            reset = self.rng.random() < reset_prob
            self._request(player.name, reset)

    def ready_to_snapshot(self, name: str) -> bool:
        player = self.players[name]
        passed, budget = player.steps - player.snapshot_step, self.budgets[name]
        if player.kind == MAIN or passed < budget // 2:
            return passed >= budget
        beaten = self.of_kind(MAIN) if player.kind == MAIN_EXPLOITER else self.snapshots()
        rates = self.payoff.win_rates(name, beaten) if beaten else np.zeros(1)
        return rates.min() > 0.7 or passed >= budget

    def _request(self, name: str, reset: bool) -> None:
        request = SnapshotRequest(name, snapshot_name(name, self.players[name].snapshots), reset)
        self._open[name] = request
        self._new.append(request)

    def pop_requests(self) -> list[SnapshotRequest]:
        """Snapshots the trainer should have the learners publish (each handed out once)."""
        requests, self._new = self._new, []
        return requests

    def add_snapshot(self, request: SnapshotRequest) -> None:
        """Register a published frozen snapshot; it starts with its parent's rating."""
        parent = self.players[request.player]
        if self._open.get(parent.name) != request:
            raise ValueError(f"snapshot {request.name!r} was not requested (or was added already)")
        del self._open[parent.name]
        self._add(PlayerState(request.name, HISTORICAL, parent=parent.name, frozen_at=self.total_steps()),
                  self.elo.ratings[parent.name])
        parent.snapshots += 1
        parent.snapshot_step = parent.steps

    # ---- persistence ------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready state; ``from_dict`` hands out requests not yet added again."""
        return {
            "open_requests": [dataclasses.asdict(r) for r in self._open.values()],
            "config": dataclasses.asdict(self.config),
            "players": [dataclasses.asdict(p) for p in self.players.values()],
            "budgets": dict(self.budgets),
            "payoff": self.payoff.to_dict(),
            "elo": dict(self.elo.ratings),
        }

    @classmethod
    def from_dict(cls, state: dict[str, Any], seed: int = 0) -> League:
        league = cls(LeagueConfig(**state["config"]), seed)
        league.load_state(state)
        return league

    def load_state(self, state: dict[str, Any]) -> None:
        """Replace this league's state with a saved one (``to_dict``); used to resume a run."""
        self.config = LeagueConfig(**state["config"])
        self.players = {p["name"]: PlayerState(**p) for p in state["players"]}
        self.budgets = dict(state["budgets"])
        self.payoff = Payoff.from_dict(state["payoff"])
        self.elo = Elo(self.config.elo_k)
        self.elo.ratings = dict(state["elo"])
        self._new = [SnapshotRequest(**r) for r in state["open_requests"]]
        self._open = {r.player: r for r in self._new}

    def payoff_matrix(self) -> tuple[list[str], np.ndarray, np.ndarray]:
        """Players, P[row beats column] (0.5 where they never met) and the games each pair played (0: never)."""
        return list(self.payoff.players), self.payoff.matrix(), self.payoff.played()

    def summary(self) -> list[dict[str, Any]]:
        """One row per player, in the order they joined: name, kind, parent, Elo, env steps, and for a
        snapshot the league's env steps when it was frozen (None in a state saved before that was kept)."""
        return [{"name": p.name, "kind": p.kind, "parent": p.parent, "elo": round(self.elo.ratings[p.name], 1),
                 "steps": p.steps, "frozen_at": p.frozen_at} for p in self.players.values()]

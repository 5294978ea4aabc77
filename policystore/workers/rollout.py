"""Rollout worker: a thin Ray actor that plays league matches in big batches of games.

Per match: ask the league for (learner, opponent), take both policies from the node store as zero-copy views
(the learner's latest published version, the opponent's snapshot), play ``games_per_match`` games at once
with one batched forward pass per policy and move, send the learner's moves to its learner shard and the
result to the league. At most one batch per learner is in flight: a worker that outruns a learner waits for
it instead of piling up stale trajectories. The learner's answer names its newest version, which the worker
plays next: no store round trip per match to ask for "latest", only a read of a version it does not hold yet
(usually pushed to it ahead).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray
import torch

import policystore
from policystore import remote
from policystore.league.baselines import BASELINES
from policystore.league.games import CONNECT4, get_game
from policystore.league.matchmaking import Match, MatchResult
from policystore.league.vecgame import VecGame
from policystore.memory import MiB, process_pss_bytes
from policystore.workers.modules import STORE, SnapshotModules
from policystore.workers.play import net_policy, play, scripted_policy

ANSWER_S = 600.0  # the longest a worker waits for the league's next match or a learner taking a batch


@dataclass
class WorkerConfig:
    games_per_match: int = 512
    hidden: int = 128
    gamma: float = 0.99
    gae_lambda: float = 0.95
    weights: str = STORE        # PRIVATE: copy every policy into the worker (benchmark comparison only)
    game: str = CONNECT4.name
    module_cache: int = 16      # modules (views) kept per worker
    mirror: bool = True         # learners' moves on randomly mirrored positions (games with Game.mirrored)
    opening_share: float = 0.0  # games of a match that start after a random opening (games with Game.opening)
    opening_moves: int = 20     # an opening's length is uniform in 1..opening_moves


class RolloutWorker:
    def __init__(self, league: ray.actor.ActorHandle, learners: dict[str, ray.actor.ActorHandle],
                 config: WorkerConfig, seed: int = 0):
        torch.set_num_threads(1)
        self.league, self.learners, self.config = league, learners, config
        self.store = policystore.connect()
        game, hidden = get_game(config.game), config.hidden
        self.modules = SnapshotModules(self.store, lambda: game.net(hidden), config.weights, config.module_cache)
        self.env = game.make(config.games_per_match)
        self.generator = torch.Generator().manual_seed(seed)
        self.rng = np.random.default_rng(seed)
        self.mirror_rng = self.rng if config.mirror and game.mirrored else None
        self.game = game
        self.in_flight: dict[str, ray.ObjectRef] = {}
        self.versions: dict[str, int] = {}  # each learner's newest version, from its last answer to add
        self.steps = 0
        self.matches = 0
        self.play_seconds = 0.0
        self.lookup_seconds = 0.0  # taking the match's policies from the store
        self.wait_seconds = 0.0    # waiting for a learner to take the previous batch (back-pressure)

    def play_match(self, match: Match) -> MatchResult:
        start = time.perf_counter()
        previous = self.in_flight.get(match.learner)
        if previous is not None and ray.wait([previous], timeout=0)[0]:  # answered while the last match played
            self._settle(match.learner)
        learner = self.modules.get(match.learner, frozen=False, version=self.versions.get(match.learner))
        policy = net_policy(learner, self.generator)
        if match.scripted:
            opponent, record = scripted_policy(BASELINES[match.opponent], self.rng), (True, False)
        elif match.opponent == match.learner:
            # Self-play: one policy for both sides (one forward pass per move), both sides' moves train it.
            opponent, record = policy, (True, True)
        else:
            opponent = net_policy(self.modules.get(match.opponent, frozen=match.frozen), self.generator)
            record = (True, False)
        played = time.perf_counter()
        self.lookup_seconds += played - start
        outcome = play(self.env, (policy, opponent), record, self.config.gamma, self.config.gae_lambda,
                       self.mirror_rng, self.opening())
        waited = time.perf_counter()
        self.play_seconds += waited - played
        self._settle(match.learner)
        self.wait_seconds += time.perf_counter() - waited
        self.in_flight[match.learner] = remote.send(self.learners[match.learner], "add", outcome.batch)
        self.steps += outcome.steps
        self.matches += 1
        return MatchResult(match.learner, match.opponent, outcome.wins, outcome.draws, outcome.losses,
                           outcome.steps, outcome.score)

    def _settle(self, learner: str) -> None:
        """Wait for ``learner`` to take the batch in flight to it, if any; note the version it answers with."""
        previous = self.in_flight.pop(learner, None)
        if previous is not None:
            self.versions[learner] = remote.get(previous, ANSWER_S, f"the learner of {learner}", "add").version

    def opening(self) -> Callable[[VecGame], None] | None:
        """This match's random openings: ``opening_share`` of the games, each of a uniform length."""
        share, game = self.config.opening_share, self.game
        if share <= 0 or game.opening is None:
            return None
        n = self.env.num_envs
        lengths = np.where(self.rng.random(n) < share, self.rng.integers(1, self.config.opening_moves + 1, n), 0)
        return lambda env: game.opening(env, lengths, self.rng)

    def run(self, seconds: float) -> dict[str, Any]:
        """Play matches for ``seconds`` (at least one, however loaded the machine); returns once every trajectory
        and result has been delivered."""
        deadline = time.monotonic() + seconds
        next_match = remote.send(self.league, "next_match")
        while True:
            match = remote.get(next_match, ANSWER_S, "the league", "next_match")
            next_match = remote.send(self.league, "next_match")  # overlaps the round trip with the games
            report = remote.send(self.league, "report", self.play_match(match))
            if time.monotonic() >= deadline:
                break
        # Calls from one caller run in order: the last report done means all are.
        remote.get([*self.in_flight.values(), report], ANSWER_S, "the learners and the league", "add")
        return self.stats()

    def module_report(self) -> list[dict[str, Any]]:
        """Per cached policy: whether every parameter is a view into the node store's shared memory."""
        return [{"policy": pid, "version": version,
                 "shared": all(isinstance(p, policystore.SharedTensor) for p in module.parameters())}
                for (pid, version), module in self.modules.items()]

    def stats(self) -> dict[str, Any]:
        return {"steps": self.steps, "matches": self.matches, "play_seconds": self.play_seconds,
                "lookup_seconds": self.lookup_seconds, "wait_seconds": self.wait_seconds,
                "modules": len(self.modules), "pss_mib": process_pss_bytes() / MiB}

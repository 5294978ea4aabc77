"""The league as the trainer runs it: one Ray actor that has the learner shards publish its snapshots itself.

The rules stay in ``league.matchmaking.League`` (pure, unit-tested); this subclass adds only the Ray side of a
snapshot request. When a result makes the league ask for a snapshot, the actor calls the player's learner shard
(``snapshot``, then ``reset`` if the league asked for one; calls from one caller to one actor run in order) and
goes on serving workers; the snapshot joins the league as a frozen opponent once the learner's durable publish
has returned, checked at the next call. The driver is off this path: it only starts the actors, shows progress,
checkpoints and writes the report.
"""

from __future__ import annotations

import ray

from policystore import remote
from policystore.league.matchmaking import League, LeagueConfig, Match, MatchResult, SnapshotRequest

PUBLISH_S = 600.0  # the longest a learner's snapshot (a durable publish) may take before the league gives up on it


class LeagueActor(League):
    """``League`` plus the learner shards it asks for snapshots (run it with ``ray.remote``)."""

    def __init__(self, config: LeagueConfig | None = None, seed: int = 0):
        super().__init__(config, seed)
        self.learners: dict[str, ray.actor.ActorHandle] = {}
        self.publishing: list[tuple[SnapshotRequest, ray.ObjectRef]] = []  # asked of a learner, not yet added

    def serve(self, learners: dict[str, ray.actor.ActorHandle]) -> list[str]:
        """Take the learner shards (one per trainable player) and have them publish the snapshots asked for so
        far (the main agents' first ones, or a resumed run's open requests); returns once those are in the
        league, so the first match can already pick them. Returns the snapshots added."""
        missing = set(self.trainable()) - set(learners)
        if missing:
            raise ValueError(f"no learner shard for trainable players {sorted(missing)}")
        self.learners = dict(learners)
        self._ask_learners()
        return self.settle()

    def next_match(self, learner: str | None = None) -> Match:
        self._add_published()
        return super().next_match(learner)

    def report(self, result: MatchResult) -> None:
        super().report(result)
        self._ask_learners()
        self._add_published()

    def settle(self) -> list[str]:
        """Wait for every snapshot in flight and add it (the end of a session); returns the names added."""
        remote.get([ref for _, ref in self.publishing], PUBLISH_S, "the learner shards", "snapshot")
        return self._add_published()

    def _ask_learners(self) -> None:
        if not self.learners:
            return  # not serving yet: requests wait in the league until ``serve``
        for request in self.pop_requests():
            learner = self.learners[request.player]
            self.publishing.append((request, remote.send(learner, "snapshot", request.name)))
            if request.reset:
                remote.send(learner, "reset")  # after the snapshot: one caller's calls to one actor keep their order

    def _add_published(self) -> list[str]:
        """Add the snapshots whose publish has returned, in request order (a failed publish raises here)."""
        if not self.publishing:
            return []
        refs = [ref for _, ref in self.publishing]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        done = set(ready)
        added = []
        for request, ref in self.publishing:
            if ref in done:
                remote.get(ref, PUBLISH_S, f"the learner of {request.player}", "snapshot")  # ready: no wait
                self.add_snapshot(request)
                added.append(request.name)
        self.publishing = [(r, ref) for r, ref in self.publishing if ref not in done]
        return added

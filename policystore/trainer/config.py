"""Run configuration: one dataclass, saved as ``config.json`` in the run directory."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from policystore.league.games import CONNECT4, get_game
from policystore.league.matchmaking import LeagueConfig
from policystore.trainer.ppo import PPOConfig
from policystore.workers.modules import STORE

DEFAULT_MINUTES = 9.0
# Keys that older versions wrote into config.json and nothing reads any more: dropped on load, so that their run
# directories still resume, evaluate and play. (The snapshot budgets' first guess is LeagueConfig.first_run_steps.)
RETIRED_KEYS = frozenset({"expected_steps_per_s"})


@dataclass
class TrainConfig:
    minutes: float = DEFAULT_MINUTES
    game: str = CONNECT4.name        # or "pettingzoo:<classic env>" (the pettingzoo extra)
    seed: int = 0
    workers: int = 1
    games_per_match: int = 512
    hidden: int = 128
    # The default run's league: the main agent gets 80% of the env steps and meets the scripted "safe" player (win,
    # block, never open a cell where the opponent wins) in 15% of its matches (a curriculum); its PPO does 2 epochs
    # per batch; 60% of its games start after a random opening. Measured in docs/trainer.md, "What each lever
    # bought", "Random openings" and "A harder scripted player".
    league: LeagueConfig = field(default_factory=lambda: LeagueConfig(main_share=0.8, scripted=("safe",),
                                                                      scripted_share=0.15))
    ppo: PPOConfig = field(default_factory=lambda: PPOConfig(epochs=2, batch=8192, minibatch=2048))
    publish_every: int = 1           # learner updates between published versions
    mirror: bool = True              # learners train on randomly mirrored positions (left-right symmetric games)
    opening_share: float = 0.6       # games that start after 1..opening_moves random moves (Connect Four)
    opening_moves: int = 20
    weights: str = STORE             # workers' policies: store views; PRIVATE copies (benchmark only)
    learner_cpus: float = 0.25       # Ray resources per learner shard (they only reserve, not limit)
    learner_gpus: float = 0.0        # per shard; fractions let shards share one GPU
    worker_cpus: float = 0.5
    eval_games: int = 200            # per seat, for the live win rate against random / win-block
    eval_every_s: float = 20.0
    reference_games: int = 20        # per seat, for each point against OpenSpiel's MCTS(100) after training (0: skip)
    checkpoint_every_s: float = 60.0
    num_cpus: int | None = None      # for the local Ray this command starts (None: all cores)
    object_store_mib: int = 1024
    hot_capacity_mib: int = 256      # the store's hot tier

    def __post_init__(self) -> None:
        if self.minutes <= 0:
            raise ValueError(f"minutes must be > 0, got {self.minutes}")
        if self.workers < 1 or self.games_per_match < 2:
            raise ValueError("need at least one worker and two games per match (one per seat)")
        if self.hidden < 1 or self.publish_every < 1:
            raise ValueError("hidden and publish_every must be >= 1")
        if not 0 <= self.opening_share <= 1 or self.opening_moves < 1:
            raise ValueError(f"opening_share must lie in [0, 1] and opening_moves be >= 1, got "
                             f"{self.opening_share} and {self.opening_moves}")
        if self.reference_games < 0:
            raise ValueError(f"reference_games must be >= 0, got {self.reference_games}")
        if self.league.scripted:
            available = get_game(self.game).baselines
            if set(self.league.scripted) - set(available):
                raise ValueError(f"scripted players {list(self.league.scripted)}: {self.game} has {list(available)}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known - RETIRED_KEYS
        if unknown:
            raise ValueError(f"unknown config keys {sorted(unknown)}")
        data = {k: v for k, v in data.items() if k not in RETIRED_KEYS}
        data["league"] = LeagueConfig(**data.get("league", {}))
        data["ppo"] = PPOConfig(**data.get("ppo", {}))
        return cls(**data)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict(), indent=1))

    @classmethod
    def load(cls, path: Path) -> TrainConfig:
        return cls.from_dict(json.loads(path.read_text()))

"""Learner shard: one Ray actor per trainable player, running PPO on the trajectories the workers send.

The shard publishes its player's weights to the node store every ``publish_every`` updates (workers read
them from there as zero-copy views), a frozen snapshot when the league asks, and a checkpoint on request.
It trains on a GPU when Ray gives it one (a fractional ``num_gpus`` lets shards share a device), else CPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import ray
import torch
from torch import nn

import policystore
from policystore.league.constants import FROZEN_META_KEY
from policystore.league.games import CONNECT4, get_game
from policystore.trainer.checkpoint import has_learner, load_learner, load_weights, save_learner, save_weights
from policystore.trainer.ppo import PPO, PPOConfig


def choose_device(gpu_ids: list) -> torch.device:
    """cuda when Ray assigned this actor a GPU (``ray.get_gpu_ids()``) and torch can see it, else cpu."""
    return torch.device("cuda") if gpu_ids and torch.cuda.is_available() else torch.device("cpu")


def host_weights(net: nn.Module) -> dict[str, torch.Tensor]:
    """The net's weights on the host, ready to publish: one device-to-host copy on a GPU, none on CPU."""
    return {k: v.detach().to("cpu") for k, v in net.state_dict().items()}


class Added(NamedTuple):
    """``LearnerShard.add``'s answer: the updates so far and the newest version published, which the worker that
    waits on this answer plays next (a version it holds costs it no store call; asking for "latest" costs one)."""

    updates: int
    version: int


class LearnerShard:
    """PPO for one player. Keep the methods short: workers wait on ``add`` for back-pressure."""

    def __init__(self, player: str, checkpoint_dir: str, ppo: PPOConfig, hidden: int, seed: int,
                 publish_every: int = 1, resume: bool = False, game: str = CONNECT4.name):
        torch.set_num_threads(1)
        self.player = player
        self.dir = Path(checkpoint_dir)
        self.publish_every = publish_every
        self.device = choose_device(ray.get_gpu_ids())
        self.store = policystore.connect()
        torch.manual_seed(seed)
        rules = get_game(game)
        self.ppo = PPO(rules.net(hidden), ppo, self.device, seed, tactics=rules.tactics, search=rules.search)
        self.samples = 0
        self.buffer: list[dict[str, np.ndarray]] = []
        self.buffered = 0
        self.last_stats: dict[str, float] = {}
        self.live: list[int] = []  # published versions that are not frozen snapshots (the newest kept)
        init_path = self.dir / f"{player}.init.safetensors"
        if resume and has_learner(self.dir, player):
            counters = load_learner(self.dir, player, self.ppo.net, self.ppo.opt)
            self.ppo.updates, self.samples = counters["updates"], counters["samples"]
            # The previous session's live versions came back with the store's catalog: clean them up too.
            self.live = sorted(i.id.version for i in self.store.list() if i.id.policy_id == player)
        else:
            self.dir.mkdir(parents=True, exist_ok=True)
            save_weights(init_path, self.ppo.net.state_dict())
        self.publish()

    def publish(self) -> policystore.SnapshotId:
        """A new live version of the player; versions older than the previous one are deleted."""
        sid = self.store.publish(self.player, host_weights(self.ppo.net), meta=self._meta())
        self.live.append(sid.version)
        while len(self.live) > 2:  # keep the previous version for workers that just resolved it
            self.store.delete(self.player, version=self.live.pop(0))
        return sid

    def _meta(self) -> dict[str, Any]:
        return {"player": self.player, "updates": self.ppo.updates, "samples": self.samples,
                "hidden": self.ppo.net.hidden}

    def add(self, batch: dict[str, np.ndarray]) -> Added:
        """Queue a worker's trajectories; train (and maybe publish) once a full batch is there."""
        self.buffer.append(batch)
        self.buffered += len(batch["actions"])
        if self.buffered >= self.ppo.cfg.batch:
            data = {k: np.concatenate([b[k] for b in self.buffer]) for k in batch}
            self.buffer, self.buffered = [], 0
            self.last_stats = self.ppo.update(data)
            self.samples += len(data["actions"])
            if self.ppo.updates % self.publish_every == 0:
                self.publish()
        return Added(self.ppo.updates, self.live[-1])

    def set_progress(self, progress: float) -> None:
        """The share of the run done, for the learning-rate schedule."""
        self.ppo.set_progress(progress)

    def snapshot(self, name: str) -> policystore.SnapshotId:
        """Freeze the current weights as their own store policy ``name``, durable on disk."""
        return self.store.publish(name, host_weights(self.ppo.net), meta=self._meta() | {FROZEN_META_KEY: True},
                                  durable=True)

    def reset(self) -> None:
        """Back to the initial weights with a fresh optimizer (exploiter resets)."""
        self.ppo.net.load_state_dict(load_weights(self.dir / f"{self.player}.init.safetensors"))
        self.ppo.opt = self.ppo.new_optimizer()
        self.buffer, self.buffered = [], 0
        self.publish()

    def save(self) -> None:
        save_learner(self.dir, self.player, self.ppo.net, self.ppo.opt,
                     {"updates": self.ppo.updates, "samples": self.samples})

    def stats(self) -> dict[str, Any]:
        return {"player": self.player, "device": str(self.device), "updates": self.ppo.updates,
                "samples": self.samples, **self.last_stats}

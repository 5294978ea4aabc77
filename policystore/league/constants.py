"""Names the league, the learners, the workers and the report share: one definition each.

Player kinds are what ``League.summary()`` rows carry under ``kind``. A frozen snapshot is a store policy of its
own (``<player>.s<n>``); the learner that publishes it marks it with ``FROZEN_META_KEY: True`` in the snapshot's
meta, which is how the report (and anyone reading the store) tells frozen league members from the learning
players' live versions without asking the league.
"""

from __future__ import annotations

MAIN, MAIN_EXPLOITER, LEAGUE_EXPLOITER = "main", "main_exploiter", "league_exploiter"
HISTORICAL = "historical"  # a frozen snapshot of a trainable player
SCRIPTED = "scripted"      # a scripted player (league.baselines) that main agents meet as a curriculum
TRAINABLE_KINDS = (MAIN, MAIN_EXPLOITER, LEAGUE_EXPLOITER)

FROZEN_META_KEY = "frozen"  # snapshot meta: True on frozen league snapshots, absent on live versions

DEFAULT_PLAYER = f"{MAIN}_0"  # the first main agent: what evaluation, play and load_policy use by default


def player_name(kind: str, index: int) -> str:
    """The name of the ``index``-th trainable player of ``kind``: ``main_0``, ``main_exploiter_1``, ..."""
    return f"{kind}_{index}"


def snapshot_name(player: str, index: int) -> str:
    """The league (and store) id of ``player``'s ``index``-th frozen snapshot: ``main_0.s3``."""
    return f"{player}.s{index}"


def is_frozen(meta: dict) -> bool:
    """Whether a snapshot's meta marks it as a frozen league snapshot (see ``FROZEN_META_KEY``)."""
    return bool(meta.get(FROZEN_META_KEY))

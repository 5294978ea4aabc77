"""Store settings, chosen once per node when its store actor starts."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass


@dataclass(frozen=True)
class StoreConfig:
    """How one node's store holds snapshots.

    hot_capacity_bytes: bytes of snapshots kept in the object store before least-recently-used ones are evicted
        to disk. None: half of this node's object store.
    spill_dir: the disk tier. Every snapshot is written here (at once when published durably, else in the
        background); a restarted store rebuilds its catalog from it. None: a folder under the system temp dir,
        named after the Ray session, so two clusters on one machine never share it.
    compress: lz4-compress spill files (snapshots that do not compress are stored raw).
    disk_capacity_bytes: refuse publishes that would grow the spill tier beyond this (None: until the disk is full).
    max_concurrency: threads in the store actor, so reads are never queued behind a slow restore or publish.
    """

    hot_capacity_bytes: int | None = None
    spill_dir: str | None = None
    compress: bool = True
    disk_capacity_bytes: int | None = None
    max_concurrency: int = 16

    def __post_init__(self) -> None:
        for name in ("hot_capacity_bytes", "disk_capacity_bytes"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                raise ValueError(f"StoreConfig.{name} must be a positive int or None, got {value!r}")
        if self.max_concurrency < 2:
            raise ValueError("StoreConfig.max_concurrency must be >= 2 (reads must not queue behind writes)")

    def resolved_spill_dir(self, session_name: str) -> str:
        if self.spill_dir is not None:
            return os.path.abspath(os.path.expanduser(self.spill_dir))
        return os.path.join(tempfile.gettempdir(), "policystore", session_name)

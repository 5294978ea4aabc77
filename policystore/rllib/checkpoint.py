"""Frozen modules in RLlib checkpoints.

RLlib checkpoints the Learners' modules only, so frozen modules kept off the Learners would come back from
a restore as freshly initialised ones. The local EnvRunner's checkpoint folder gets a ``policystore/`` folder
with each frozen snapshot exactly as stored (safetensors layout with the store's checksum; no pickle) and the
spec that builds it, and the league's matchmaking (mapping function and trainable set, cloudpickled as RLlib
pickles them in its own config). Restoring verifies each file against its checksum, then re-publishes it unless
the store of the current Ray session lists the same id with that checksum: a process-wide cache (e.g. views an
Algorithm from an earlier Ray session still holds) is never taken as proof. A snapshot of another league (the
checkpoint was written by another Algorithm) is always re-published under the restoring league's name: a league
owns, and may delete, only snapshots named after it.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pyarrow.fs
import safetensors.torch
from ray import cloudpickle
from ray.rllib.core.rl_module.rl_module import RLModuleSpec

from ..errors import UnknownPolicyError
from ..format import verify_buffer
from ..ids import SnapshotId
from .registry import FrozenEntry

FOLDER = "policystore"
INDEX = "league.json"
MATCHMAKING = "matchmaking.pkl"
FORMAT = 2  # 2: each frozen_<i>.safetensors is the stored snapshot itself, checksum included


@dataclasses.dataclass(frozen=True)
class Matchmaking:
    """Which module plays which agent, and which modules train: restored together with the frozen set, which
    the mapping function names."""

    mapping_fn: Callable[..., str] | None
    policies_to_train: Any


@dataclasses.dataclass(frozen=True)
class Restored:
    """What a checkpoint's ``policystore/`` folder gives back: the frozen set (in this session's store) and its
    matchmaking."""

    frozen: dict[str, FrozenEntry]
    matchmaking: Matchmaking | None  # None: a checkpoint written before the matchmaking was saved


def _fs(path: Any, filesystem: pyarrow.fs.FileSystem | None) -> tuple[pyarrow.fs.FileSystem, pathlib.Path]:
    path = str(path)
    if filesystem is None:
        filesystem, path = pyarrow.fs.FileSystem.from_uri(path)
    return filesystem, pathlib.Path(path) / FOLDER


def save(
    path: Any,
    frozen: Mapping[str, FrozenEntry],
    matchmaking: Matchmaking,
    store: Any,
    filesystem: pyarrow.fs.FileSystem | None,
) -> None:
    """Write every frozen snapshot (bytes as stored), its spec and the matchmaking under ``path/policystore``."""
    fs, folder = _fs(path, filesystem)
    fs.create_dir(folder.as_posix(), recursive=True)
    index = []
    for i, (module_id, entry) in enumerate(sorted(frozen.items())):
        snap = store.get(entry.snapshot.policy_id, version=entry.snapshot.version)
        name = f"frozen_{i}.safetensors"
        with fs.open_output_stream((folder / name).as_posix()) as f:
            f.write(memoryview(snap.buffer))  # the snapshot as stored: safetensors layout, with its checksum
        index.append(
            {
                "module_id": module_id,
                "policy_id": entry.snapshot.policy_id,
                "version": entry.snapshot.version,
                "file": name,
                "on_learners": entry.on_learners,
                "spec": entry.spec.to_dict(),
                "meta": dict(snap.meta),
            }
        )
    with fs.open_output_stream((folder / MATCHMAKING).as_posix()) as f:
        f.write(cloudpickle.dumps(matchmaking))
    with fs.open_output_stream((folder / INDEX).as_posix()) as f:
        f.write(json.dumps({"format": FORMAT, "frozen": index, "matchmaking": MATCHMAKING}, indent=1).encode())


def load(path: Any, settings: Any, filesystem: pyarrow.fs.FileSystem | None) -> Restored | None:
    """Read ``path/policystore`` back into the node store; None if the checkpoint has no such folder."""
    fs, folder = _fs(path, filesystem)
    if fs.get_file_info((folder / INDEX).as_posix()).type == pyarrow.fs.FileType.NotFound:
        return None
    with fs.open_input_stream((folder / INDEX).as_posix()) as f:
        index = json.loads(f.read())
    if index.get("format") != FORMAT:
        raise ValueError(f"{folder / INDEX}: unknown policystore checkpoint format {index.get('format')!r}")
    store = settings.store()
    frozen = {}
    for item in index["frozen"]:
        path = (folder / item["file"]).as_posix()
        with fs.open_input_stream(path) as f:
            raw = f.read()
        checksum = verify_buffer(np.frombuffer(raw, np.uint8), name=path).checksum  # CorruptSnapshotError if altered
        snapshot, same = SnapshotId(item["policy_id"], item["version"]), ()
        own = item["policy_id"] == f"{settings.league}.{item['module_id']}"
        if not own or not store_holds(store, snapshot, checksum):
            snapshot = store.publish(f"{settings.league}.{item['module_id']}", safetensors.torch.load(raw),
                                     meta={**item["meta"], "league": settings.league})
            same = (checksum,)
        spec = RLModuleSpec.from_dict(item["spec"])
        frozen[item["module_id"]] = FrozenEntry(snapshot, spec, item["on_learners"], same_tensors_as=same)
    matchmaking = None
    if "matchmaking" in index:
        with fs.open_input_stream((folder / index["matchmaking"]).as_posix()) as f:
            matchmaking = cloudpickle.loads(f.read())
    return Restored(frozen, matchmaking)


def store_holds(store: Any, snapshot: SnapshotId, checksum: str) -> bool:
    """Whether ``store`` lists ``snapshot`` with ``checksum`` (then a restore reuses it instead of re-publishing).

    Asks the store itself (``list``), not this process's snapshot cache: after a ``ray.shutdown()`` and a new
    ``ray.init()`` the cache can still hold the old session's copy while the new session's store is empty.
    """
    try:
        rows = store.list(snapshot.policy_id)
    except UnknownPolicyError:
        return False
    return any(row.id == snapshot and row.checksum == checksum and not row.error for row in rows)

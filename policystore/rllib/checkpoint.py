"""Frozen modules in RLlib checkpoints.

RLlib checkpoints the Learners' modules only, so frozen modules kept off the Learners would come back from
a restore as freshly initialised ones. The local EnvRunner's checkpoint folder gets a ``policystore/`` folder
with each frozen snapshot exactly as stored (safetensors layout with the store's checksum; no pickle) and the
spec that builds it. Restoring verifies each file against its checksum, then re-publishes it unless the store of
the current Ray session lists the same id with that checksum: a process-wide cache (e.g. views an Algorithm from
an earlier Ray session still holds) is never taken as proof.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow.fs
import safetensors.torch
from ray.rllib.core.rl_module.rl_module import RLModuleSpec

from ..errors import UnknownPolicyError
from ..format import verify_buffer
from ..ids import SnapshotId
from .registry import FrozenEntry

FOLDER = "policystore"
INDEX = "league.json"
FORMAT = 2  # 2: each frozen_<i>.safetensors is the stored snapshot itself, checksum included


def _fs(path: Any, filesystem: pyarrow.fs.FileSystem | None) -> tuple[pyarrow.fs.FileSystem, pathlib.Path]:
    path = str(path)
    if filesystem is None:
        filesystem, path = pyarrow.fs.FileSystem.from_uri(path)
    return filesystem, pathlib.Path(path) / FOLDER


def save(
    path: Any, frozen: Mapping[str, FrozenEntry], store: Any, filesystem: pyarrow.fs.FileSystem | None
) -> None:
    """Write every frozen snapshot (bytes as stored) and its spec under ``path/policystore``."""
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
    with fs.open_output_stream((folder / INDEX).as_posix()) as f:
        f.write(json.dumps({"format": FORMAT, "frozen": index}, indent=1).encode())


def load(path: Any, settings: Any, filesystem: pyarrow.fs.FileSystem | None) -> dict[str, FrozenEntry] | None:
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
        if not store_holds(store, snapshot, checksum):
            snapshot = store.publish(item["policy_id"], safetensors.torch.load(raw), meta=item["meta"])
            same = (checksum,)
        spec = RLModuleSpec.from_dict(item["spec"])
        frozen[item["module_id"]] = FrozenEntry(snapshot, spec, item["on_learners"], same_tensors_as=same)
    return frozen


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

"""What a reader holds: a snapshot's tensors as read-only views into the node's shared memory.

torch is imported on the first tensor access, not before: a process that follows the league and reads only the
raw bytes (``Snapshot.buffer``) or the meta never loads it (torch's import is most of such a process's memory).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import ray

from .format import Header, parse_header
from .ids import SnapshotId

if TYPE_CHECKING:
    import torch

    from .views import SharedTensor


class Snapshot(Mapping[str, "torch.Tensor"]):
    """One immutable snapshot: ``snap[name]`` is a guarded zero-copy ``torch.Tensor`` view.

    The views stay valid as long as anything references them, even after the store evicts or deletes the
    snapshot (the object store cannot free memory a reader still maps).
    """

    def __init__(
        self, sid: SnapshotId, buffer: np.ndarray, ref: ray.ObjectRef | None = None, header: Header | None = None
    ):
        """``header``: already parsed (a pushed snapshot's, parsed off the read path); else parsed here."""
        self.id = sid
        self._buffer = buffer
        self._ref = ref  # keeps this process a borrower of the store's object
        if header is None or header.nbytes != len(buffer):
            header = parse_header(buffer, name=str(sid))
        self._header = header
        self._views: dict[str, SharedTensor] | None = None  # made on first use: load_module never needs them

    @property
    def meta(self) -> dict[str, Any]:
        """The ``meta`` dict given at publish."""
        return self._header.user_meta

    @property
    def nbytes(self) -> int:
        """Size of the whole buffer (header + tensor bytes)."""
        return self._header.nbytes

    @property
    def header_bytes(self) -> bytes:
        """The raw header (length prefix + JSON): equal headers, equal snapshots (it records the checksum)."""
        return self._buffer[: self._header.data_offset].tobytes()

    @property
    def checksum(self) -> str:
        return self._header.checksum

    @property
    def buffer(self) -> np.ndarray:
        """The raw safetensors bytes (read-only numpy view of shared memory)."""
        view = self._buffer.view()
        view.flags.writeable = False
        return view

    def __getitem__(self, name: str) -> SharedTensor:
        if self._views is None:
            from .views import tensor_views

            self._views = tensor_views(self._buffer, self._header, str(self.id))
        try:
            return self._views[name]
        except KeyError:
            raise KeyError(f"snapshot {self.id} has no tensor {name!r}; it has {sorted(self._views)}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._header.tensors)

    def __len__(self) -> int:
        return len(self._header.tensors)

    def __repr__(self) -> str:
        return f"Snapshot({self.id}, {len(self)} tensors, {self.nbytes} bytes)"

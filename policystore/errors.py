"""Every error the store raises on bad input or bad data; each message names the snapshot or value at fault."""

from __future__ import annotations


class PolicyStoreError(Exception):
    """Base class: catch this to handle any policystore failure."""


class InvalidPolicyIdError(PolicyStoreError, ValueError):
    """A policy id that is not a plain name (it would escape the spill directory or clash on disk)."""


class InvalidWeightsError(PolicyStoreError, TypeError):
    """Weights that cannot become a snapshot: not a mapping of names to tensors, unsupported dtype, ..."""


class UnknownPolicyError(PolicyStoreError, KeyError):
    """No snapshot of this policy id exists in the store."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


class UnknownVersionError(UnknownPolicyError):
    """The policy exists but not at this version (never published, or deleted)."""


class SnapshotTooLargeError(PolicyStoreError, ValueError):
    """A snapshot larger than the whole hot tier: it could never be served from shared memory."""


class CorruptSnapshotError(PolicyStoreError):
    """Bytes that fail their checksum or do not parse; such a snapshot is never served."""


class SnapshotLostError(PolicyStoreError):
    """The catalog lists the snapshot but no live copy is left (its nodes are gone and it never reached the
    durable tier, or a non-durable publish died with its store before being spilled)."""


class DiskFullError(PolicyStoreError, OSError):
    """The spill tier cannot take the snapshot (no space left, or over disk_capacity_bytes)."""


class SpillFailedError(PolicyStoreError, OSError):
    """Acknowledged snapshots that are only in memory: their spill to disk failed (disk full, I/O error) and no
    durable copy exists, so a store restart would lose them. The store keeps retrying; the message names them."""


class ReadOnlyWeightsError(PolicyStoreError, RuntimeError):
    """An in-place write into shared weights, which would silently change them for every process on the node."""


class ShapeMismatchError(PolicyStoreError, ValueError):
    """A snapshot whose tensors do not fit the module it is loaded into."""


class InvalidMetaError(InvalidWeightsError):
    """A snapshot's meta that cannot be kept: not JSON, larger than 64 KiB as JSON, or nested deeper than 16."""


class CatalogDatabaseError(PolicyStoreError):
    """The catalog's database cannot be read or written (I/O error, a file from a newer policystore)."""


class InvalidOptionError(PolicyStoreError, TypeError):
    """An option of the wrong type or out of range (``durable="yes"``, a staging file outside the staging folder)."""


class UnknownMetricError(PolicyStoreError, LookupError):
    """A metric name the store does not export (a typo would otherwise export nothing, silently)."""


class DurableTierError(PolicyStoreError, OSError):
    """The durable tier (object storage or a shared folder) could not be written or read: nothing was committed."""


class SnapshotFolderError(PolicyStoreError, OSError):
    """A snapshot folder that cannot be used safely: missing, not a real folder (a symlink), or a private spill
    folder owned by another user (who could then swap or read the snapshots)."""


class ConfigError(PolicyStoreError, ValueError):
    """A ``StoreConfig`` field (or ``connect()`` argument) of the wrong type or out of range; raised before any
    store starts (``ValueError`` too, so older ``except ValueError`` clauses still catch it)."""


class StoreUnavailableError(PolicyStoreError):
    """A node's store or the catalog could not be started or reached (its start failed, it stays down, or no
    cluster answers at the address given); the message names which and why."""


class DeadlineExceededError(StoreUnavailableError, TimeoutError):
    """A remote call (to a node's store or to the catalog) did not answer within its deadline
    (``StoreConfig.call_timeout_s``); the message names the actor and the call. A write that timed out may still
    land: look before publishing again."""


class WriteProtectionError(PolicyStoreError, OSError):
    """This process could not make a snapshot's shared pages read-only (``mprotect`` failed, e.g. ENOMEM at the
    kernel's ``vm.max_map_count``): its views are refused, since a stray write through them would change the weights
    of every process on the node."""


class MissingExtraError(PolicyStoreError, ImportError):
    """A part of policystore whose optional dependencies are not installed; the message names the extra that
    brings them (``pip install 'policystore[rllib]'``)."""


def brief(exc: BaseException, limit: int = 200) -> str:
    """The first line of ``exc``'s message, at most ``limit`` characters ("" for none): enough to name a problem
    inside a log line or a report without pasting a remote traceback into it."""
    text = str(exc)
    return text.splitlines()[0][:limit] if text.strip() else ""

"""Snapshot identity: a policy id (validated, because it becomes a directory name) and a version counter."""

from __future__ import annotations

import re
from typing import NamedTuple

from .errors import InvalidPolicyIdError

_POLICY_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def is_policy_id(name: object) -> bool:
    """Whether ``name`` is a plain name a policy may have (what ``check_policy_id`` accepts)."""
    return isinstance(name, str) and _POLICY_ID.fullmatch(name) is not None


def check_policy_id(policy_id: object) -> str:
    """Return ``policy_id`` if it is a plain name, else raise InvalidPolicyIdError saying why.

    Called where an id enters: the public API, each actor's entry points, the command line; ``filenames`` checks
    it once more where it becomes a folder name (the traversal defence). Code behind those takes it as checked.
    """
    if not isinstance(policy_id, str):
        raise InvalidPolicyIdError(f"policy id must be a str, got {type(policy_id).__name__}: {policy_id!r}")
    if not is_policy_id(policy_id):
        raise InvalidPolicyIdError(
            f"invalid policy id {policy_id!r}: use 1-128 characters from [A-Za-z0-9._-], starting with a letter "
            "or digit (no path separators, no '..', not empty)"
        )
    return policy_id


MAX_VERSION = 2**63 - 1  # the catalog's sqlite integers are 64-bit signed


def check_version(version: object) -> int:
    """Versions count from 1 up to MAX_VERSION; bool is rejected even though it is an int."""
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= MAX_VERSION:
        raise InvalidPolicyIdError(f"version must be an int in [1, 2**63 - 1], got {version!r}")
    return version


def checked_target(policy_id: object, version: object = None) -> tuple[str, int | None]:
    """The (policy id, version or None) a call names, both checked; None stands for the latest or every version."""
    return check_policy_id(policy_id), None if version is None else check_version(version)


def checked_id(policy_id: object, version: object) -> SnapshotId:
    """The snapshot id a caller names as (policy id, version), both checked."""
    return SnapshotId(check_policy_id(policy_id), check_version(version))


class SnapshotId(NamedTuple):
    """One immutable snapshot: ``policy_id`` at ``version`` (1, 2, ...)."""

    policy_id: str
    version: int

    def __str__(self) -> str:
        return f"{self.policy_id}@v{self.version}"

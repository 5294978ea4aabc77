"""Snapshot identity: a policy id (validated, because it becomes a directory name) and a version counter."""

from __future__ import annotations

import re
from typing import NamedTuple

from .errors import InvalidPolicyIdError

_POLICY_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def check_policy_id(policy_id: object) -> str:
    """Return ``policy_id`` if it is a plain name, else raise InvalidPolicyIdError saying why."""
    if not isinstance(policy_id, str):
        raise InvalidPolicyIdError(f"policy id must be a str, got {type(policy_id).__name__}: {policy_id!r}")
    if not _POLICY_ID.fullmatch(policy_id):
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


class SnapshotId(NamedTuple):
    """One immutable snapshot: ``policy_id`` at ``version`` (1, 2, ...)."""

    policy_id: str
    version: int

    def __str__(self) -> str:
        return f"{self.policy_id}@v{self.version}"

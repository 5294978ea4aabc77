"""What "latest" answers when the version heard of as latest is gone: the one fallback of the client and the store.

A reader (the client from the store's push, the store from the catalog's feed) hears of a policy's newest version
before it reads it; that version may be deleted, or lose its last copy, in between. Then the newest readable
version is the one to ask for (the catalog's ``lookup`` never names a lost one), never an error.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from .errors import SnapshotLostError, UnknownVersionError

log = logging.getLogger(__name__)

T = TypeVar("T")


def read_latest(policy_id: str, heard: int | None, read: Callable[[int], T], ask: Callable[[], T], asked: str) -> T:
    """``read(heard)``, or ``ask()`` (named ``asked`` in the log) when nothing was heard or ``heard`` was deleted or
    lost since it was heard of."""
    if heard is not None:
        try:
            return read(heard)
        except UnknownVersionError:
            log.info("policystore: %s@v%d was deleted since it was heard of as latest; asking %s", policy_id, heard,
                     asked)
        except SnapshotLostError:
            log.info("policystore: %s@v%d has no copy left; asking %s for the newest readable", policy_id, heard,
                     asked)
    return ask()

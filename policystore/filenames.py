"""The one mapping between a snapshot and the names of its folder and files, both ways, for every accepted id.

A policy's files live in a folder named by its id (``policy_folder``: the one check that keeps paths inside a
tier's root).

Every file a tier keeps for a version starts with the version in decimal, zero-padded to at least 10 digits
(``0000000042.safetensors``, ``10000000000.commit.json``, up to 19 digits for ``MAX_VERSION``); the spill tier,
the durable tier, the pending-tombstone records, ``open_folder`` and every scan name and parse files only here, so
a version the API accepts is always found again after a restart. Parsing accepts only the one name each version
is given (no extra leading zeros), so two names never claim the same version.
"""

from __future__ import annotations

from .ids import MAX_VERSION, check_policy_id, check_version, is_policy_id

_WIDTH = 10  # the padding of every name written so far: existing folders stay readable
_MAX_DIGITS = len(str(MAX_VERSION))


def policy_folder(policy_id: str) -> str:
    """The name of ``policy_id``'s folder in a tier: the id itself, checked here (and only here) on every path a
    tier joins, so no id that slipped past a caller's check reaches outside the tier's root (``..``, ``/``)."""
    return check_policy_id(policy_id)


def policy_of(folder: str) -> str | None:
    """The policy whose ``policy_folder`` is ``folder``, else None (a folder of something else)."""
    return folder if is_policy_id(folder) else None


def version_name(version: int, suffix: str = "") -> str:
    """The name of ``version``'s file with ``suffix`` (``".safetensors"``, ``".commit.json"``, ``""``)."""
    return f"{check_version(version):0{_WIDTH}d}{suffix}"


def version_of(stem: str) -> int | None:
    """The version whose ``version_name`` is ``stem`` (digits only), else None."""
    if not (_WIDTH <= len(stem) <= _MAX_DIGITS and stem.isascii() and stem.isdigit()):
        return None
    version = int(stem)
    if not 1 <= version <= MAX_VERSION or version_name(version) != stem:
        return None
    return version


def parse_name(name: str, suffix: str) -> int | None:
    """The version of a file called exactly ``version_name(version, suffix)``, else None."""
    return version_of(name.removesuffix(suffix)) if name.endswith(suffix) else None


def split_name(name: str) -> tuple[int, str] | None:
    """(version, the rest after its digits) of any file name that starts with a version followed by ``.``."""
    stem, dot, rest = name.partition(".")
    version = version_of(stem)
    return (version, dot + rest) if version is not None and dot else None

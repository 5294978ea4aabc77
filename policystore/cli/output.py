"""What the ``policystore`` command shows: typed records (one per snapshot, copy check, policy, source) and the
``Output`` that prints them as tables for people or as JSON (``--json``) for scripts."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import PolicyStoreError
from ..ids import SnapshotId
from ..wire import Summarized, Summary

EXIT_OK, EXIT_PROBLEM, EXIT_USAGE = 0, 1, 2


class UsageError(PolicyStoreError, ValueError):
    """A command line that cannot be carried out as given (missing option, offline where a cluster is needed)."""


@dataclass
class Row(Summarized):
    """One snapshot as the CLI shows it, whatever the source: its summary and where it is held."""

    id: SnapshotId
    summary: Summary
    holders: tuple[str, ...] = ()
    tiers: dict[str, str] = field(default_factory=dict)  # where -> tier ("hot", "disk", "remote", "durable", "file")
    file_bytes: int = 0  # bytes of files holding it (spill files on every node, or the file/object offline)
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"policy_id": self.id.policy_id, "version": self.id.version, "nbytes": self.nbytes,
                "checksum": self.checksum, "meta": self.meta, "created": self.created,
                **{f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("id", "summary")}}


@dataclass
class CopyCheck:
    """One check of a snapshot's copies: by a node's store (its ``VerifyReport`` in ``report``), by the folder
    reader, or of the durable tier's copy."""

    node: str | None
    problems: list[str]
    report: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, **self.report, "ok": not self.problems, "problems": self.problems}


@dataclass
class Verified:
    """``verify``'s finding for one snapshot (or, without a version, for files too damaged to be listed)."""

    policy_id: str | None
    version: int | None
    copies: list[CopyCheck]
    unlisted: list[str] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        return [p for copy in self.copies for p in copy.problems] + self.unlisted

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {"policy_id": self.policy_id, "version": self.version, "ok": self.ok,
                "copies": [c.to_json() for c in self.copies], "problems": self.problems}


@dataclass
class FolderStats:
    """``stats`` of an offline source."""

    source: str
    policies: int
    snapshots: int
    nbytes: int
    file_bytes: int


@dataclass
class Usage:
    """``du``: the space one policy (or the total) uses."""

    policy_id: str
    versions: int = 0
    nbytes: int = 0
    file_bytes: int = 0
    hot_bytes: int = 0  # in shared memory, summed over nodes

    def add(self, row: Row) -> None:
        self.versions += 1
        self.nbytes += row.nbytes
        self.file_bytes += row.file_bytes
        self.hot_bytes += row.nbytes * sum(t == "hot" for t in row.tiers.values())


def record(value: Any) -> Any:
    """A record as JSON-ready data (dataclasses through ``to_json`` where they have one)."""
    if hasattr(value, "to_json"):
        return value.to_json()
    if dataclasses.is_dataclass(value):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    return str(value)


class Output:
    """Tables with rich for people; the same data as JSON on stdout with ``--json``."""

    def __init__(self, as_json: bool):
        self.as_json = as_json

    def table(self, data: Any, columns: Sequence[str], cells: Sequence[Sequence[str]], *, title: str) -> None:
        if self.as_json:
            return self._json(data)
        from rich.table import Table

        table = Table(title=title, title_justify="left")
        for column in columns:
            table.add_column(column, overflow="fold")
        for row in cells:
            table.add_row(*row)
        self._console().print(table)

    def message(self, data: Any, text: str) -> None:
        if self.as_json:
            return self._json(data)
        self._console().print(text, highlight=False)

    def error(self, text: str) -> None:
        if self.as_json:
            print(json.dumps({"error": text}), file=sys.stdout)
        print(f"policystore: error: {text}", file=sys.stderr)

    @staticmethod
    def _json(data: Any) -> None:
        print(json.dumps(data, indent=2, default=record))

    @staticmethod
    def _console():
        from rich.console import Console

        return Console(width=None if sys.stdout.isatty() else 200, soft_wrap=False)


def size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def node(name: str | None) -> str:
    return name[:8] if name and len(name) > 16 else str(name)


def short_json(value: Any, width: int = 48) -> str:
    text = json.dumps(value, separators=(",", ":"), default=str)
    return text if len(text) <= width else text[: width - 1] + "…"


def cell(key: str, value: Any) -> str:
    if isinstance(value, int) and key.endswith("bytes"):
        return size(value)
    return node(value) if key == "node_id" else str(value)

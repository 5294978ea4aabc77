"""Reading the JSON-lines journal (``_catalog.jsonl``) that catalogs before the sqlite database kept.

The catalog imports it once into its database. The journal could be damaged in ways this reader must survive:
a record torn by a crash mid-append has the next record appended to the same line (so a line can hold a torn
prefix followed by a whole record), a line can be garbage, a record can lack fields. Every whole record is kept,
in order, and every skipped piece is reported with its line number.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import PolicyStoreError
from .ids import check_policy_id, check_version

OPS = {"reserve", "commit", "abort", "hold", "drop", "delete"}
_RECORD_START = re.compile(r'\{"op":')


@dataclass
class JournalState:
    """What the journal says, with "latest" meaning the highest committed version (not the last committed)."""

    committed: dict[tuple[str, int], tuple[dict[str, Any], list[str]]] = field(default_factory=dict)
    reserved: dict[tuple[str, int], str] = field(default_factory=dict)  # (pid, version) -> reserving node
    gone: dict[tuple[str, int], str] = field(default_factory=dict)  # aborted or deleted: (pid, version) -> state
    next: dict[str, int] = field(default_factory=dict)
    records: int = 0
    problems: list[str] = field(default_factory=list)


def read_journal(path: Path) -> JournalState:
    """Replay every whole record of the journal at ``path``; never raises on its contents."""
    state = JournalState()
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if line:
                for record in _records(line, number, state.problems):
                    _apply(state, record, number)
    return state


def _records(line: str, number: int, problems: list[str]) -> list[dict[str, Any]]:
    try:
        return [json.loads(line)]
    except json.JSONDecodeError:
        pass
    # A torn record followed by whole ones on the same line: decode from every place a record can start.
    decoder, found, pos, skipped = json.JSONDecoder(), [], 0, []
    while pos < len(line):
        match = _RECORD_START.search(line, pos)
        if match is None:
            skipped.append(line[pos:])
            break
        if match.start() > pos:
            skipped.append(line[pos:match.start()])
        try:
            record, end = decoder.raw_decode(line, match.start())
            found.append(record)
            pos = end
        except json.JSONDecodeError:
            nxt = _RECORD_START.search(line, match.start() + 1)
            skipped.append(line[match.start():nxt.start() if nxt else len(line)])
            pos = nxt.start() if nxt else len(line)
    for piece in skipped:
        problems.append(f"line {number}: skipped {len(piece)} unreadable characters ({piece[:60]!r})")
    return found


def _apply(state: JournalState, r: Any, number: int) -> None:
    try:
        if not isinstance(r, dict) or r.get("op") not in OPS:
            raise ValueError("not a journal record")
        op, pid, version = r["op"], check_policy_id(r["pid"]), check_version(r["v"])
        node = r.get("node")
        if op in ("reserve", "commit", "hold", "drop") and not isinstance(node, str):
            raise ValueError("no node")
        if op == "commit" and not isinstance(r.get("summary"), dict):
            raise ValueError("no summary")
    except (KeyError, ValueError, PolicyStoreError) as exc:
        state.problems.append(f"line {number}: skipped a malformed record ({exc}): {json.dumps(r)[:80]}")
        return
    state.records += 1
    key = (pid, version)
    if op in ("reserve", "commit"):
        state.next[pid] = max(state.next.get(pid, 1), version + 1)
    if op == "reserve":
        state.reserved[key] = node
    elif op == "commit":
        state.reserved.pop(key, None)
        state.gone.pop(key, None)
        state.committed[key] = (r["summary"], [node])
    elif op == "abort":
        if state.reserved.pop(key, None) is not None:
            state.gone[key] = "aborted"
    elif op == "delete":
        if state.committed.pop(key, None) is not None:
            state.gone[key] = "deleted"
    elif key in state.committed:  # hold / drop
        holders = [n for n in state.committed[key][1] if n != node]
        state.committed[key][1][:] = [*holders, node] if op == "hold" else holders

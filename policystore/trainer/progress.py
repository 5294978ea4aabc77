"""Progress of the trainer's long commands (evaluate, judge) and the width of what they print.

On a terminal: a rich progress bar (on stderr, so ``--json`` output stays clean). Off a terminal (a log file, a
pipe, CI): no bar, one plain line per finished task, and tables at their full width rather than rich's 80 columns.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

OFF_TERMINAL_WIDTH = 1000  # lines as long as their content: a log keeps every column


def console(stderr: bool = False) -> Console:
    """A console for people on a terminal, for logs (full-width plain lines) elsewhere."""
    probe = Console(stderr=stderr)
    return probe if probe.is_terminal else Console(stderr=stderr, width=OFF_TERMINAL_WIDTH, soft_wrap=True)


@contextmanager
def task(label: str, total: int, unit: str) -> Iterator[Callable[[int], None]]:
    """Yields ``done(n)``, which says ``n`` of ``total`` ``unit`` are done; a bar on a terminal, one line at the end
    off it (both on stderr)."""
    err = console(stderr=True)
    start = time.monotonic()
    if not err.is_terminal:
        yield lambda n: None
        err.print(f"{label}: {total} {unit} in {time.monotonic() - start:.1f} s", highlight=False)
        return
    with Progress(TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(), TextColumn(unit),
                  TimeElapsedColumn(), TimeRemainingColumn(), console=err, transient=True) as bar:
        task_id = bar.add_task(label, total=total)
        yield lambda n: bar.update(task_id, completed=n)

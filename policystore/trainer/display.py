"""What the trainer shows on the terminal: a live progress bar and status table, then the end-of-run summary.

Only presentation: the driver hands in the figures (``status``: elapsed seconds, env steps, steps/s and the
league's summary rows; the last evaluation row of the curve), nothing here talks to Ray.
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from policystore.league.constants import DEFAULT_PLAYER, HISTORICAL, MAIN, SCRIPTED
from policystore.trainer.report import players_table, win_rates_text


def status_table(status: dict[str, Any], last_eval: dict[str, Any] | None) -> Table:
    table = Table(show_header=False, box=None, padding=(0, 2))
    summary = status["summary"]
    snapshots = sum(r["kind"] == HISTORICAL for r in summary)
    scripted = sum(r["kind"] == SCRIPTED for r in summary)
    table.add_row("env steps", f"{status['steps']:,}  ({status['steps_per_s']:,.0f}/s)")
    table.add_row("league", f"{len(summary) - snapshots - scripted} learning, {snapshots} frozen snapshots"
                  + (f", {scripted} scripted" if scripted else ""))
    table.add_row("Elo (mains)", "  ".join(f"{r['name']} {r['elo']:.0f}" for r in summary if r["kind"] == MAIN))
    if last_eval:
        table.add_row(f"{DEFAULT_PLAYER} wins", f"{win_rates_text(last_eval)}   (at {last_eval['steps']:,} steps)")
    return table


class LiveDisplay:
    """A progress bar over the session's seconds and the status table under it, redrawn twice a second."""

    def __init__(self, console: Console, seconds: float):
        self.progress = Progress(TextColumn("[bold]training"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                                 TimeElapsedColumn(), TimeRemainingColumn(), console=console)
        self.task = self.progress.add_task("train", total=seconds)
        self.seconds = seconds
        self.live = Live(Group(self.progress), console=console, refresh_per_second=2)

    def __enter__(self) -> LiveDisplay:
        self.live.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.live.__exit__(kind, exc, tb)
        if not self.live.console.is_terminal:  # off a terminal rich leaves the last line open: end it
            self.live.console.line()

    def update(self, status: dict[str, Any], last_eval: dict[str, Any] | None) -> None:
        self.progress.update(self.task, completed=min(status["elapsed_s"], self.seconds))
        self.live.update(Group(self.progress, status_table(status, last_eval)))


def print_summary(console: Console, summary: list[dict[str, Any]], final: dict[str, Any], eval_games: int,
                  report_dir: Path) -> None:
    """The players table, the main agent's last evaluation, throughput and the store's memory figures."""
    console.print(players_table(summary))
    last = final[DEFAULT_PLAYER]
    if last:
        console.print(f"{DEFAULT_PLAYER} (greedy, {2 * eval_games} games per opponent, both seats): "
                      f"wins {win_rates_text(last)}")
    console.print(f"env steps this session: {final['env_steps']:,} in {final['elapsed_s']:.0f} s "
                  f"({final['env_steps_per_s']:,.0f} steps/s)")
    memory = final["memory"]
    console.print(
        f"store memory: {memory['store_hot_mib']:.2f} MiB of shared memory on this node hold the league's "
        f"{memory['league_policies']} policies ({memory['frozen_snapshots']} frozen snapshots; "
        f"{memory['league_policy_mib']:.2f} MiB); private copies in every worker would cost "
        f"{memory['workers']} x {memory['league_policy_mib']:.2f} = {memory['private_copies_mib']:.2f} MiB")
    console.print(f"report: {report_dir}/ (players.md, payoff.png, curve.png, report.json)")

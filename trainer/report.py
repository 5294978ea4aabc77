"""End-of-run report: players table, payoff heatmap, learning curve, store memory report, report.json."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
from rich.table import Table

from league.constants import DEFAULT_PLAYER, HISTORICAL, is_frozen
from policystore import StoreStats
from policystore.memory import MiB


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend (runs headless, never opens a window)."""
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def win_keys(curve: list[dict[str, Any]]) -> list[str]:
    """The evaluation opponents recorded in the curve (``win_random``, ``win_winblock``, ...)."""
    return [k for k in (curve[0] if curve else {}) if k.startswith("win_")]


def win_rates_text(row: dict[str, Any]) -> str:
    return "   ".join(f"vs {k[4:]} {row[k]:.1%}" for k in win_keys([row]))


def players_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(title="League players (by Elo)")
    for col in ("player", "kind", "parent", "Elo", "env steps"):
        table.add_column(col, justify="right" if col in ("Elo", "env steps") else "left")
    for r in sorted(rows, key=lambda r: -r["elo"]):
        table.add_row(r["name"], r["kind"], r["parent"] or "", f"{r['elo']:.0f}",
                      f"{r['steps']:,}" if r["kind"] != HISTORICAL else "")
    return table


def players_markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| player | kind | parent | Elo | env steps |", "|---|---|---|---:|---:|"]
    for r in sorted(rows, key=lambda r: -r["elo"]):
        steps = f"{r['steps']:,}" if r["kind"] != HISTORICAL else ""
        lines.append(f"| {r['name']} | {r['kind']} | {r['parent'] or ''} | {r['elo']:.0f} | {steps} |")
    return "\n".join(lines) + "\n"


def payoff_heatmap(summary: list[dict[str, Any]], players: list[str], matrix: np.ndarray, met: np.ndarray,
                   path: Path) -> None:
    """The players that train (rows) against every player they met (columns), both strongest first by Elo, so
    the picture reads as who beats whom; pairs that never met are grey, not a made-up 0.5."""
    plt = pyplot()
    elo = {r["name"]: r["elo"] for r in summary}
    index = {name: i for i, name in enumerate(players)}
    by_elo = sorted((p for p in players if p in elo), key=lambda p: -elo[p])
    kinds = {r["name"]: r["kind"] for r in summary}
    rows = [p for p in by_elo if kinds[p] != HISTORICAL]
    cols = [p for p in by_elo if any(met[index[r], index[p]] for r in rows)]
    grid = np.full((len(rows), len(cols)), np.nan)
    for i, r in enumerate(rows):
        for j, c in enumerate(cols):
            if met[index[r], index[c]]:
                grid[i, j] = matrix[index[r], index[c]]
    fig, ax = plt.subplots(figsize=(max(5.0, 0.42 * len(cols) + 3), max(3.0, 0.42 * len(rows) + 2)))
    cmap = matplotlib.colormaps["RdBu"].with_extremes(bad="#dddddd")
    im = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=0, vmax=1, aspect="auto")
    if grid.size <= 600:  # numbers while they stay readable
        for (i, j), v in np.ndenumerate(grid):
            if not np.isnan(v):
                ax.text(j, i, f"{100 * v:.0f}", ha="center", va="center", fontsize=6,
                        color="white" if abs(v - 0.5) > 0.3 else "black")
    ax.set_xticks(range(len(cols)), [f"{c} ({elo[c]:.0f})" for c in cols], rotation=90, fontsize=7)
    ax.set_yticks(range(len(rows)), [f"{r} ({elo[r]:.0f})" for r in rows], fontsize=7)
    ax.set_xlabel("opponent (by Elo)")
    ax.set_ylabel("training player")
    ax.set_title("Payoff: P[row beats column] in % (decayed; grey: never met)")
    fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def learning_curve(curve: list[dict[str, Any]], path: Path) -> None:
    """Win rates of the main agent against the scripted players, and the main agents' Elo, over env steps."""
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    steps = [row["steps"] / 1e6 for row in curve]
    for key in win_keys(curve):
        ax1.plot(steps, [row[key] for row in curve], marker=".", label=f"vs {key[4:]}")
    ax1.axhline(0.95, color="grey", ls=":", lw=1)
    ax1.axhline(0.60, color="grey", ls=":", lw=1)
    ax1.set_ylim(0, 1)
    ax1.set_xlabel("env steps (millions)")
    ax1.set_ylabel("main agent win rate (both seats)")
    ax1.legend()
    ax1.grid(alpha=0.3)
    mains = sorted({k for row in curve for k in row.get("elo", {})})
    for name in mains:
        ax2.plot(steps, [row["elo"].get(name, np.nan) for row in curve], label=name)
    ax2.set_xlabel("env steps (millions)")
    ax2.set_ylabel("Elo")
    ax2.legend(fontsize=7)
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def memory_report(stats: StoreStats, infos: list[Any], workers: int) -> dict[str, Any]:
    """The node store's memory against what private copies in every worker would cost.

    ``infos`` is ``store.list()``. Private copies: every rollout worker holding its own copy of every league
    policy, the frozen snapshots and the latest version of each learning player (RLlib's EnvRunners hold every
    module: workers x policies x size). The store holds one copy per node for all workers (its hot tier also
    keeps each learning player's previous version).
    """
    frozen = [i.nbytes for i in infos if is_frozen(i.meta)]
    latest: dict[str, tuple[int, int]] = {}
    for i in infos:
        if not is_frozen(i.meta):
            latest[i.id.policy_id] = max(latest.get(i.id.policy_id, (0, 0)), (i.id.version, i.nbytes))
    policies = sum(frozen) + sum(nbytes for _, nbytes in latest.values())
    return {
        "frozen_snapshots": len(frozen),
        "league_policies": len(frozen) + len(latest),
        "league_policy_mib": policies / MiB,
        "store_hot_mib": stats.hot_bytes / MiB,
        "store_hot_snapshots": stats.hot_snapshots,
        "store_disk_mib": stats.disk_bytes / MiB,
        "workers": workers,
        "private_copies_mib": workers * policies / MiB,
    }


def final_record(status: dict[str, Any], curve: list[dict[str, Any]], memory: dict[str, Any],
                 workers: list[dict[str, Any]], learners: list[dict[str, Any]]) -> dict[str, Any]:
    """What report.json holds: this session's throughput, the main agent's last evaluation, memory, actors."""
    return {"env_steps": status["steps"], "env_steps_per_s": status["steps_per_s"],
            "elapsed_s": status["elapsed_s"], DEFAULT_PLAYER: curve[-1] if curve else None,
            "memory": memory, "workers": workers, "learners": learners}


def write_report(directory: Path, summary: list[dict[str, Any]], players: list[str], matrix: np.ndarray,
                 met: np.ndarray, curve: list[dict[str, Any]]) -> None:
    """payoff.png, curve.png and players.md in ``directory`` (the driver writes ``final_record`` beside them as
    report.json, atomically, like every JSON file of the run)."""
    directory.mkdir(exist_ok=True)
    payoff_heatmap(summary, players, matrix, met, directory / "payoff.png")
    learning_curve(curve, directory / "curve.png")
    (directory / "players.md").write_text(players_markdown(summary))

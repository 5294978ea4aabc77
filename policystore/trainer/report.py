"""End-of-run report: players table, payoff heatmap, learning curve (with the reference measure's points: against
OpenSpiel's MCTS, or the exact NashConv), store memory report, report.json."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
from matplotlib.patches import Rectangle
from rich.table import Table

from policystore import StoreStats
from policystore.league.constants import DEFAULT_PLAYER, HISTORICAL, SCRIPTED, TRAINABLE_KINDS, is_frozen
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


def reference_title(record: dict[str, Any]) -> str:
    """What the reference record measures, as a heading."""
    if record["measure"] == "nash_conv":
        return f"{DEFAULT_PLAYER}'s NashConv, computed exactly by OpenSpiel"
    return f"{DEFAULT_PLAYER} against OpenSpiel {record['opponent']}"


def reference_text(record: dict[str, Any]) -> str:
    """The reference record in one line for the terminal: each point's figure, or why it was skipped."""
    head = reference_title(record)
    if "skipped" in record:
        return f"{head}: skipped, {record['skipped']}"
    if record["measure"] == "nash_conv":
        figures = ", ".join(f"{p['player']} at {p['steps'] / 1e6:.1f} M steps {p['nash_conv']:.3f}"
                            for p in record["points"])
        return (f"{head} (0: a Nash equilibrium; the uniform-random policy {record['uniform_nash_conv']:.3f}; "
                f"{record['seconds']:.0f} s): {figures}")
    rates = ", ".join(f"{p['player']} at {p['steps'] / 1e6:.1f} M steps {p['win']:.0%}" for p in record["points"])
    return f"{head} ({record['games_per_point']} games per point, both seats, {record['seconds']:.0f} s): {rates}"


def reference_markdown(record: dict[str, Any]) -> list[str]:
    """The reference record as a section of players.md: a table of its points, or why it was not measured."""
    lines = ["", f"## {reference_title(record)}", ""]
    if "skipped" in record:
        return [*lines, f"Not measured: {record['skipped']}."]
    if record["measure"] == "nash_conv":
        return [*lines, f"The sum over both players of what a best response to the other gains: 0 at a Nash "
                        f"equilibrium, {record['uniform_nash_conv']:.3f} for the uniform-random policy "
                        f"({record['game']}); exploitability as some papers plot it is half of it. Computed after "
                        f"training in {record['seconds']:.1f} s.", "",
                "| player | env steps (frozen at) | NashConv | exploitability |", "|---|---:|---:|---:|",
                *(f"| {p['player']} | {p['steps']:,} | {p['nash_conv']:.4f} | {p['nash_conv'] / 2:.4f} |"
                  for p in record["points"])]
    return [*lines, f"{record['games_per_point']} games per point, both seats, measured after training in "
                    f"{record['seconds']:.0f} s.", "",
            "| player | env steps (frozen at) | win | draw | loss | win, 95% interval |",
            "|---|---:|---:|---:|---:|---|",
            *(f"| {p['player']} | {p['steps']:,} | {p['win']:.0%} | {p['draw']:.0%} | {p['loss']:.0%} "
              f"| [{p['win_low']:.0%}, {p['win_high']:.0%}] |" for p in record["points"])]


def players_markdown(rows: list[dict[str, Any]], reference: dict[str, Any] | None = None) -> str:
    """The players by Elo, then the main agent by the game's reference measure (what was measured, or why not)."""
    lines = ["| player | kind | parent | Elo | env steps |", "|---|---|---|---:|---:|"]
    for r in sorted(rows, key=lambda r: -r["elo"]):
        steps = f"{r['steps']:,}" if r["kind"] != HISTORICAL else ""
        lines.append(f"| {r['name']} | {r['kind']} | {r['parent'] or ''} | {r['elo']:.0f} | {steps} |")
    if reference:
        lines += reference_markdown(reference)
    return "\n".join(lines) + "\n"


def league_columns(summary: list[dict[str, Any]]) -> list[str]:
    """The whole league, one lineage after another in the league's order (main agents, then exploiters): each
    trainable player's snapshots in the order they were frozen, then the player as it is now; the scripted
    players last."""
    trainable = [r["name"] for r in summary if r["kind"] in TRAINABLE_KINDS]
    scripted = [r["name"] for r in summary if r["kind"] == SCRIPTED]
    return [c for p in trainable for c in [r["name"] for r in summary if r["parent"] == p] + [p]] + scripted


def count_text(n: int) -> str:
    """A game count in at most four characters: 512, 5.1k, 1.2M."""
    for scale, suffix in ((1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.1f}{suffix}" if n < 10 * scale else f"{n / scale:.0f}{suffix}"
    return str(n)


def payoff_heatmap(summary: list[dict[str, Any]], players: list[str], matrix: np.ndarray, played: np.ndarray,
                   path: Path) -> None:
    """The players that train (rows, strongest first by Elo) against the whole league (columns, lineage by
    lineage in the order the snapshots were frozen), so a row reads as how far a player has left its own past
    behind and whom it still loses to. Each cell: the decayed win rate in % and the games played; pairs that
    never met are hatched grey, not a made-up 0.5 (frozen snapshots never play each other, hence no rows)."""
    plt = pyplot()
    elo = {r["name"]: r["elo"] for r in summary}
    index = {name: i for i, name in enumerate(players)}
    rows = sorted((r["name"] for r in summary if r["kind"] in TRAINABLE_KINDS), key=lambda p: -elo[p])
    cols = league_columns(summary)
    cells = np.ix_([index[r] for r in rows], [index[c] for c in cols])
    games = np.asarray(played)[cells].astype(np.int64)
    grid = np.where(games > 0, matrix[cells], np.nan)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.42 * len(cols) + 3.0), 0.55 * len(rows) + 3.2))
    cmap = matplotlib.colormaps["RdBu"].with_extremes(bad="#e4e4e4")
    im = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=0, vmax=1, aspect="auto")
    for (i, j), v in np.ndenumerate(grid):
        if np.isnan(v):
            ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="////", edgecolor="#a8a8a8", lw=0))
            continue
        color = "white" if abs(v - 0.5) > 0.3 else "black"
        ax.text(j, i - 0.1, f"{100 * v:.0f}", ha="center", va="center", fontsize=7, color=color)
        ax.text(j, i + 0.28, count_text(int(games[i, j])), ha="center", va="center", fontsize=5.5, color=color)
    for j in range(1, len(cols)):  # a line between lineages
        if cols[j - 1] in rows:
            ax.axvline(j - 0.5, color="black", lw=1.2)
    ax.set_xticks(range(len(cols)), [f"{c}  {elo[c]:.0f}" for c in cols], rotation=90, fontsize=7)
    ax.set_yticks(range(len(rows)), [f"{r}  {elo[r]:.0f}" for r in rows], fontsize=8)
    for label in ax.get_xticklabels():
        if label.get_text().split()[0] in rows:
            label.set_fontweight("bold")
    ax.set_xlabel("opponent and its Elo: each lineage's frozen snapshots, oldest first, then the player now (bold)")
    ax.set_ylabel("training player (by Elo)")
    ax.set_title("Who beats whom: P[row beats column] in % (decayed: recent games weigh most)\n"
                 "small number: games played; hatched: never met", fontsize=10)
    fig.colorbar(im, ax=ax, fraction=0.03, pad=0.01)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def learning_curve(curve: list[dict[str, Any]], path: Path, reference: dict[str, Any] | None = None) -> None:
    """Win rates of the main agent against the scripted players, and against the reference bot at the points
    measured after training (with their 95% intervals), and the main agents' Elo, over env steps; for a game
    measured by NashConv, a third panel with the main agent's NashConv at those points."""
    plt = pyplot()
    points = (reference or {}).get("points", [])  # none when the measurement was skipped
    nash = bool(points) and reference["measure"] == "nash_conv"
    fig, axes = plt.subplots(1, 3 if nash else 2, figsize=(16 if nash else 11, 4))
    ax1, ax2 = axes[0], axes[1]
    steps = [row["steps"] / 1e6 for row in curve]
    for key in win_keys(curve):
        ax1.plot(steps, [row[key] for row in curve], marker=".", label=f"vs {key[4:]}")
    if points and not nash:
        win = np.array([p["win"] for p in points])
        spread = [win - [p["win_low"] for p in points], [p["win_high"] for p in points] - win]
        ax1.errorbar([p["steps"] / 1e6 for p in points], win, yerr=spread, fmt="D", ms=4, color="black",
                     capsize=3, label=f"vs OpenSpiel {reference['opponent']} ({points[0]['games']} games each)")
        _annotate(ax1, points, "win")
    ax1.axhline(0.95, color="grey", ls=":", lw=1)
    ax1.axhline(0.60, color="grey", ls=":", lw=1)
    ax1.set_ylim(0, 1)
    ax1.set_xlabel("env steps (millions)")
    ax1.set_ylabel("main agent win rate (both seats)")
    ax1.legend(loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=3, fontsize=7, frameon=False)
    ax1.grid(alpha=0.3)
    mains = sorted({k for row in curve for k in row.get("elo", {})})
    for name in mains:
        ax2.plot(steps, [row["elo"].get(name, np.nan) for row in curve], label=name)
    ax2.set_xlabel("env steps (millions)")
    ax2.set_ylabel("Elo")
    ax2.legend(fontsize=7)
    ax2.grid(alpha=0.3)
    if nash:
        ax3 = axes[2]
        ax3.plot([p["steps"] / 1e6 for p in points], [p["nash_conv"] for p in points], "D-", ms=4, color="black",
                 label=f"{DEFAULT_PLAYER} (exact, OpenSpiel)")
        ax3.axhline(reference["uniform_nash_conv"], color="grey", ls=":", lw=1, label="uniform-random policy")
        _annotate(ax3, points, "nash_conv")
        ax3.set_ylim(bottom=0)
        ax3.set_xlabel("env steps (millions)")
        ax3.set_ylabel(f"NashConv in {reference['game']} (0: Nash equilibrium)")
        ax3.legend(fontsize=7)
        ax3.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _annotate(ax, points: list[dict[str, Any]], key: str) -> None:
    for p in points:
        ax.annotate(p["player"], (p["steps"] / 1e6, p[key]), xytext=(5, -2), textcoords="offset points",
                    fontsize=6, va="top")


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
                 workers: list[dict[str, Any]], learners: list[dict[str, Any]],
                 reference: dict[str, Any] | None = None) -> dict[str, Any]:
    """What report.json holds: this session's throughput, the main agent's last evaluation, memory, actors, and
    the main agent against the reference bot at a few points of the run (``trainer.reference``)."""
    return {"env_steps": status["steps"], "env_steps_per_s": status["steps_per_s"],
            "elapsed_s": status["elapsed_s"], DEFAULT_PLAYER: curve[-1] if curve else None,
            "memory": memory, "workers": workers, "learners": learners, "reference": reference}


def write_report(directory: Path, summary: list[dict[str, Any]], players: list[str], matrix: np.ndarray,
                 played: np.ndarray, curve: list[dict[str, Any]], reference: dict[str, Any] | None = None) -> None:
    """payoff.png, curve.png and players.md in ``directory`` (the driver writes ``final_record`` beside them as
    report.json, atomically, like every JSON file of the run)."""
    directory.mkdir(exist_ok=True)
    payoff_heatmap(summary, players, matrix, played, directory / "payoff.png")
    learning_curve(curve, directory / "curve.png", reference)
    (directory / "players.md").write_text(players_markdown(summary, reference))

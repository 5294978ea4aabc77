"""The run directory: where a run's config, league state, store files, checkpoints and report live.

    config.json       the TrainConfig
    league.json       players, payoff matrix, Elo, step budgets (League.to_dict)
    curve.json        live evaluations: env steps, win rates against random / win-block, Elo of the mains
    state.json        elapsed training seconds (summed over resumed sessions)
    checkpoints/      learner weights + Adam state (safetensors), initial weights for resets
    store/            the node store's spill tier: every published snapshot
    report/           players.md, payoff.png, curve.png, report.json

The one module that knows these names: the driver writes them, ``load_policy`` and the commands read them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from policystore.trainer.config import TrainConfig


class RunDir:
    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.config = self.root / "config.json"
        self.league = self.root / "league.json"
        self.curve = self.root / "curve.json"
        self.state = self.root / "state.json"
        self.checkpoints = self.root / "checkpoints"
        self.store = self.root / "store"
        self.report = self.root / "report"

    def write_json(self, path: Path, data: Any) -> None:
        """Write ``data`` to a temporary name and rename it: a run killed mid-write keeps the previous file."""
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, path)

    def read_json(self, path: Path, default: Any) -> Any:
        return json.loads(path.read_text()) if path.exists() else default

    def load_config(self) -> TrainConfig:
        """The run's saved config; a clear error when this is not a run directory."""
        if not self.config.exists():
            raise FileNotFoundError(f"{self.root} is not a trainer run directory (no config.json)")
        return TrainConfig.load(self.config)


def prepare_run_dir(run_dir: str | Path, config: TrainConfig | None, resume: bool) -> tuple[RunDir, TrainConfig]:
    """A fresh run directory (refusing to overwrite one) or, with ``resume``, the saved config."""
    rd = RunDir(run_dir)
    if resume:
        if not rd.config.exists():
            raise FileNotFoundError(f"cannot resume: {rd.root} has no config.json (start a run there first)")
        return rd, TrainConfig.load(rd.config)
    if rd.config.exists():
        raise FileExistsError(f"{rd.root} already holds a run; pass --resume to continue it or pick another --run-dir")
    rd.root.mkdir(parents=True, exist_ok=True)
    config = config or TrainConfig()
    config.save(rd.config)
    return rd, config

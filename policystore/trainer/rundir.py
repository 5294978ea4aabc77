"""The run directory: where a run's config, league state, store files, checkpoints and report live.

    config.json       the TrainConfig
    league.json       players, payoff matrix, Elo, step budgets (League.to_dict)
    curve.json        live evaluations: env steps, win rates against random / win-block, Elo of the mains
    state.json        elapsed training seconds (summed over resumed sessions)
    checkpoints/      learner weights + Adam state (safetensors), initial weights for resets
    store/            the node store's spill tier: every published snapshot
    report/           players.md, payoff.png, curve.png, report.json
    .lock             held (flock) by the trainer running here

The one module that knows these names: the driver writes them, ``load_policy`` and the commands read them.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from pathlib import Path
from typing import IO, Any

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
        self._lock: IO[str] | None = None  # held while a trainer runs here (hold)

    def write_json(self, path: Path, data: Any) -> None:
        """Write ``data`` to a temporary name and rename it: a run killed mid-write keeps the previous file."""
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, path)

    def read_json(self, path: Path, default: Any) -> Any:
        return json.loads(path.read_text()) if path.exists() else default

    def hold(self) -> None:
        """Hold the folder's lock for the life of this process: a second trainer on the same folder is refused
        (it would clear or overwrite this one's files)."""
        handle = open(self.root / ".lock", "w")  # noqa: SIM115  (kept open: the lock lives as long as the file)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise FileExistsError(f"another trainer runs in {self.root}") from None
        self._lock = handle

    def release(self) -> None:
        """Let go of the folder (the run in this process ended)."""
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def checkpointed(self) -> bool:
        """Whether the run wrote its first checkpoint (the state ``--resume`` continues from)."""
        return self.state.exists()

    def load_config(self) -> TrainConfig:
        """The run's saved config; a clear error when this is not a run directory."""
        if not self.config.exists():
            raise FileNotFoundError(f"{self.root} is not a trainer run directory (no config.json)")
        return TrainConfig.load(self.config)


def check_run_dir(run_dir: str | Path, resume: bool) -> RunDir:
    """The run directory, if a run can start (or, ``resume``, continue) there; else the error that says why."""
    rd = RunDir(run_dir)
    if rd.root.exists() and not rd.root.is_dir():
        raise NotADirectoryError(f"{rd.root} is a file, not a folder")
    if resume:
        if not rd.config.exists():
            raise FileNotFoundError(f"cannot resume: {rd.root} has no config.json (start a run there first)")
        if not rd.checkpointed():
            raise FileNotFoundError(f"cannot resume: the run in {rd.root} stopped before its first checkpoint; "
                                    "start it again without --resume")
    elif rd.checkpointed():
        raise FileExistsError(f"{rd.root} already holds a run; pass --resume to continue it or pick another --run-dir")
    return rd


def prepare_run_dir(run_dir: str | Path, config: TrainConfig | None, resume: bool) -> tuple[RunDir, TrainConfig]:
    """A fresh run directory (refusing to overwrite a run that checkpointed) or, with ``resume``, the saved config.
    What a run that stopped before its first checkpoint left (it cannot be resumed) is cleared for the new start."""
    rd = check_run_dir(run_dir, resume)
    rd.root.mkdir(parents=True, exist_ok=True)
    rd.hold()
    if resume:
        return rd, TrainConfig.load(rd.config)
    for leftover in (rd.config, rd.league, rd.curve):
        leftover.unlink(missing_ok=True)
    for folder in (rd.store, rd.checkpoints):
        shutil.rmtree(folder, ignore_errors=True)
    config = config or TrainConfig()
    config.save(rd.config)
    return rd, config

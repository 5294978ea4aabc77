"""Plumbing every benchmark shares: CLI, one JSON row per measured point, the results folder, Ray sessions.

A benchmark builds its parser with ``make_parser``, opens ``Results`` and ``emit``s one row per measured point
(printed at once as one JSON line on stdout; logs and progress bars go to stderr), then ``finish`` writes
``results.json`` (rows, skipped points, command, machine), ``table.md`` and ``plot.png`` into the results folder.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import gc
import json
import logging
import os
import platform
import shlex
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import psutil

from policystore.errors import brief
from policystore.memory import MiB  # noqa: F401  (re-exported: benchmarks take their units from here)

START_ATTEMPTS = 2  # ray.init times out now and then when other jobs saturate the machine
log = logging.getLogger("benchmarks")


def make_parser(name: str, doc: str | None) -> argparse.ArgumentParser:
    """The options every benchmark has; ``doc`` (the module docstring) becomes --help's description."""
    parser = argparse.ArgumentParser(
        prog=f"python -m benchmarks.{name}",
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--quick", action="store_true", help="tiny grid, under a minute on 2 idle cores (the CI smoke test runs it)"
    )
    parser.add_argument(
        "--out", type=Path, default=Path("results") / name, help="results folder (default: %(default)s)"
    )
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG (JSON and table are still written)")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logs on stderr")
    return parser


def int_list(text: str) -> list[int]:
    """argparse type for comma-separated integers: ``--workers 1,2,4``."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    import numpy
    import ray
    import torch

    return {
        "cpus": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "ray": ray.__version__,
        "torch": torch.__version__,
        "numpy": numpy.__version__,
    }


def load_average() -> float:
    """1-minute load average: other jobs on the machine make latencies noisy; every row records it."""
    return round(os.getloadavg()[0], 2)


class Results:
    """Collects a benchmark's rows and writes them out; prints each row as one JSON line as it arrives."""

    def __init__(self, name: str, args: argparse.Namespace, params: dict[str, Any]):
        self.name = name
        self.out: Path = args.out
        self.plot = not args.no_plot
        self.params = params
        self.rows: list[dict[str, Any]] = []
        self.skipped: list[dict[str, Any]] = []
        self.started = dt.datetime.now().astimezone()
        (self.out / "rows.jsonl").unlink(missing_ok=True)
        # stdout carries the JSON rows and nothing else: Ray prints raylet warnings to sys.stdout, so everything
        # else printed from now on goes to stderr
        self._rows_stream, sys.stdout = sys.stdout, sys.stderr

    def emit(self, row: dict[str, Any]) -> dict[str, Any]:
        row = {"benchmark": self.name, **row, "loadavg_1m": load_average()}
        self.rows.append(row)
        line = json.dumps(row)
        print(line, file=self._rows_stream, flush=True)
        self.out.mkdir(parents=True, exist_ok=True)
        with open(self.out / "rows.jsonl", "a") as f:  # survives an interrupted run
            f.write(line + "\n")
        return row

    def skip(self, point: dict[str, Any], reason: str) -> None:
        """A grid point that was not measured, and why (kept in results.json and the table)."""
        log.warning("skipping %s: %s", point, reason)
        self.skipped.append({**point, "reason": reason})

    def finish(
        self,
        columns: Sequence[str],
        plot: Callable[[list[dict[str, Any]], Path], None] | None = None,
        notes: Sequence[str] = (),
    ) -> Path:
        """Write results.json, table.md (``columns`` of every row) and plot.png; returns the folder."""
        sys.stdout = self._rows_stream
        self.out.mkdir(parents=True, exist_ok=True)
        record = {
            "benchmark": self.name,
            "command": " ".join(["python -m", f"benchmarks.{self.name}", *map(shlex.quote, sys.argv[1:])]),
            "started": self.started.isoformat(timespec="seconds"),
            "finished": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
            "machine": machine(),
            "params": self.params,
            "rows": self.rows,
            "skipped": self.skipped,
            "notes": list(notes),
        }
        (self.out / "results.json").write_text(json.dumps(record, indent=1, default=str) + "\n")
        (self.out / "table.md").write_text(markdown(record, columns))
        if plot is not None and self.plot and self.rows:
            import matplotlib

            matplotlib.use("Agg")
            plot(self.rows, self.out / "plot.png")
        log.info("results in %s", self.out)
        return self.out


def markdown(record: dict[str, Any], columns: Sequence[str]) -> str:
    """The rows as a markdown table, headed by the command and the machine, followed by the skipped points."""
    m = record["machine"]
    lines = [
        f"`{record['command']}`  ",
        f"{record['started'][:10]}, {m['cpus']} cores, {m['memory_gib']} GiB, ray {m['ray']}, torch {m['torch']}",
        "",
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
    ]
    for row in record["rows"]:
        lines.append("| " + " | ".join(_cell(row.get(c)) for c in columns) + " |")
    if record["skipped"]:
        lines += ["", "Skipped points:", ""]
        lines += [f"- {json.dumps(s)}" for s in record["skipped"]]
    for note in record["notes"]:
        lines += ["", note]
    return "\n".join(lines) + "\n"


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return "" if value is None else str(value)


def progress():
    """A rich progress bar on stderr (stdout carries only JSON rows)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=False,
    )


def percentiles(samples_s: Sequence[float], scale: float = 1e3) -> dict[str, float]:
    """p50/p99/min/mean of durations in seconds, scaled (ms by default)."""
    ordered = sorted(samples_s)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {
        "p50": statistics.median(ordered) * scale,
        "p99": p99 * scale,
        "min": ordered[0] * scale,
        "mean": statistics.fmean(ordered) * scale,
    }


clock = time.perf_counter  # what every timed sample reads


def timed(fn: Callable[[], Any], repeats: int, warmup: int = 1) -> list[float]:
    """Wall-clock durations of ``repeats`` calls of ``fn`` after ``warmup`` unmeasured ones."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


@contextlib.contextmanager
def ray_session(object_store_bytes: int, num_cpus: int | None = None) -> Iterator[Path]:
    """A fresh local Ray session and a spill folder for its store, both gone afterwards.

    Yields the spill folder (pass it as ``StoreConfig.spill_dir``). Worker output is not forwarded, so stdout
    stays JSON.
    """
    import ray

    from policystore import leftovers

    if ray.is_initialized():
        raise RuntimeError("benchmarks start their own Ray session; call them without one running")
    # a SIGTERM (kill, a CI timeout) unwinds through the finally below: Ray shut down, spill folder removed
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    spill = Path(tempfile.mkdtemp(prefix="policystore-bench-"))
    try:
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                ray.init(
                    address="local",  # never attach to another cluster on this machine (other jobs, `ray start`)
                    num_cpus=num_cpus or os.cpu_count(),
                    object_store_memory=int(object_store_bytes),
                    include_dashboard=False,
                    log_to_driver=False,
                    logging_level=logging.WARNING,
                )
                break
            except Exception as exc:  # "node timed out during startup": a busy shared machine; try once more
                ray.shutdown()
                if attempt == START_ATTEMPTS:
                    raise
                log.warning("Ray did not start (%s); retrying", brief(exc))
        yield spill
    finally:
        # also removes the staging files of the session's workers, which Ray kills rather than lets end
        leftovers.shutdown_ray()
        shutil.rmtree(spill, ignore_errors=True)


def object_store_used_bytes() -> int:
    """Bytes of live objects in this node's object store, as Ray's plasma store counts them."""
    import ray
    from ray._private.internal_api import get_memory_info_reply, get_state_from_address

    reply = get_memory_info_reply(get_state_from_address(ray.get_runtime_context().gcs_address))
    return int(reply.store_stats.object_store_bytes_used)


def pss_breakdown_bytes(processes: Sequence[psutil.Process]) -> dict[str, int]:
    """PSS split into anonymous (private heaps), shmem (the object store's pages) and file (code) parts.

    Complements ``policystore.memory.pss_bytes`` (the total): says whether growth is private copies or shared
    pages. Reads /proc/<pid>/smaps_rollup (Linux); empty where it is missing.
    """
    totals = {"anon": 0, "shmem": 0, "file": 0}
    for proc in processes:
        try:
            with open(f"/proc/{proc.pid}/smaps_rollup") as f:
                for line in f:
                    key, value, *_ = line.split()
                    part = {"Pss_Anon:": "anon", "Pss_Shmem:": "shmem", "Pss_File:": "file"}.get(key)
                    if part:
                        totals[part] += int(value) * 1024
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return totals


def collect_garbage(settle_s: float) -> None:
    """gc.collect() in every Ray worker and here, then wait ``settle_s`` for frees and page accounting."""
    from ray._private.internal_api import global_gc

    global_gc()
    gc.collect()
    time.sleep(settle_s)


def wait_not_pushed(store: Any, policy_id: str, timeout_s: float = 60.0) -> None:
    """Wait until no pushed ref to ``policy_id`` is left in this process (its eviction's push has arrived), so
    that the next ``store.get`` of it is a real restore, not a read of the ref the process still held."""
    deadline = time.monotonic() + timeout_s
    while any(sid.policy_id == policy_id for sid in store.push_state().hot):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{policy_id!r} is still hot after {timeout_s} s: the hot tier holds more than one "
                               "of the snapshots read in turn, so the restore case would measure no restore")
        time.sleep(0.005)


def wait_pushed(store: Any, policy_id: str, version: int, timeout_s: float = 60.0) -> bool:
    """Wait until the store's push of ``version`` of ``policy_id`` (latest, with its ref) has reached this process,
    the state a reader's update of a played policy starts from; False if it did not within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = store.push_state()
        if state.fresh and state.latest.get(policy_id) == version and (policy_id, version) in state.hot:
            return True
        time.sleep(0.002)
    return False

"""What ended Ray sessions leave behind. Default spill folders: ``<temp>/policystore-spill/<session>/`` holds a
session's node spill folders and catalog database when ``StoreConfig.spill_dir`` is None, and nothing in it is of
use once the session is gone (a new session numbers its league anew). A store that starts on a node removes the
folders of this node's ended sessions (``sweep``); a folder the user named (``spill_dir``) is never touched. A
driver that started its own Ray ends it with ``shutdown_ray``, which also removes what that session's killed
workers could not (their staging files, ``staging.py``) and the session's default spill folder.

A session counts as ended when no process on this machine names it on its command line (Ray's GCS and raylet
carry ``--session-name``): a signal no crash can leave stale, and one that needs nothing from the session's own
processes, which are killed rather than shut down when a cluster stops.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import psutil
import ray

from . import memory, session, staging
from .config import StoreConfig

log = logging.getLogger(__name__)

SESSION = re.compile(r"session_\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d_\d+_\d+")


def live_sessions() -> set[str]:
    """The Ray session names that processes on this machine carry on their command lines."""
    names: set[str] = set()
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info.get("cmdline") or ()
        if any("session" in arg for arg in cmdline):
            names.update(SESSION.findall(" ".join(cmdline)))
    return names


def sweep(keep: str | None = None) -> list[Path]:
    """Remove this user's default spill folders of ended sessions (never ``keep``, the caller's own); returns them."""
    base = Path(StoreConfig.default_root("x")).parent
    try:
        folders = [entry for entry in base.iterdir() if SESSION.fullmatch(entry.name) and entry.name != keep]
    except FileNotFoundError:
        return []
    folders = [f for f in folders if f.is_dir() and not f.is_symlink() and f.stat().st_uid == os.geteuid()]
    if not folders:
        return []
    live = live_sessions()
    removed = [folder for folder in folders if folder.name not in live]
    for folder in removed:
        shutil.rmtree(folder, ignore_errors=True)
    if removed:
        log.info("removed the spill folders of %d ended Ray sessions under %s", len(removed), base)
    return removed


def shutdown_ray(wait_s: float = 30.0, stop: Callable[[], object] | None = None) -> None:
    """``ray.shutdown()`` for a driver that started Ray itself, leaving nothing of the session behind on this
    machine: waits up to ``wait_s`` for the session's processes to end (Ray kills its workers, which then cannot
    remove their staging files; on a quiet machine they are gone within two seconds, a loaded one may take much
    longer), then removes their staging files and the session's default spill folder. ``stop`` ends the session's
    nodes after ``ray.shutdown()`` where that does not (a ``ray.cluster_utils.Cluster``'s ``shutdown``)."""
    processes = [p for p in memory.session_processes() if p.pid != os.getpid()]
    session.close()
    try:
        ray.shutdown()
    finally:
        if stop is not None:
            stop()
    psutil.wait_procs(processes, timeout=wait_s)
    staging.remove_orphans()
    sweep()

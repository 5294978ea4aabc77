"""How much policystore says: WARNING and above by default; ``POLICYSTORE_LOG_LEVEL=INFO`` (or DEBUG) in a process's
environment turns on more, in that process and in every Ray worker a local cluster started from it inherits (the
commands' ``-v`` sets it). A job on an existing cluster passes it to its workers with
``runtime_env={"env_vars": {"POLICYSTORE_LOG_LEVEL": "INFO"}}``."""

from __future__ import annotations

import logging
import os

ENV = "POLICYSTORE_LOG_LEVEL"


def verbose() -> None:
    """Turn on INFO for this process and the processes it starts (the commands' ``-v``)."""
    os.environ[ENV] = "INFO"
    apply()


def apply() -> None:
    """Follow ``POLICYSTORE_LOG_LEVEL`` in this process (a handler to stderr unless the logger has one)."""
    level = os.environ.get(ENV, "").strip().upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        return
    log = logging.getLogger("policystore")
    log.setLevel(level)
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        log.addHandler(handler)

"""POLICYSTORE_LOG_LEVEL turns on policystore's informational lines in any process that imports the package (a
driver, a Ray worker of a cluster started with it in the environment); without it, only warnings and errors."""

import os
import subprocess
import sys

import pytest

SAY = "import logging, policystore; logging.getLogger('policystore.protect').info('pages mapped read-only')"


@pytest.mark.parametrize(("level", "printed"), [(None, False), ("INFO", True), ("info", True), ("WARNING", False),
                                                ("nonsense", False)])
def test_the_level_follows_the_environment(level, printed):
    env = {k: v for k, v in os.environ.items() if k != "POLICYSTORE_LOG_LEVEL"}
    if level is not None:
        env["POLICYSTORE_LOG_LEVEL"] = level
    result = subprocess.run([sys.executable, "-c", SAY], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    assert ("INFO policystore.protect: pages mapped read-only" in result.stderr) == printed, result.stderr

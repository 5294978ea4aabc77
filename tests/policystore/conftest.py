"""Fixtures of the store's test modules."""

import subprocess

import pytest


@pytest.fixture
def tiny_disk(tmp_path):
    """A real 3 MiB file system: the spill tier hits ENOSPC for real."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)

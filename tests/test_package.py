"""The distribution a user installs: one wheel with one top-level package, whose core imports in a fresh venv that
holds only the core's dependencies, and whose optional parts name the extra to install when it is missing.

The fresh venv gets the core's dependency closure (read from the wheel's own metadata, resolved against this
environment's installed distributions) as links to those distributions' folders, so it takes seconds and no
network; nothing outside the closure (pyarrow, matplotlib, gymnasium, dm-tree, ...) is importable in it.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import policystore

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """``pip wheel . --no-deps`` of a copy of the sources (the build writes build/ and egg-info beside them)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "policystore", src / "policystore", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp / "dist")], check=True, timeout=120)
    (found,) = (tmp / "dist").glob("policystore-*.whl")
    return found


def test_wheel_holds_one_top_level_package_with_license_and_types(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    info = f"policystore-{policystore.__version__}.dist-info"
    top = zipfile.ZipFile(wheel).read(f"{info}/top_level.txt").decode().split()
    assert top == ["policystore"]
    assert {n.split("/")[0] for n in names} == {"policystore", info}
    assert {"policystore/py.typed", f"{info}/licenses/LICENSE", "policystore/trainer/__main__.py",
            "policystore/league/connect4.py", "policystore/rllib/__init__.py"} <= set(names)
    metadata = zipfile.ZipFile(wheel).read(f"{info}/METADATA").decode()
    assert "License-Expression: Apache-2.0" in metadata
    core = [Requirement(line.split(":", 1)[1]) for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    core_names = {canonicalize_name(r.name) for r in core if r.marker is None}
    assert not core_names & {"pyarrow", "matplotlib", "gymnasium", "pettingzoo", "open-spiel"}


def _closure(requirements: list[Requirement]) -> set[str]:
    """The installed distributions that ``requirements`` need, transitively (with the extras they name)."""
    seen: set[tuple[str, str]] = set()
    todo = [(r, "") for r in requirements]
    names: set[str] = set()
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        name = canonicalize_name(req.name)
        if name == "policystore":
            continue
        names.add(name)
        for wanted in ["", *req.extras]:
            if (name, wanted) in seen:
                continue
            seen.add((name, wanted))
            todo += [(Requirement(r), wanted) for r in importlib.metadata.requires(name) or []]
    return names


def _link_distributions(names: set[str], site: Path) -> None:
    """Link each distribution's top-level entries (packages, modules, dist-info, .libs) into ``site``."""
    for name in names:
        dist = importlib.metadata.distribution(name)
        base = Path(dist.locate_file(""))
        for top in {Path(f).parts[0] for f in dist.files or []} - {"..", "__pycache__"}:
            if (base / top).exists() and not (site / top).exists() and not top.endswith(".pth"):
                (site / top).symlink_to(base / top)


def test_core_imports_in_a_venv_with_only_the_core_installed(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               check=True, capture_output=True, text=True).stdout.strip())
    requires = zipfile.ZipFile(wheel).read(f"policystore-{policystore.__version__}.dist-info/METADATA").decode()
    core = [Requirement(line.split(":", 1)[1]) for line in requires.splitlines() if line.startswith("Requires-Dist:")]
    _link_distributions(_closure(core), site)
    # --ignore-installed: pip --python runs from this venv's site-packages, where the editable policystore is
    # already installed at the same version (pip would then skip the wheel and install nothing)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q",
                    "--ignore-installed", str(wheel)], check=True, timeout=120)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    check = """
import importlib, sys
import policystore
assert policystore.__file__.startswith(sys.prefix), policystore.__file__  # the wheel's copy, not the sources
import policystore.client, policystore.cli, policystore.reader
for absent in ("pyarrow", "matplotlib", "gymnasium", "tree", "pettingzoo", "pyspiel"):
    try:
        importlib.import_module(absent)
    except ImportError:
        continue
    raise AssertionError(f"{absent} is importable: the venv is not core-only")
for part, extra in (("policystore.rllib", "rllib"), ("policystore.trainer", "trainer"),
                    ("policystore.workers", "trainer")):
    try:
        importlib.import_module(part)
    except policystore.MissingExtraError as exc:
        assert f"pip install 'policystore[{extra}]'" in str(exc), exc
    else:
        raise AssertionError(f"{part} imported without its extra")
from policystore.durable import DurableTier
try:
    DurableTier.open("s3://bucket/league")
except policystore.MissingExtraError as exc:
    assert "policystore[durable]" in str(exc), exc
else:
    raise AssertionError("a durable tier was opened without pyarrow")
try:
    policystore.StoreConfig(durable_uri="s3://bucket/league")
except policystore.MissingExtraError as exc:
    assert "policystore[durable]" in str(exc), exc
else:
    raise AssertionError("a durable tier was configured without pyarrow")
print(policystore.__version__)
"""
    out = subprocess.run([str(python), "-c", check], env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == policystore.__version__
    # the trainer's command without its extra: one line naming the extra and exit 2, no traceback
    run = subprocess.run([str(python), "-m", "policystore.trainer", "--run-dir", str(tmp_path / "run")], env=env,
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    assert run.stderr.count("\n") == 1 and "pip install 'policystore[trainer]'" in run.stderr, run.stderr
    assert not (tmp_path / "run").exists()
    cli = subprocess.run([str(venv / "bin" / "policystore"), "--help"], env=env, cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert cli.returncode == 0 and "usage: policystore" in cli.stdout, cli.stderr

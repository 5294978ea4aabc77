"""The import arrows between the repository's packages run one way, and no import cycle exists anywhere.

Layers, bottom up (a package may import only those listed for it; see docs/architecture.md):

    policystore           the per-node snapshot store (the package less the four subpackages below)
    policystore.rllib     the RLlib adapter, on top of the store
    policystore.league    games, the policy net, GAE and the league's rules: pure, never Ray nor the store
    policystore.workers   rollout clients: the store and the rules, never the trainer
    policystore.trainer   the driver: league actor, learner shards, display, report
    examples              outside the wheel: scripts that use the store (and its RLlib adapter)
    benchmarks            outside the wheel, on top: they measure the store, the trainer and the examples

Every import statement counts, those inside functions too (a lazy import still ties two modules together).
Tests may import any package but neither benchmarks nor other test modules: what tests share lives in
conftest.py fixtures or a helper module. One benchmark module is shared with the tests: ``benchmarks.s3gate``, the
switchable proxy before a loopback S3 server that injects the durable tier's faults in both.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("policystore", "benchmarks", "examples")
LEAGUE, WORKERS, TRAINER = "policystore.league", "policystore.workers", "policystore.trainer"
SUBLAYERS = ("policystore.rllib", LEAGUE, WORKERS, TRAINER)
ALLOWED: dict[str, set[str]] = {
    "policystore": set(),
    "policystore.rllib": {"policystore"},
    LEAGUE: set(),
    WORKERS: {"policystore", LEAGUE},
    TRAINER: {"policystore", LEAGUE, WORKERS},
    "examples": {"policystore", "policystore.rllib", LEAGUE, WORKERS, TRAINER},
    "benchmarks": {"policystore", "policystore.rllib", LEAGUE, WORKERS, TRAINER, "examples"},
}
RAY_FREE = (LEAGUE,)
# benchmark modules the tests may import: the S3 gate (a fixture), and the cluster model (its simulation is
# arithmetic that the docs' figures rest on, tested like library code)
SHARED_WITH_TESTS = {"benchmarks.s3gate", "benchmarks.cluster_model"}


def module_name(path: Path) -> str:
    """``policystore/league/model.py`` -> ``policystore.league.model``; ``__init__.py`` -> the package."""
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[0] == "tests":
        return "tests." + ".".join(parts[1:])
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_files() -> dict[str, Path]:
    files = {}
    for top in (*PACKAGES, "tests"):
        for path in sorted((ROOT / top).rglob("*.py")):
            files[module_name(path)] = path
    return files


FILES = source_files()
# pytest imports a test folder's files by their own names (the folders have no __init__.py): a file's name is what
# another test module would import it by
TEST_MODULES = {name.rpartition(".")[2]: name for name in FILES if name.startswith("tests.")}


def resolve(name: str) -> str | None:
    """The repository module an imported dotted name lands in (its longest existing prefix), else None."""
    top = name.split(".")[0]
    if top in TEST_MODULES:
        return TEST_MODULES[top]
    if top not in PACKAGES:
        return None
    parts = name.split(".")
    while parts and ".".join(parts) not in FILES:
        parts.pop()
    return ".".join(parts) or None


def imports_of(module: str, path: Path) -> dict[str, set[str]]:
    """Repository modules ``module`` imports -> the line numbers, plus third-party top-level names under ``""``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: dict[str, set[str]] = {}

    def add(name: str, line: int) -> None:
        target = resolve(name)
        key = target if target is not None else "external:" + name.split(".")[0]
        if target != module:
            found.setdefault(key, set()).add(f"{path.relative_to(ROOT)}:{line}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the current package, up level - 1
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            for alias in node.names:  # `from pkg import submodule` imports the submodule
                add(f"{prefix}.{alias.name}" if f"{prefix}.{alias.name}" in FILES else prefix, node.lineno)
    return found


GRAPH = {module: imports_of(module, path) for module, path in FILES.items()}


def layer(module: str) -> str:
    if module.startswith("tests."):
        return "tests"
    for sub in SUBLAYERS:
        if module == sub or module.startswith(sub + "."):
            return sub
    return module.split(".")[0]


def violations(allowed_of) -> list[str]:
    out = []
    for module, targets in GRAPH.items():
        for target, where in targets.items():
            if target.startswith("external:"):
                continue
            if layer(target) != layer(module) and layer(target) not in allowed_of(layer(module)):
                where_text = ", ".join(sorted(where))
                out.append(f"{layer(module)} -> {layer(target)}: {module} imports {target} ({where_text})")
    return out


def test_packages_import_only_the_layers_below_them():
    assert [v for v in violations(lambda lay: ALLOWED.get(lay, set())) if not v.startswith("tests ->")] == []


def test_tests_import_neither_benchmarks_nor_other_test_modules():
    others = {layer(m) for m in GRAPH} - {"benchmarks", "tests"}
    bad = [v for v in violations(lambda lay: others if lay == "tests" else ALLOWED[lay]) if v.startswith("tests ->")
           and v.split(" imports ")[1].split(" (")[0] not in SHARED_WITH_TESTS]
    for module, targets in GRAPH.items():
        if module.startswith("tests."):
            bad += [f"{module} imports test module {t} ({', '.join(sorted(w))})" for t, w in targets.items()
                    if t.startswith("tests.") and t.split(".")[-1].startswith(("test_", "conftest"))]
    assert bad == []


@pytest.mark.parametrize("package", RAY_FREE)
def test_rules_package_never_imports_ray(package):
    uses = [w for m, targets in GRAPH.items() if layer(m) == package
            for t, w in targets.items() if t == "external:ray"]
    assert uses == []


def test_rules_package_imports_without_ray_or_the_store():
    """Not only no direct import: importing all of ``policystore.league`` loads neither Ray nor anything that starts
    it, nor any part of the store (the rules do not depend on how weights are held)."""
    modules = sorted(m for m in FILES if layer(m) == LEAGUE)
    # the package's own __init__ (names, errors, config: Ray-free) loads with any subpackage; nothing more may
    code = (f"import sys, policystore; before = set(sys.modules); import {', '.join(modules)}; "
            "print(sorted(m for m in set(sys.modules) - before if m.split('.')[0] == 'ray' "
            f"or m.startswith('policystore.') and not m.startswith('{LEAGUE}')))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"


def test_the_client_imports_neither_the_store_nor_the_catalog():
    """A rollout worker's handle names remote methods by string (``policystore.remote``): it never loads the store's
    or the catalog's code (``policystore.launch`` does, only to start one that is missing)."""
    assert {"policystore.server", "policystore.catalog"} & set(GRAPH["policystore.client"]) == set()
    code = "import sys, policystore.client; print(sorted(m for m in sys.modules if m in ('policystore.server', " \
           "'policystore.catalog', 'policystore.launch')))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"


def test_a_reader_of_raw_bytes_never_loads_torch():
    """A process that follows the league and reads a snapshot's raw bytes and meta (a watcher, a non-torch
    consumer) loads no torch: importing it costs a Ray worker more private memory than everything else it holds.
    The first tensor access does load it."""
    code = ("import sys, numpy as np, policystore, policystore.client, policystore.watch\n"
            "from policystore.format import pack\n"
            "from policystore.ids import SnapshotId\n"
            "from policystore.snapshot import Snapshot\n"
            "buf = pack({'w': np.arange(6, dtype=np.float32)}, policy_id='p', meta={'step': 3})\n"
            "snap = Snapshot(SnapshotId('p', 1), buf)\n"
            "assert snap.meta == {'step': 3} and list(snap) == ['w'] and snap.buffer.nbytes == snap.nbytes\n"
            "print('torch' in sys.modules, end=' ')\n"
            "assert snap['w'].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]\n"
            "print('torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "False True"


def test_only_the_store_touches_torch_internals():
    """``torch._C`` (e.g. turning the views' write guard off) belongs to policystore; others use its public API
    (``policystore.views.fast_reads``)."""
    found = []
    for module, path in FILES.items():
        if layer(module) in ("policystore", "policystore.rllib"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "_C" and isinstance(node.value, ast.Name) \
                    and node.value.id == "torch":
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch._C"):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:  # recursion depth is bounded by the module count (a few hundred)
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_between_modules():
    graph = {m: {t for t in targets if not t.startswith("external:")} for m, targets in GRAPH.items()}
    assert cycles(graph) == []


def test_no_import_cycle_between_packages():
    graph: dict[str, set[str]] = {}
    for module, targets in GRAPH.items():
        graph.setdefault(layer(module), set()).update(
            layer(t) for t in targets if not t.startswith("external:") and layer(t) != layer(module))
    assert cycles(graph) == []


def test_the_checker_sees_cycles_and_upward_arrows():
    """The checks above would fail on a violation: a cycle is found, and the layers are read from real code."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert f"{LEAGUE}.model" in GRAPH[f"{LEAGUE}.vecgame"]                   # an import at module level
    assert f"{WORKERS}.play" in GRAPH[f"{TRAINER}.evaluate"]                 # an arrow that is allowed
    assert layer("policystore.rllib.callback") == "policystore.rllib" and layer("tests.conftest") == "tests"
    assert layer(f"{TRAINER}.run") == TRAINER and layer("policystore.client") == "policystore"

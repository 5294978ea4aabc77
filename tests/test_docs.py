"""The docs as a user reads them: every public name in the API reference once, links that lead somewhere, no lab
notebook on the reference pages, and every command on the tutorial and how-to pages as it would run.

Commands are taken from the pages themselves (``bash`` blocks, and inline code that starts with ``python -m``,
``python examples/`` or ``policystore``), so a renamed module, a dropped flag or a moved script fails here. Each
one's arguments are parsed by the real command's own parser, all in one process (seconds, not a Ray start per
command); a command that needs minutes of work (training, an evaluation, a benchmark, the suite) must say on its
page how long it takes; a quick one that needs neither a cluster nor a run folder is run as written.
The Sphinx build (``.ci/run``) checks the docs' own links and the API reference against the package; this file
checks what it does not see: the README, the commands, and the rules a results page exempts.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"

# What a reference page never says: it says what is true now (results pages are where dated runs go).
NARRATIVE = re.compile(r"not shown|this session|this round|(fourth|fifth|sixth) session|today's default")
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
# How a page says how long a command takes.
DURATION = re.compile(r"\b\d+(\.\d+)?\s*(ms|s|min|minutes?|seconds?|h|hours?)\b|\bseconds\b|\ba minute\b|"
                      r"--minutes\b|--quick\b|\binteractive\b|in the terminal")
# What a command needs that a test cannot give it: a trained run, a cluster, a placeholder to fill in.
NEEDS_STATE = re.compile(r"runs/quickstart|--address|--dir\b|\bR\b|\bPATH\b|\bHEAD_IP\b|<[a-z_]+>")
# Commands of the project (the rest, pip, ray, git, are other tools' business).
OURS = re.compile(r"^(python -m (policystore|benchmarks|examples)\S*|python examples/\S+\.py|policystore)(\s|$)")


def md_pages() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def pages_of_kind(*captions: str) -> list[Path]:
    """The pages docs/index.md lists under these captions (the index is where each page's kind is decided)."""
    index = (DOCS / "index.md").read_text()
    pages = []
    for caption, body in re.findall(r"```\{toctree\}\n:caption: (.+?)\n(.*?)```", index, re.S):
        if caption in captions:
            pages += [DOCS / f"{line.strip()}.md" for line in body.splitlines() if line.strip() and ":" not in line]
    return pages


def slug(heading: str) -> str:
    """GitHub's (and MyST's) anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_page_is_in_the_index_under_one_kind():
    listed = pages_of_kind("Tutorial", "How-to", "Reference", "Explanation", "Results")
    assert len(listed) == len(set(listed))
    assert sorted(listed) == sorted(p for p in DOCS.rglob("*.md") if p.name != "index.md")


def test_links_lead_to_a_file_and_heading_that_exist():
    bad = []
    for page in md_pages():
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path) if path else page
            if not file.exists():
                bad.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and file.suffix == ".md":
                headings = {slug(h) for h in re.findall(r"(?m)^#+ (.*)$", file.read_text())}
                if anchor not in headings:
                    bad.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert bad == []


def test_reference_pages_carry_no_session_narrative_or_dates():
    """Dated runs and experiment logs belong on docs/results/; everything else says what is true now."""
    bad = []
    for page in md_pages():
        if page.parent.name == "results":
            continue
        for number, line in enumerate(page.read_text().splitlines(), 1):
            words = re.sub(r"\]\([^)]*\)", "]", line)  # a link's target may name a results entry by its date
            if NARRATIVE.search(words) or DATE.search(words):
                bad.append(f"{page.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert bad == []


def test_results_pages_say_how_their_rows_are_written_and_keep_the_newest_first():
    for page in (DOCS / "results").glob("*.md"):
        text = page.read_text()
        assert "**How rows are written.**" in text, page
        dated = [(heading, max(DATE.findall(heading))) for heading in re.findall(r"(?m)^## (.*)$", text)
                 if DATE.search(heading)]
        late = [heading for (_, before), (heading, date) in zip(dated, dated[1:], strict=False)
                if date > before]
        assert late == [], f"{page.name}: entries newer than the one above them"


def test_the_api_reference_documents_every_public_name_and_error_once():
    import policystore
    from policystore import errors

    api = (DOCS / "api.md").read_text()
    documented = re.findall(r"^\.\. auto(?:function|class|exception):: policystore\.(\w+)(?:\(\))?$", api, re.M)
    public = set(policystore.__all__) | {name for name, obj in vars(errors).items()
                                         if isinstance(obj, type) and issubclass(obj, errors.PolicyStoreError)}
    assert sorted(n for n in documented if documented.count(n) > 1) == []
    assert sorted(public - set(documented)) == [], "add `.. autoexception:: policystore.<name>` to docs/api.md"
    assert sorted(set(documented) - public) == []


@dataclass(frozen=True)
class Command:
    page: Path
    line: int
    text: str  # the command as a user types it
    context: str  # its comment, or the sentence around an inline one: where a page says how long it takes

    def argv(self) -> list[str]:
        return shlex.split(self.text)

    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}: {self.text}"


def module_and_args(command: Command | str) -> tuple[str, list[str]]:
    """(module, arguments), where a script (`python examples/x.py`) is its path: it runs as a script, with its own
    folder first on sys.path and not the clone's root, as `python examples/x.py` does."""
    argv = shlex.split(command) if isinstance(command, str) else command.argv()
    if argv[0] == "policystore":
        return "policystore", argv[1:]
    if argv[1] == "-m":
        return argv[2], argv[3:]
    return argv[1], argv[2:]


def commands(page: Path, inline: bool = True, tables: bool = False) -> list[Command]:
    """The project's commands on a page: lines of bash blocks (a trailing comment is their context) and, with
    ``inline``, inline code spans (the paragraph they sit in is theirs; an explanation page names commands in
    passing, `policystore --dir`, without giving them to type)."""
    text = page.read_text()
    found = []
    for block in re.finditer(r"```(?:bash|sh|console)\n(.*?)```", text, re.S):
        first = text[:block.start(1)].count("\n") + 1
        for offset, raw in enumerate(block[1].replace("\\\n", " ").splitlines()):
            code, _, comment = raw.partition("  #")
            if OURS.match(code.strip()):
                found.append(Command(page, first + offset, code.strip(), comment))
            elif not code.strip() and comment and found and found[-1].line == first + offset - 1:
                last = found.pop()  # a comment on the next line goes on with the command's own
                found.append(Command(page, last.line + 1, last.text, last.context + " " + comment))
    if not inline:
        return found
    # prose: no code blocks, and no table rows (where a command is named as what a test runs, not given to type)
    prose = re.sub(r"```.*?```", lambda m: "\n" * m[0].count("\n"), text, flags=re.S)
    if not tables:
        prose = re.sub(r"(?m)^\|.*$", "", prose)
    for paragraph in re.finditer(r"(?:[^\n]+\n?)+", prose):
        for span in re.finditer(r"`([^`]+)`", paragraph[0]):
            code = span[1].strip()
            # `policystore ls|stats` is shorthand and a bare `python -m policystore.trainer` a name: no commands
            if OURS.match(code) and not re.search(r"[|<>]", code) and len(module_and_args(code)[1]) > 0:
                line = prose[:paragraph.start() + span.start()].count("\n") + 1
                found.append(Command(page, line, code, paragraph[0]))
    return found


HOWTO = [README, *pages_of_kind("Tutorial", "How-to")]
COMMANDS = [c for page in HOWTO for c in commands(page)]  # to follow: each runs, or says how long it takes
NAMED = COMMANDS + [c for page in md_pages() if page not in HOWTO and page.parent.name != "results"
                   for c in commands(page, inline=False)]  # each parses as written
NAMED += [c for c in commands(DOCS / "cli.md", tables=True) if c not in NAMED]  # the CLI reference's examples


# Runs each command's module as `python -m` would, up to its parser: argparse parses the command's arguments for
# real and then stops the run, so nothing trains, starts Ray or touches a file.
PARSE_ONLY = r"""
import argparse, json, os, runpy, sys

class Parsed(BaseException):
    pass

for name in ("parse_args", "parse_known_args"):
    real = getattr(argparse.ArgumentParser, name)
    def stop(self, args=None, namespace=None, _real=real):
        _real(self, args, namespace)
        raise Parsed
    setattr(argparse.ArgumentParser, name, stop)

results = []
root, path = os.getcwd(), list(sys.path)
for module, args in json.loads(sys.argv[1]):
    sys.argv = [module, *args]
    script = module.endswith(".py")
    if script:  # python examples/x.py: its folder on sys.path, not the root a `-m` run would add
        sys.path[:] = [os.path.dirname(os.path.abspath(module))] + [p for p in path if os.path.abspath(p) != root]
        for name in [m for m in sys.modules if m == "examples" or m.startswith("examples.")]:
            del sys.modules[name]
    try:
        if script:
            runpy.run_path(module, run_name="__main__")
        else:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        results.append("ran without parsing its arguments")
    except Parsed:
        results.append("")
    except SystemExit as exc:  # argparse's usage error (2), or --help (0)
        results.append("" if exc.code in (0, None) else f"exit {exc.code}")
    except BaseException as exc:
        results.append(f"{type(exc).__name__}: {exc}")
    sys.path[:] = path
print(json.dumps(results))
"""


def test_every_command_parses_as_written():
    """On every page but the results (whose rows keep the command as it was run)."""
    targets = [module_and_args(c) for c in NAMED]
    assert len(targets) > 20  # the extraction still finds the pages' commands
    proc = subprocess.run([sys.executable, "-c", PARSE_ONLY, json.dumps(targets)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    bad = [f"{c.where()} -> {why}" for c, why in zip(NAMED, results, strict=True) if why]
    assert bad == [], proc.stderr[-3000:]


def is_long(command: Command) -> bool:
    """Minutes of work: training, evaluating, a benchmark, an example job, the suite (not their --help)."""
    module, args = module_and_args(command)
    return "--help" not in args and not module.startswith("policystore.cli") and module != "policystore"


def test_long_commands_say_how_long_they_take():
    bad = [c.where() for c in COMMANDS if is_long(c) and not DURATION.search(c.context + " " + c.text)]
    assert bad == []


def needs_state(command: Command) -> bool:
    """A trained run, a cluster (every `policystore` command but --help reads one, or a folder), a placeholder."""
    module, args = module_and_args(command)
    return bool(NEEDS_STATE.search(command.text)) or (module == "policystore" and "--help" not in args)


QUICK = [c for c in COMMANDS if not is_long(c) and not needs_state(c)]


@pytest.mark.parametrize("command", QUICK, ids=[c.text for c in QUICK])
def test_quick_commands_run_as_written(command):
    """What needs neither a cluster, a trained run nor minutes: run it, exactly as the page has it."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"  # this venv's `policystore`
    proc = subprocess.run(command.text, shell=True, cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PATH": path})
    assert proc.returncode == 0, f"{command.where()}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"


def test_trainer_page_is_a_reference_not_a_notebook():
    assert len((DOCS / "trainer.md").read_text().splitlines()) < 400

"""Sphinx configuration: the Markdown pages (MyST) and the API reference from the docstrings.

Built by CI with warnings as errors (``python -m sphinx -W --keep-going -n docs docs/_build``), so a page that
links to a missing page or heading, or documents a name the package no longer has, fails the build.
"""

import inspect
import re
import sys
from pathlib import Path

from pygments.lexers.special import TextLexer
from sphinx.highlighting import lexers

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import policystore  # noqa: E402

project = "policystore"
release = getattr(policystore, "__version__", "")
extensions = ["myst_parser", "sphinx.ext.autodoc"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

# Links like [cluster.md](cluster.md#learners-that-publish-big-snapshots) resolve to the heading's anchor, and a
# link to a heading that does not exist is a warning (an error in CI).
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence"]

# A cross-reference that resolves to nothing is a warning; type hints from outside the package are not ours to
# document (no network in CI for intersphinx), so they are not checked.
nitpicky = True
# Internal types that show in public signatures (``policystore.wire.QuarantineRecord``) are named by module; the
# public names (``policystore.connect``) are still checked.
nitpick_ignore_regex = [
    (r"py:.*", r"(torch|nn|ray|numpy|np|pyarrow|gymnasium|os|collections|typing|pathlib|concurrent|threading)(\..*)?"),
    (r"py:.*", r"(Path|Callable|Iterator|Iterable|Mapping|Sequence|Any|Module|Tensor|ObjectRef|ActorHandle)"),
    (r"py:.*", r"policystore\.[a-z_]+\.[A-Za-z_.]+"),
]
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_typehints_format = "fully-qualified"

html_theme = "alabaster"

# The architecture page's diagrams are Mermaid (GitHub draws them); here they show as text.
lexers["mermaid"] = TextLexer()


def _fields(app, what, name, obj, options, lines):
    """Docstrings list their parameters as ``name: what it is`` with indented continuation lines (as ``help()``
    shows them); as an rST definition list (the name as code, the text indented under it) they render as one
    instead of failing the build."""
    try:
        names = set(inspect.signature(obj).parameters)
    except (TypeError, ValueError):
        return
    out = []
    for line in lines:
        match = _FIELD.match(line)
        out += [f"``{match[1]}``", f"    {match[2]}"] if match and match[1] in names else [line]
    lines[:] = out


_FIELD = re.compile(r"^([a-z][a-z0-9_]*): (.*)$")


def setup(app):
    app.connect("autodoc-process-docstring", _fields)
html_title = "policystore"

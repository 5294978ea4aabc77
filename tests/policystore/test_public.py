"""The package's public names are declared once: ``__all__`` follows from the eager imports, the lazy table and
errors.py, and the imports a type checker reads (under TYPE_CHECKING) say exactly what the lazy table says."""

import ast
import importlib
from pathlib import Path

import policystore
from policystore import errors


def test_every_public_name_resolves_to_what_its_module_defines():
    for name in policystore.__all__:
        obj = getattr(policystore, name)
        module = policystore._LAZY.get(name)
        if module is not None:
            assert obj is getattr(importlib.import_module(f"policystore.{module}"), name)
    assert len(policystore.__all__) == len(set(policystore.__all__))
    assert {n for n, c in vars(errors).items() if isinstance(c, type) and issubclass(c, errors.PolicyStoreError)} \
        <= set(policystore.__all__)


def test_the_type_checkers_imports_match_the_lazy_table():
    tree = ast.parse(Path(policystore.__file__).read_text())
    [block] = [n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING"]
    declared = {alias.name: node.module for node in block.body for alias in node.names}
    assert declared == dict(policystore._LAZY)

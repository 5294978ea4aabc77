"""The optional parts of policystore and the extra each needs: importing a part without its extra raises one
``MissingExtraError`` that says what to install, instead of a ``No module named ...`` from deep inside a
dependency.

    with needs("rllib", "policystore.rllib"):
        import ray.rllib

A command run as ``python -m <part>`` (``python -m policystore.trainer``) whose extra is missing prints that error
as one line and exits 2, as for any other usage error, instead of a traceback through Python's module runner.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from .errors import MissingExtraError


@contextmanager
def needs(extra: str, part: str) -> Iterator[None]:
    """Turn an ImportError of a third-party module inside the block into MissingExtraError naming ``extra``
    (errors of policystore's own modules pass through: they are bugs, not a missing install)."""
    try:
        yield
    except ImportError as exc:
        if (exc.name or "").split(".")[0] == "policystore":
            raise
        error = missing_extra(extra, part, exc)
        command = _command_being_started()
        if command is not None and (command + ".").startswith(part + "."):
            print(f"python -m {command}: error: {error}", file=sys.stderr)
            raise SystemExit(EXIT_USAGE) from None
        raise error from exc


EXIT_USAGE = 2


def _command_being_started() -> str | None:
    """The module of ``python -m MODULE`` while Python still imports its packages, before the module runs
    (``sys.argv[0]`` is ``-m`` until then); None otherwise, and in every process that merely imports a part."""
    if sys.argv[:1] != ["-m"] or "-m" not in sys.orig_argv[:-1]:
        return None
    return sys.orig_argv[sys.orig_argv.index("-m") + 1]


def missing_extra(extra: str, part: str, exc: ImportError) -> MissingExtraError:
    """The error for ``part`` used without ``extra`` (``exc``: the import that failed)."""
    return MissingExtraError(f"{part} needs the {extra} extra: pip install 'policystore[{extra}]' ({exc})",
                             name=exc.name)

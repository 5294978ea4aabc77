"""The optional parts of policystore and the extra each needs: importing a part without its extra raises one
``MissingExtraError`` that says what to install, instead of a ``No module named ...`` from deep inside a
dependency.

    with needs("rllib", "policystore.rllib"):
        import ray.rllib
"""

from __future__ import annotations

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
        raise missing_extra(extra, part, exc) from exc


def missing_extra(extra: str, part: str, exc: ImportError) -> MissingExtraError:
    """The error for ``part`` used without ``extra`` (``exc``: the import that failed)."""
    return MissingExtraError(f"{part} needs the {extra} extra: pip install 'policystore[{extra}]' ({exc})",
                             name=exc.name)

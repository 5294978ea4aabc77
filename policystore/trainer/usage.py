"""The trainer's commands (``python -m policystore.trainer``, ``.evaluate``, ``.play``) turn bad input into one line
on stderr and exit status 2, like argparse's own usage errors, and say it before Ray or any long work starts.

Only the checks run inside ``bad_input``: an error from the work itself keeps its traceback (it is a bug to see,
not a typo to correct).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from policystore.errors import PolicyStoreError

EXIT_USAGE = 2
# what a mistyped name, a wrong folder or a missing extra raises while a command checks its arguments
BAD_INPUT = (ValueError, LookupError, OSError, ImportError, PolicyStoreError)


@contextmanager
def bad_input(prog: str, what: str = "") -> Iterator[None]:
    """Exit 2 with ``prog: error: [what: ]message`` on an error of ``BAD_INPUT`` raised inside the block."""
    try:
        yield
    except BAD_INPUT as exc:
        text = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)  # KeyError quotes its message
        print(f"{prog}: error: {what}{': ' if what else ''}{text}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from None

"""``python -m policystore``: the command line (see ``policystore.cli``)."""

from .cli import main

raise SystemExit(main())

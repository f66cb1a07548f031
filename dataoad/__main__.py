"""``python -m dataoad``: the same program as the ``dataoad`` console script."""

from dataoad._cli import main

raise SystemExit(main())

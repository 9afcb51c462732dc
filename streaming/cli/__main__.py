"""``python -m streaming.cli``: the ``bitroute`` command."""

from streaming.cli.main import main

raise SystemExit(main())

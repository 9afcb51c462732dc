"""The verbs' handlers, grouped by concern: each takes the parsed arguments
(:func:`streaming.cli.parser.build_parser`), calls the library and prints what it
returns; it returns the exit status or raises :mod:`streaming.cli.errors`. Heavy
imports (Spark, Kafka) happen inside the handler that needs them.

- :mod:`~streaming.cli.verbs.installation`: ``version``, ``jars``, ``pack``, ``broker``;
- :mod:`~streaming.cli.verbs.router`: ``run``, ``match``;
- :mod:`~streaming.cli.verbs.messaging`: ``subscribe``, ``unsubscribe``, ``publish``, ``tail``;
- :mod:`~streaming.cli.verbs.audit`: ``audit`` (with ``maintain`` and ``migrate``), ``sql``;
- :mod:`~streaming.cli.verbs.inspection`: ``status``, ``explain``, ``subscriptions``.
"""

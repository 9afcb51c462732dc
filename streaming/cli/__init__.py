"""bitroute's command line. The library (every other package in ``streaming``)
never imports it (``tests/streaming/cli/test_boundary.py``): verbs parse
arguments, call the library, and render what it returns.

- :mod:`~streaming.cli.main`: the ``bitroute`` entry point: parse, dispatch, exit status;
- :mod:`~streaming.cli.parser`: the verbs and their flags (public contracts);
- :mod:`~streaming.cli.verbs`: the verbs' handlers, grouped by concern;
- :mod:`~streaming.cli.errors`, :mod:`~streaming.cli.arguments`,
  :mod:`~streaming.cli.output`: what the handlers share (one-line errors, the
  configuration and headers from the arguments, writing many lines);
- :mod:`~streaming.cli.run`: ``bitroute run``, the router in the foreground;
- :mod:`~streaming.cli.match`: ``bitroute match``, offline matching;
- :mod:`~streaming.cli.render`: every text a verb prints (tables, status lines,
  deliveries, batch and maintenance lines), from the library's data;
- :mod:`~streaming.cli.progress`: ``bitroute run``'s listeners: a line per batch
  on stdout, the progress of a long changelog catch-up on stderr;
- :mod:`~streaming.cli.logs`: logging set up at the command's start (the
  library's loggers on stderr).
"""

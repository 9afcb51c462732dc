"""bitroute's command line. The library (every other package in ``streaming``)
never imports it: verbs parse arguments, call the library and render its results.

- :mod:`~streaming.cli.main`: the ``bitroute`` entry point and its verbs;
- :mod:`~streaming.cli.run`: ``bitroute run``, the router in the foreground;
- :mod:`~streaming.cli.match`: ``bitroute match``, offline matching.
"""

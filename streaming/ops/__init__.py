"""What an operator asks of a router: its status, its metrics, and what it would do.

- :mod:`~streaming.ops.status`: ``bitroute status`` and ``status.json``;
- :mod:`~streaming.ops.metrics`: the router's metrics, declared, and what feeds them
  (its batch reports, its maintenance passes, its query's events);
- :mod:`~streaming.ops.exposition`: declared metrics served to Prometheus
  (``prometheus_client``: samples, text format, HTTP server);
- :mod:`~streaming.ops.query_progress`: the streaming query's events (Spark's
  listener) and the input lag they tell;
- :mod:`~streaming.ops.inspect`: ``explain`` and the subscription listing.
"""

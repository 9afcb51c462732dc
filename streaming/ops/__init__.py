"""What an operator asks of a router: its status, its metrics, and what it would do.

- :mod:`~streaming.ops.status`: ``bitroute status`` and ``status.json``;
- :mod:`~streaming.ops.metrics`: the Prometheus endpoint (``prometheus_client``) and
  what feeds it;
- :mod:`~streaming.ops.inspect`: ``explain`` and the subscription listing.
"""

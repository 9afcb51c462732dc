"""The router: the streaming query and everything one micro-batch passes through.

- :mod:`~streaming.router.service`: :class:`Router`, which opens the query and
  coordinates each batch's steps (snapshot, route, deliver, audit, report);
- :mod:`~streaming.router.feature`: the interface a feature plugs into the batch loop
  through, and :mod:`~streaming.router.features`: the router's features, in order;
- :mod:`~streaming.router.restore`: the audit reopened where the state folder says;
- :mod:`~streaming.router.retained`: MQTT retained messages;
- :mod:`~streaming.router.batch`: the batch pipeline (rows, matching, routing,
  delivery, the rejected topic, the batch report);
- :mod:`~streaming.router.subscriptions`: the subscription changelog read into
  snapshot versions, their store, and the limits a subscription is held to;
- :mod:`~streaming.router.topics`: the publishes topic's lifecycle (retention
  gaps, incarnations);
- :mod:`~streaming.router.replay`: replays of ``subscribe --since``.

The state folder's ownership (checkpoint layout, offset log, lock, lease,
watchdog) is :mod:`streaming.state`; the Spark session is :mod:`streaming.session`.
"""

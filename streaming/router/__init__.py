"""The router: the streaming query and everything one micro-batch passes through.

- :mod:`~streaming.router.service`: :class:`Router`, which opens the query and
  coordinates each batch's steps (subscriptions, route, deliver, audit);
- :mod:`~streaming.router.session`: the Spark session the query runs in;
- :mod:`~streaming.router.changelog`, :mod:`~streaming.router.subscription_sync`:
  the subscription changelog read into versioned snapshots;
- :mod:`~streaming.router.snapshots`: the saved snapshot versions and their pins;
- :mod:`~streaming.router.matching`, :mod:`~streaming.router.routing`: a batch
  matched against its snapshot, on the driver or in the executors' tasks;
- :mod:`~streaming.router.delivery`: the routed copies produced to Kafka;
- :mod:`~streaming.router.offsets_log`: Spark's offset log read back;
- :mod:`~streaming.router.lock`, :mod:`~streaming.router.watchdog`: one router
  per state folder, and its JVM ended with its driver.
"""

"""The router: the streaming query and everything one micro-batch passes through.

- :mod:`~streaming.router.service`: :class:`Router`, which opens the query and
  coordinates each batch's steps (snapshot, route, deliver, audit, report);
- :mod:`~streaming.router.session`: the Spark session the query runs in;
- :mod:`~streaming.router.snapshots`: the one owner of a batch's snapshot
  version (saved versions and their facts, pins, pruning, the live broadcast),
  and the store's read-only view;
- :mod:`~streaming.router.changelog`, :mod:`~streaming.router.subscription_sync`:
  the subscription changelog read into new snapshot versions;
- :mod:`~streaming.router.routing`, :mod:`~streaming.router.matching`: a batch
  matched against its snapshot, on the driver or in the executors' tasks;
- :mod:`~streaming.router.delivery`: the routed copies produced to Kafka;
- :mod:`~streaming.router.report`: each batch's report and its listeners
  (``status.json``, and what callers register);
- :mod:`~streaming.router.checkpoint`: every path under the checkpoint folder;
- :mod:`~streaming.router.offsets_log`: Spark's offset log read back;
- :mod:`~streaming.router.lock`, :mod:`~streaming.router.watchdog`: one router
  per state folder, and its JVM ended with its driver.
"""

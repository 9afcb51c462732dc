"""The state folder and who owns it: the router's checkpoint folder, its lock, its lease.

Below both :mod:`streaming.router` and :mod:`streaming.audit` (neither is imported
here), so the audit's maintenance and migration find the folder and the lock
without importing the router.

- :mod:`~streaming.state.checkpoint`: every path under the checkpoint folder;
- :mod:`~streaming.state.offsets_log`: Spark's offset log read back;
- :mod:`~streaming.state.lock`, :mod:`~streaming.state.watchdog`: one router
  per state folder, and its JVM ended with its driver;
- :mod:`~streaming.state.lease`: one router per publishes topic and warehouse;
- :mod:`~streaming.state.errors`: their exceptions.
"""

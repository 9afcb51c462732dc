"""The batch pipeline: what one micro-batch passes through.

- :mod:`~streaming.router.batch.batch_rows`: a driver batch's own rows;
- :mod:`~streaming.router.batch.routing`, :mod:`~streaming.router.batch.matching`:
  a batch matched against its snapshot, on the driver or in the executors' tasks;
- :mod:`~streaming.router.batch.delivery`: the routed copies produced to Kafka;
- :mod:`~streaming.router.batch.rejected`: bad records to the rejected topic;
- :mod:`~streaming.router.batch.report`: each batch's report and its listeners
  (``status.json``, and what callers register).
"""

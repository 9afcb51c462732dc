"""The end-to-end scenario (``python -m benchmarks e2e``): bitroute against a Kafka Streams
router, RabbitMQ and Mosquitto on one machine, with its load driver and delivery reader
(:mod:`.kafka_load`), the routing task alone (:mod:`.route_task`) and the peers.

The whole table by hand: ``benchmarks/e2e/run.sh`` installs the peers first
(docs/benchmarks.md); CI runs ``e2e --smoke`` (bitroute alone, toy size).
"""

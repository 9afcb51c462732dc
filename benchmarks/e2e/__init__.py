"""End-to-end benchmark: bitroute against a Kafka Streams router, RabbitMQ and Mosquitto
on one machine.

Run by hand, never in CI: ``benchmarks/e2e/run.sh`` (see docs/benchmarks.md).
"""

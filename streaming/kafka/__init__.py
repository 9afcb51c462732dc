"""bitroute's Kafka client layer: every Kafka client bitroute makes is made here.

- :mod:`streaming.kafka.settings`: the connection (``kafka.bootstrap`` and the
  ``[kafka.client]`` properties: TLS, SASL) as librdkafka configuration and as
  the Spark Kafka source's ``kafka.*`` options;
- :mod:`streaming.kafka.clients`: the producer, consumer and admin factories,
  Kafka's log, authentication and authorization failures as one line each, the
  "local queue full, wait for room" loop;
- :mod:`streaming.kafka.records`: the rules of the records bitroute reads and writes;
- :mod:`streaming.kafka.partitioner`: Kafka's default partitioner (shared layout).

Import the modules themselves (``from streaming.kafka.clients import producer``):
this package imports nothing, so that loading the configuration (which needs
:mod:`streaming.kafka.settings` only) does not load librdkafka for every verb.
"""

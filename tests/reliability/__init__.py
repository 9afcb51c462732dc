"""The fault campaign of issue 12: router and broker SIGKILLs, a 3-broker cluster, fuzzed
input and a soak, each checked end to end against what was published; and issue 30's
month-three faults (publishes lost to retention, a deleted delivery topic, ...).

Run by hand: ``python -m tests.reliability <case>`` (see ``__main__``); the
figures and the command that reproduces them are in docs/reliability.md. The
short forms run in CI from tests/streaming/router/test_reliability.py.

Modules: ``workload`` (good traffic with expected subscribers by construction),
``fuzz`` (bad and hostile records), ``ledger`` (expected vs observed pairs),
``kafka_io`` (publisher, topic readers, the router's progress), ``cluster``
(1 or 3 loopback KRaft brokers that can be SIGKILLed), ``faulty_router`` and
``router`` (``bitroute run`` with kill points, as a child process), ``stage``
(one run's world), ``outputs`` (Kafka and Delta read back), ``cases``.
"""

"""Reporting a Kafka outage in two lines instead of hundreds.

librdkafka calls a client's ``error_cb`` for every failed connection attempt
(several per second per broker during an outage). :class:`BrokerWatch` turns
them into one line on stderr when the cluster becomes unreachable and one
when it answers again, with the outage's length and the count of failed
attempts in between; the clients' own log lines go to a silent logger
(:data:`KAFKA_LOG`). Give :meth:`BrokerWatch.client_settings` to every
librdkafka client of the driver.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import TextIO

from confluent_kafka import KafkaError
from confluent_kafka.admin import AdminClient

KAFKA_LOG = logging.getLogger("bitroute.kafka")
"""librdkafka's log lines: silent unless the caller configures this logger."""
KAFKA_LOG.addHandler(logging.NullHandler())
KAFKA_LOG.propagate = False

PROBE_INTERVAL_S = 1.0
"""While the cluster is unreachable, how often to check whether it answers again."""
RECOVERY_GRACE_S = 5.0
"""Connection errors this soon after a recovery are the outage's stragglers (librdkafka
hands its queued errors out at the client's next poll), not a new outage."""
_OUTAGE_ERRORS = frozenset({KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT,
                            KafkaError._RESOLVE})


class BrokerWatch:
    """One outage report per outage for the cluster at ``bootstrap``; thread-safe."""

    def __init__(self, bootstrap: str, out: TextIO | None = None) -> None:
        self.bootstrap = bootstrap
        self._out = out
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self._recovered_at = float("-inf")
        self._failures = 0
        self.outages = 0

    def client_settings(self) -> dict[str, object]:
        """librdkafka settings that route a client's errors here and its log nowhere."""
        return {"error_cb": self.on_error, "logger": KAFKA_LOG}

    @property
    def down(self) -> bool:
        return self._down_since is not None

    def on_error(self, error: KafkaError) -> None:
        if error.code() not in _OUTAGE_ERRORS:
            return
        with self._lock:
            self._failures += 1
            if self._down_since is not None:
                return
            if time.monotonic() - self._recovered_at < RECOVERY_GRACE_S:
                self._failures = 0
                return
            self._down_since = time.monotonic()
            self.outages += 1
        self._print(f"bitroute: Kafka at {self.bootstrap} is unreachable ({error.str()}); "
                    "routing waits and resumes when it answers")
        threading.Thread(target=self._wait_for_recovery, name="bitroute-broker-watch",
                         daemon=True).start()

    def _wait_for_recovery(self) -> None:
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "logger": KAFKA_LOG})
        while True:
            try:
                admin.list_topics(timeout=PROBE_INTERVAL_S)
                break
            except Exception:  # noqa: BLE001 - any failure means: not back yet
                time.sleep(PROBE_INTERVAL_S)
        with self._lock:
            since, failures = self._down_since, self._failures
            self._down_since, self._failures = None, 0
            self._recovered_at = time.monotonic()
        self._print(f"bitroute: Kafka at {self.bootstrap} answers again after "
                    f"{time.monotonic() - since:.1f}s ({failures} failed connection attempts)")

    def _print(self, line: str) -> None:
        print(line, file=self._out or sys.stderr, flush=True)

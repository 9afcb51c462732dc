"""Reporting a Kafka outage in two lines instead of hundreds.

librdkafka calls a client's ``error_cb`` for every failed connection attempt
(several per second per broker during an outage). :class:`BrokerWatch` turns
them into one log line (a warning) when the cluster becomes unreachable and
one (info) when it answers again, with the outage's length and the count of
failed attempts in between; the clients' own log lines go to their own logger
(:data:`streaming.kafka.KAFKA_LOG`, silent in ``bitroute``). Give :meth:`BrokerWatch.on_error` as the
``on_error`` of every client of the driver (:mod:`streaming.kafka`).
"""

from __future__ import annotations

import logging
import threading
import time

from confluent_kafka import KafkaError

from streaming import kafka
from streaming.kafka.errors import OUTAGE_ERRORS
from streaming.kafka.settings import ClientSettings

_log = logging.getLogger(__name__)

PROBE_INTERVAL_S = 1.0
"""While the cluster is unreachable, how often to check whether it answers again."""
RECOVERY_GRACE_S = 5.0
"""Connection errors this soon after a recovery are the outage's stragglers (librdkafka
hands its queued errors out at the client's next poll), not a new outage."""


class BrokerWatch:
    """One outage report per outage for the cluster at ``bootstrap``; thread-safe."""

    def __init__(self, settings: ClientSettings | str) -> None:
        self.settings = (settings if isinstance(settings, ClientSettings)
                         else ClientSettings.of(settings))
        self.bootstrap = self.settings.bootstrap
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self._recovered_at = float("-inf")
        self._failures = 0
        self._stopped = threading.Event()
        self._prober: threading.Thread | None = None
        self.outages = 0

    @property
    def down(self) -> bool:
        return self._down_since is not None

    def on_error(self, error: KafkaError) -> None:
        if error.code() not in OUTAGE_ERRORS or self._stopped.is_set():
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
        _log.warning(f"Kafka at {self.bootstrap} is unreachable ({error.str()}); "
                     "routing waits and resumes when it answers")
        self._prober = threading.Thread(target=self._wait_for_recovery,
                                        name="bitroute-broker-watch", daemon=True)
        self._prober.start()

    def stop(self) -> None:
        """End the probing of an outage in progress (its end is not reported) and report no
        new one; returns once the probing thread is gone (within a probe's timeout)."""
        self._stopped.set()
        prober = self._prober
        if prober is not None:
            prober.join(timeout=PROBE_INTERVAL_S * 5)

    def _wait_for_recovery(self) -> None:
        admin = kafka.admin(self.settings)
        while not self._stopped.is_set():
            try:
                admin.list_topics(timeout=PROBE_INTERVAL_S)
                break
            except Exception:  # noqa: BLE001 - any failure means: not back yet
                self._stopped.wait(PROBE_INTERVAL_S)
        if self._stopped.is_set():
            return
        with self._lock:
            since, failures = self._down_since, self._failures
            self._down_since, self._failures = None, 0
            self._recovered_at = time.monotonic()
        down = f"{time.monotonic() - since:.1f}s" if since is not None else "an outage"
        _log.info(f"Kafka at {self.bootstrap} answers again after {down} ({failures} failed connection attempts)")

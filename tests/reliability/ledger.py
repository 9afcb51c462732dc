"""What was published and what must come out: the campaign's bookkeeping.

A :class:`Ledger` holds every publish Kafka acknowledged, by message id
(``<topic>/<partition>/<offset>``), with its kind (``good`` with the
subscribers it must reach, or ``bad``), and counts what the outputs say about
each one:

- Kafka deliveries (:meth:`Ledger.delivered`): one count per (publish,
  subscriber) pair; a delivery of a pair that is not expected (an unknown or
  bad publish, a subscriber of another exchange) is counted as unexpected;
- audit rows (:meth:`Ledger.audit_deliveries`, :meth:`Ledger.audit_messages`);
- rejected records (:meth:`Ledger.rejected`).

Pairs are slots in one numpy array (publish order x position of the
subscriber in the publish's expected list), so a million publishes cost a few
megabytes, not a set of tuples.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

GOOD, BAD = 0, 1


@dataclass
class Ledger:
    publishes_topic: str
    deliveries_prefix: str
    _ids: dict = field(default_factory=dict)  # message id -> publish number
    _kind: list = field(default_factory=list)  # publish number -> GOOD/BAD
    _expected: list = field(default_factory=list)  # publish number -> code (-1 for bad)
    _codes: dict = field(default_factory=dict)  # expected tuple -> code
    _positions: list = field(default_factory=list)  # code -> {subscriber: position}
    _start: np.ndarray | None = None
    kafka_pairs: np.ndarray | None = None
    audit_pairs: np.ndarray | None = None
    audit_messages: np.ndarray | None = None
    outcome_ok: np.ndarray | None = None
    rejected_publish: np.ndarray | None = None
    unexpected_kafka: Counter = field(default_factory=Counter)
    unexpected_audit: Counter = field(default_factory=Counter)
    unknown_messages: int = 0
    forged_kept: int = 0  # deliveries carrying more than one message id header

    def add(self, message_id: str, expected: tuple[str, ...] | None) -> None:
        """A publish Kafka acknowledged; ``expected`` is None for a bad one."""
        number = len(self._kind)
        self._ids[message_id] = number
        if expected is None:
            self._kind.append(BAD)
            self._expected.append(-1)
            return
        code = self._codes.get(expected)
        if code is None:
            code = self._codes[expected] = len(self._positions)
            self._positions.append({s: i for i, s in enumerate(expected)})
        self._kind.append(GOOD)
        self._expected.append(code)

    def __len__(self) -> int:
        return len(self._kind)

    @property
    def good(self) -> int:
        return self._kind.count(GOOD)

    @property
    def bad(self) -> int:
        return self._kind.count(BAD)

    def seal(self) -> None:
        """Freeze the publishes and allocate the counters (call once, after publishing)."""
        sizes = np.array([len(self._positions[c]) if c >= 0 else 0 for c in self._expected],
                         dtype=np.int64)
        self._start = np.zeros(len(sizes) + 1, dtype=np.int64)
        np.cumsum(sizes, out=self._start[1:])
        total = int(self._start[-1])
        self.kafka_pairs = np.zeros(total, dtype=np.uint16)
        self.audit_pairs = np.zeros(total, dtype=np.uint16)
        n = len(self._kind)
        self.audit_messages = np.zeros(n, dtype=np.uint16)
        self.outcome_ok = np.zeros(n, dtype=bool)
        self.rejected_publish = np.zeros(n, dtype=np.uint16)

    @property
    def pairs(self) -> int:
        return len(self.kafka_pairs)

    def _slot(self, message_id: str, subscriber: str) -> int | None:
        number = self._ids.get(message_id)
        if number is None:
            return None
        code = self._expected[number]
        if code < 0:
            return None
        position = self._positions[code].get(subscriber)
        return None if position is None else int(self._start[number]) + position

    def delivered(self, message_id: str, subscriber: str) -> None:
        slot = self._slot(message_id, subscriber)
        if slot is None:
            self.unexpected_kafka[_why(self, message_id)] += 1
        else:
            self.kafka_pairs[slot] += 1

    def audit_delivery(self, message_id: str, subscriber: str) -> None:
        slot = self._slot(message_id, subscriber)
        if slot is None:
            self.unexpected_audit[_why(self, message_id)] += 1
        else:
            self.audit_pairs[slot] += 1

    def audit_message(self, message_id: str, outcome: str, reason: str | None,
                      deliveries: int) -> None:
        """One ``messages`` row: a good publish must be routed (or unroutable when it
        expects no one) with its count of deliveries, a bad one rejected with a reason."""
        number = self._ids.get(message_id)
        if number is None:
            self.unknown_messages += 1
            return
        self.audit_messages[number] += 1
        if self._kind[number] == BAD:
            ok = outcome == "rejected" and bool(reason)
        else:
            want = len(self._positions[self._expected[number]])
            ok = (outcome == "routed" and deliveries == want) if want else outcome == "unroutable"
        self.outcome_ok[number] = ok

    def rejected(self, message_id: str, reason: str | None) -> None:
        number = self._ids.get(message_id)
        if number is not None and reason:
            self.rejected_publish[number] += 1

    def summary(self) -> dict:
        """The figures the campaign's checks read."""
        good = np.array(self._kind, dtype=np.int8) == GOOD
        kp, ap = self.kafka_pairs, self.audit_pairs
        return {
            "publishes": len(self._kind),
            "good": int(good.sum()),
            "bad": int((~good).sum()),
            "pairs": int(len(kp)),
            "kafka_missing": int((kp == 0).sum()),
            "kafka_duplicates": int((kp[kp > 1] - 1).sum()),
            "kafka_unexpected": int(sum(self.unexpected_kafka.values())),
            "kafka_unexpected_why": dict(self.unexpected_kafka),
            "kafka_forged_headers_kept": self.forged_kept,
            "audit_missing": int((ap == 0).sum()),
            "audit_repeated": int((ap > 1).sum()),
            "audit_unexpected": int(sum(self.unexpected_audit.values())),
            "messages_missing": int((self.audit_messages == 0).sum()),
            "messages_repeated": int((self.audit_messages > 1).sum()),
            "messages_unknown": self.unknown_messages,
            "outcome_wrong": int(((self.audit_messages > 0) & ~self.outcome_ok).sum()),
            "bad_not_rejected_in_kafka": int(((~good) & (self.rejected_publish == 0)).sum()),
            "good_rejected_in_kafka": int((good & (self.rejected_publish > 0)).sum()),
        }


def _why(ledger: Ledger, message_id: str) -> str:
    number = ledger._ids.get(message_id)
    if number is None:
        return "unknown message id"
    return "bad publish delivered" if ledger._kind[number] == BAD else "subscriber not expected"

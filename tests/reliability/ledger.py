"""What was published and what must come out: the campaign's bookkeeping.

A :class:`Ledger` holds every publish Kafka acknowledged, by message id
(``<topic>/<partition>/<offset>``), with its kind (``good`` with the
subscribers it must reach, ``bad``, or ``lost``: a good publish Kafka deleted
before the router read it, :meth:`Ledger.lose`), and counts what the outputs
say about each one:

- Kafka deliveries (:meth:`Ledger.delivered`): one count per (publish,
  subscriber) pair; a delivery of a pair that is not expected (an unknown or
  bad publish, a subscriber of another exchange) is counted as unexpected;
- audit rows (:meth:`Ledger.audit_delivery`, :meth:`Ledger.audit_message`); a
  ``messages`` row of outcome ``lost`` (the router's record of a retention gap:
  one row per partition range, under the message id of the range's first
  offset, the range in its reason) accounts for each ``lost`` publish it
  covers, instead of being that publish's own row;
- rejected records (:meth:`Ledger.rejected`).

Pairs are slots in one numpy array (publish order x position of the
subscriber in the publish's expected list), so a million publishes cost a few
megabytes, not a set of tuples.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from schemas.records import OUTCOME_LOST

GOOD, BAD, LOST = 0, 1, 2
LOST_RANGE = re.compile(r"offsets (\d+)\.\.(\d+) of partition (\d+)")
"""The range in a ``lost`` row's reason (streaming/router/topics/retention.py, ``gap_rows``)."""


def _unsealed() -> np.ndarray:
    """An array :meth:`Ledger.seal` replaces (empty until then)."""
    return np.zeros(0, dtype=np.int64)


@dataclass
class Ledger:
    publishes_topic: str
    deliveries_prefix: str
    _ids: dict = field(default_factory=dict)  # message id -> publish number
    _kind: list = field(default_factory=list)  # publish number -> GOOD/BAD
    _expected: list = field(default_factory=list)  # publish number -> code (-1 for bad)
    _codes: dict = field(default_factory=dict)  # expected tuple -> code
    _positions: list = field(default_factory=list)  # code -> {subscriber: position}
    _start: np.ndarray = field(default_factory=_unsealed)
    kafka_pairs: np.ndarray = field(default_factory=_unsealed)
    audit_pairs: np.ndarray = field(default_factory=_unsealed)
    audit_messages: np.ndarray = field(default_factory=_unsealed)
    outcome_ok: np.ndarray = field(default_factory=_unsealed)
    rejected_publish: np.ndarray = field(default_factory=_unsealed)
    unexpected_kafka: Counter = field(default_factory=Counter)
    unexpected_audit: Counter = field(default_factory=Counter)
    unknown_messages: int = 0
    forged_kept: int = 0  # deliveries carrying more than one message id header
    lost_reported: np.ndarray = field(default_factory=_unsealed)  # publish number -> lost rows covering it
    lost_rows: int = 0
    lost_rows_wrong: int = 0  # lost rows unreadable, or covering an offset of no lost publish

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

    def lose(self, message_id: str) -> bool:
        """A good publish Kafka deleted before the router read it (retention or
        DeleteRecords): it expects no delivery and no ``messages`` row of its own, only
        to be covered by one ``lost`` row. Call before :meth:`seal`; False when the
        message id is not in the ledger."""
        number = self._ids.get(message_id)
        if number is None:
            return False
        self._kind[number] = LOST
        self._expected[number] = -1
        return True

    def __len__(self) -> int:
        return len(self._kind)

    @property
    def good(self) -> int:
        return self._kind.count(GOOD)

    @property
    def bad(self) -> int:
        return self._kind.count(BAD)

    @property
    def lost(self) -> int:
        return self._kind.count(LOST)

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
        self.lost_reported = np.zeros(n, dtype=np.uint16)

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
        expects no one) with its count of deliveries, a bad one rejected with a reason;
        a ``lost`` row goes to :meth:`audit_lost`."""
        if outcome == OUTCOME_LOST:
            self.audit_lost(message_id, reason)
            return
        number = self._ids.get(message_id)
        if number is None:
            self.unknown_messages += 1
            return
        self.audit_messages[number] += 1
        if self._kind[number] == LOST:
            ok = False  # routed or rejected although Kafka had deleted it
        elif self._kind[number] == BAD:
            ok = outcome == "rejected" and bool(reason)
        else:
            want = len(self._positions[self._expected[number]])
            ok = (outcome == "routed" and deliveries == want) if want else outcome == "unroutable"
        self.outcome_ok[number] = ok

    def audit_lost(self, message_id: str, reason: str | None) -> None:
        """One ``lost`` row: message id ``<topic>/<partition>/<first offset>``, reason
        naming ``offsets <first>..<last> of partition <p>``. Each offset of the range
        must be a ``lost`` publish; anything else makes the row wrong."""
        self.lost_rows += 1
        found = LOST_RANGE.search(reason or "")
        head, _, first_text = message_id.rpartition("/")
        topic, _, partition_text = head.rpartition("/")
        if found is None or not first_text.isdigit():
            self.lost_rows_wrong += 1
            return
        first, last, partition = (int(x) for x in found.groups())
        if partition_text != str(partition) or int(first_text) != first or last < first:
            self.lost_rows_wrong += 1
            return
        wrong = False
        for offset in range(first, last + 1):
            number = self._ids.get(f"{topic}/{partition}/{offset}")
            if number is None or self._kind[number] != LOST:
                wrong = True
                continue
            self.lost_reported[number] += 1
        self.lost_rows_wrong += wrong

    def missing(self, subscriber: str) -> list[str]:
        """Message ids of the publishes whose pair with ``subscriber`` is not in Kafka."""
        ids = {number: mid for mid, number in self._ids.items()}
        out = []
        for number, code in enumerate(self._expected):
            position = self._positions[code].get(subscriber) if code >= 0 else None
            if position is not None and self.kafka_pairs[int(self._start[number]) + position] == 0:
                out.append(ids[number])
        return out

    def rejected(self, message_id: str, reason: str | None) -> None:
        number = self._ids.get(message_id)
        if number is not None and reason:
            self.rejected_publish[number] += 1

    def summary(self) -> dict:
        """The figures the campaign's checks read."""
        kind = np.array(self._kind, dtype=np.int8)
        good, bad, lost = kind == GOOD, kind == BAD, kind == LOST
        kp, ap = self.kafka_pairs, self.audit_pairs
        return {
            "publishes": len(self._kind),
            "good": int(good.sum()),
            "bad": int(bad.sum()),
            "lost": int(lost.sum()),
            "lost_reported": int((lost & (self.lost_reported == 1)).sum()),
            "lost_unreported": int((lost & (self.lost_reported == 0)).sum()),
            "lost_repeated": int((self.lost_reported > 1).sum()),
            "lost_rows": self.lost_rows,
            "lost_rows_wrong": self.lost_rows_wrong,
            "pairs": int(len(kp)),
            "kafka_missing": int((kp == 0).sum()),
            "kafka_duplicates": int((kp[kp > 1] - 1).sum()),
            "kafka_unexpected": int(sum(self.unexpected_kafka.values())),
            "kafka_unexpected_why": dict(self.unexpected_kafka),
            "kafka_forged_headers_kept": self.forged_kept,
            "audit_missing": int((ap == 0).sum()),
            "audit_repeated": int((ap > 1).sum()),
            "audit_unexpected": int(sum(self.unexpected_audit.values())),
            "messages_missing": int((~lost & (self.audit_messages == 0)).sum()),
            "messages_repeated": int((self.audit_messages > 1).sum()),
            "messages_unknown": self.unknown_messages,
            "outcome_wrong": int(((self.audit_messages > 0) & ~self.outcome_ok).sum()),
            "bad_not_rejected_in_kafka": int((bad & (self.rejected_publish == 0)).sum()),
            "good_rejected_in_kafka": int((good & (self.rejected_publish > 0)).sum()),
        }


def _why(ledger: Ledger, message_id: str) -> str:
    number = ledger._ids.get(message_id)
    if number is None:
        return "unknown message id"
    return {BAD: "bad publish delivered", LOST: "deleted publish delivered"}.get(
        ledger._kind[number], "subscriber not expected")

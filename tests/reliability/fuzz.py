"""Fuzzed input: bad publishes and bad subscription changes, each with the rule it breaks,
and good publishes with hostile but valid content.

Every generator is deterministic for a seed and draws its category uniformly
from its table. A *bad* record is one the design says the router must reject
with a reason (docs/design.md, Semantics and Record contracts); a *hostile good*
publish is valid and must be delivered (random payload bytes, header values
that are not UTF-8, a forged ``bitroute.message_id`` header, a junk ``exchange``
header followed by a valid one: the last one wins).

Bad publishes (:data:`BAD_PUBLISHES`) and bad changes (:data:`BAD_CHANGES`)
never reuse a live subscription id, so they change no expected delivery.
"""

from __future__ import annotations

import json
import random

from tests.reliability.workload import EXCHANGES, Publish, Workload

PAYLOAD_OVERSIZE_BYTES = 70_000
"""Payload of an oversize publish; the fuzz case sets ``kafka.max_delivery_bytes`` below it."""
MAX_DELIVERY_BYTES = 65_536


def _junk(rng: random.Random, n: int) -> bytes:
    return bytes(rng.randrange(256) for _ in range(n))


def _not_utf8(rng: random.Random, n: int = 12) -> bytes:
    """Bytes that are certainly not UTF-8 (a lone continuation byte or a surrogate)."""
    return rng.choice((b"\xff", b"\x80", b"\xed\xa0\x80", b"\xc3")) + _junk(rng, n)


def _unknown_exchange(rng: random.Random) -> bytes:
    return rng.choice((b"nope", b"amq.direct", b"MQTT", b"", b"amq.topic ", b"\xc3\xa9x")) + \
        str(rng.randrange(10**6)).encode()[: rng.randrange(0, 4)]


def bad_publish(rng: random.Random, w: Workload, expected_nonempty: list[Publish]
                ) -> tuple[str, bytes | None, bytes | None, list]:
    """(category, key, value, headers) of one publish the router must reject."""
    category = rng.choice(BAD_PUBLISHES)
    ex = rng.choice(sorted(EXCHANGES)).encode()
    value = _junk(rng, rng.randrange(0, 64))
    if category == "key not UTF-8":
        return category, _not_utf8(rng), value, [("exchange", ex)]
    if category == "key missing (null)":
        return category, None, value, [("exchange", ex)]
    if category == "exchange header not UTF-8":
        return category, b"k.1.1", value, [("exchange", _not_utf8(rng))]
    if category == "unknown exchange":
        name = _unknown_exchange(rng)
        if name.decode("utf-8", "replace") in EXCHANGES:
            name = b"nope"
        return category, b"k.1.1", value, [("exchange", name)]
    if category == "AMQP key over 255 bytes":
        return category, ("k." + "w" * rng.randrange(254, 3000)).encode(), value, \
            [("exchange", rng.choice((b"amq.topic", b"other")))]
    if category == "MQTT topic with a wildcard":
        key = rng.choice(("k/+/1", "k/1/#", "#", "+", "k/a+/1", "k/#/1", "+/+/+"))
        return category, key.encode(), value, [("exchange", b"mqtt")]
    if category == "MQTT topic with U+0000":
        return category, b"k/\x00/1", value, [("exchange", b"mqtt")]
    if category == "MQTT topic empty":
        return category, b"", value, [("exchange", b"mqtt")]
    if category == "MQTT topic over 65535 bytes":
        return category, ("k/" + "w" * 65_600).encode(), value, [("exchange", b"mqtt")]
    if category == "delivery over kafka.max_delivery_bytes":
        p = rng.choice(expected_nonempty)
        return category, p.key().encode(), _junk(rng, PAYLOAD_OVERSIZE_BYTES), p.headers()
    if category == "key and exchange not UTF-8":
        return category, _not_utf8(rng), value, [("exchange", _not_utf8(rng))]
    if category == "expiry header not an interval":
        expiry = rng.choice((b"0", b"-5", b"1.5", b" 9", b"4294967296", b"", b"soon",
                             _not_utf8(rng), None))
        return category, b"k.1.1", value, [("exchange", ex), ("expiry", expiry)]
    raise AssertionError(category)


BAD_PUBLISHES = (
    "key not UTF-8", "key missing (null)", "exchange header not UTF-8", "unknown exchange",
    "AMQP key over 255 bytes", "MQTT topic with a wildcard", "MQTT topic with U+0000",
    "MQTT topic empty", "MQTT topic over 65535 bytes", "delivery over kafka.max_delivery_bytes",
    "key and exchange not UTF-8", "expiry header not an interval",
)


def hostile_good_publish(rng: random.Random, p: Publish) -> tuple[str, bytes, bytes, list]:
    """(category, key, value, headers) of a valid publish ``p`` dressed in hostile content."""
    category = rng.choice(HOSTILE_GOOD)
    headers = p.headers()
    value = b"ok"
    if category == "random payload bytes":
        value = _junk(rng, rng.randrange(0, 2048))
    elif category == "header values not UTF-8":
        headers = headers + [(f"h{i}", _not_utf8(rng)) for i in range(rng.randrange(1, 5))]
    elif category == "forged router headers":
        headers = headers + [("bitroute.message_id", b"forged/0/0"),
                             ("bitroute.snapshot_version", b"999999"),
                             ("bitroute.reason", b"not rejected")]
    elif category == "junk exchange header, valid last":
        headers = [("exchange", _not_utf8(rng))] + headers
    elif category == "junk expiry header, longest interval last":
        headers = headers + [("expiry", b"soon"), ("expiry", b"4294967295")]
    elif category == WILDCARD_AMQP_KEY:
        # '*' and '#' are literal words in an AMQP routing key; no filter starts with 'q'.
        return category, b"q.*.#", value, [("exchange", b"amq.topic")]
    return category, p.key().encode(), value, headers


WILDCARD_AMQP_KEY = "AMQP key with wildcard words (routes to no one)"
HOSTILE_GOOD = ("random payload bytes", "header values not UTF-8", "forged router headers",
                "junk exchange header, valid last", "junk expiry header, longest interval last",
                WILDCARD_AMQP_KEY)


def bad_change(rng: random.Random, number: int) -> tuple[str, bytes, bytes | None]:
    """(category, key, value) of a subscription change the router must reject."""
    category = rng.choice(BAD_CHANGES)
    key = f"bad-{number:07d}".encode()
    good = {"exchange": "amq.topic", "subscriber": "fuzz-ok", "filter": "k.1.1"}

    def obj(**changes) -> bytes:
        value = dict(good)
        for k, v in changes.items():
            if v is _DROP:
                value.pop(k)
            else:
                value[k] = v
        return json.dumps(value).encode()

    if category == "value is random bytes":
        return category, key, _not_utf8(rng, rng.randrange(0, 200))
    if category == "malformed JSON":
        return category, key, rng.choice((b"{", b"{\"exchange\":", b"[1,", b"nul", b"{'a':1}",
                                          b"\"unterminated"))
    if category == "JSON that is not an object":
        return category, key, rng.choice((b"[1, 2]", b"42", b"\"s\"", b"null", b"true"))
    if category == "missing field":
        return category, key, obj(**{rng.choice(("exchange", "subscriber", "filter")): _DROP})
    if category == "unknown field":
        return category, key, obj(extra=1)
    if category == "field of the wrong type":
        return category, key, obj(**{rng.choice(("exchange", "subscriber", "filter")):
                                     rng.choice((5, None, [], {"a": 1}))})
    if category == "unknown exchange":
        return category, key, obj(exchange=rng.choice(("nope", "", "AMQ.TOPIC", "mqtt ")))
    if category == "bad MQTT filter":
        return category, key, obj(exchange="mqtt", filter=rng.choice(
            ("a/#/b", "a+", "#/a", "a/b#", "a/\u0000", "", "$share/g", "$share//a", "+a/b")))
    if category == "AMQP filter over 255 bytes":
        return category, key, obj(filter="k." + "w" * rng.randrange(254, 2000))
    if category == "hostile subscriber name":
        return category, key, obj(subscriber=rng.choice(
            ("../etc", "a b", "x/y", "", ".", "..", "\u00fc", "s" * 201, "x\u0000", "*",
             "a\nb", "$x", "bitroute deliveries")))
    if category == "bad header criteria":
        return category, key, obj(headers=rng.choice((
            {"match": "some", "criteria": {"a": "b"}}, {"match": "all", "criteria": [1]},
            {"match": "all", "criteria": {"a": 5}}, {"match": "any", "criteria": {"": "x"}},
            "all", {"criteria": {"a": "b"}})))
    if category == "subscription id not UTF-8":
        return category, _not_utf8(rng), obj()
    if category == "subscription id empty":
        return category, b"", obj()
    if category == "filter over limits.max_filter_levels":
        return category, key, obj(exchange="mqtt", filter="/".join(["l"] * rng.randrange(129, 400)))
    if category == "over limits.max_header_criteria":
        return category, key, obj(headers={"match": "any", "criteria": {
            f"h{i}": None for i in range(rng.randrange(65, 200))}})
    if category == "value not UTF-8 inside JSON":
        return category, key, b'{"exchange": "amq.topic", "subscriber": "\xff\xfe", "filter": "a"}'
    raise AssertionError(category)


_DROP = object()
BAD_CHANGES = (
    "value is random bytes", "malformed JSON", "JSON that is not an object", "missing field",
    "unknown field", "field of the wrong type", "unknown exchange", "bad MQTT filter",
    "AMQP filter over 255 bytes", "hostile subscriber name", "bad header criteria",
    "subscription id not UTF-8", "subscription id empty", "value not UTF-8 inside JSON",
    "filter over limits.max_filter_levels", "over limits.max_header_criteria",
)
"""Changes without a key (a null subscription id, a tombstone without a key) are not
among them: the changelog is compacted, and Kafka refuses a record without a key on a
compacted topic (INVALID_RECORD, failing the producer's whole batch with it), so the
router can never read one."""

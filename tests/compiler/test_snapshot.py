"""Snapshot byte format: round trips, and refusal of corrupt or foreign bytes."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import pytest

from compiler import HeaderCriteria, Matcher, RoutingIndex, Snapshot, SnapshotFormatError, Subscription
from compiler.options import SubscriptionOptions
from compiler.snapshot import FORMAT_VERSION, MAGIC

SNAPSHOT_V1 = Path(__file__).parent / "data" / "snapshot-v1.bin"
"""``_index().snapshot(42, {0: 17, 3: 9})`` as format version 1 wrote it (the
writer before issue 21, with filter classes): bytes on users' disks."""
SNAPSHOT_V2 = Path(__file__).parent / "data" / "snapshot-v2.bin"
"""The same snapshot as format version 2 wrote it (before the MQTT subscription options)."""

EXCHANGES = {"amq": "amqp", "mq": "mqtt"}
TOPICS = [("amq", "a.b.c"), ("amq", ""), ("amq", "x.ü.z"), ("mq", "a/b"), ("mq", "$SYS/x"), ("mq", "a")]


def _index() -> RoutingIndex:
    index = RoutingIndex(EXCHANGES)
    subs = [
        Subscription("s1", "amq", "alice", "a.b.c"),
        Subscription("s2", "amq", "alice", "a.*.c"),
        Subscription("s3", "amq", "bob", "#", HeaderCriteria("all", {"k": "v", "p": None})),
        Subscription("s4", "amq", "carol", "#.ü.#"),
        Subscription("ü-id", "amq", "dave", "*.#"),
        Subscription("s6", "mq", "erin", "a/+"),
        Subscription("s7", "mq", "frank", "$share/g/a/#"),
        Subscription("s8", "mq", "gina", "$share/g/a/#"),
        Subscription("s9", "mq", "hank", "$SYS/#", HeaderCriteria("any", {"k": "v"})),
        Subscription("gone", "mq", "ivan", "x"),
    ]
    for sub in subs:
        index.upsert(sub)
    index.remove("gone")
    return index


def _index_with_options() -> RoutingIndex:
    """:func:`_index` plus subscriptions with MQTT options (one replaced back to the default)."""
    index = _index()
    index.upsert(Subscription("o1", "mq", "olga", "a/#", options=SubscriptionOptions(1, True)))
    index.upsert(Subscription("o2", "mq", "olga", "b", options=SubscriptionOptions(2, False, True)))
    index.upsert(Subscription("o3", "mq", "pete", "c", options=SubscriptionOptions(0, True)))
    index.upsert(Subscription("o3", "mq", "pete", "c"))
    return index


def test_options_round_trip_and_continue():
    snap = _index_with_options().snapshot(5, {})
    loaded = Snapshot.from_bytes(snap.to_bytes())
    assert loaded.to_bytes() == snap.to_bytes()
    restored = RoutingIndex.from_snapshot(loaded)
    assert [restored.get(i).options for i in ("o1", "o2", "o3", "s1")] == [
        (1, True, False), (2, False, True), (0, False, False), (0, False, False)]
    assert loaded.tables.option_slots.tolist() == [restored.slot("o1"), restored.slot("o2")]
    assert _all_matches(Matcher(loaded)) == _all_matches(Matcher(snap))


def test_a_version_2_snapshot_reads_with_default_options():
    data = SNAPSHOT_V2.read_bytes()
    assert struct.unpack_from("<H", data, 8)[0] == 2
    old = Snapshot.from_bytes(data)
    assert len(old.tables.option_slots) == 0
    assert old.to_bytes() == _index().snapshot(42, {0: 17, 3: 9}).to_bytes()


def _all_matches(matcher: Matcher) -> list:
    return [
        matcher.match(exchange, topic, headers, message_id)
        for exchange, topic in TOPICS
        for headers in (None, {"k": "v", "p": b"\xff"})
        for message_id in ("m1", "m2", "m3")
    ]


def test_round_trip_preserves_metadata_and_matching():
    snap = _index().snapshot(42, {0: 17, 3: 9})
    loaded = Snapshot.from_bytes(snap.to_bytes())
    assert (loaded.version, dict(loaded.offsets), dict(loaded.exchanges), len(loaded)) == (
        42, {0: 17, 3: 9}, {"amq": "amqp", "mq": "mqtt"}, 9)
    assert _all_matches(Matcher(loaded)) == _all_matches(Matcher(snap))
    assert loaded.to_bytes() == snap.to_bytes()


def test_a_version_1_snapshot_reads_and_routes_as_version_2():
    data = SNAPSHOT_V1.read_bytes()
    header_len = struct.unpack_from("<I", data, 12)[0]
    header = json.loads(data[20:20 + header_len])
    assert struct.unpack_from("<H", data, 8)[0] == 1 and "shapes" in header
    assert "filter_code" in [name for name, _ in header["sections"]]
    old = Snapshot.from_bytes(data)
    new = _index().snapshot(42, {0: 17, 3: 9})
    assert (old.version, dict(old.offsets), dict(old.exchanges), len(old)) == (
        new.version, dict(new.offsets), dict(new.exchanges), len(new))
    assert _all_matches(Matcher(old)) == _all_matches(Matcher(new))
    # Rewritten, it is the version 3 bytes of the same index; continued, the same index.
    assert old.to_bytes() == new.to_bytes()
    assert struct.unpack_from("<H", new.to_bytes(), 8)[0] == FORMAT_VERSION == 3
    restored = RoutingIndex.from_snapshot(old)
    restored.upsert(Subscription("new", "mq", "ivan", "a/#"))
    index = _index()
    index.upsert(Subscription("new", "mq", "ivan", "a/#"))
    assert restored.snapshot(43, {}).to_bytes() == index.snapshot(43, {}).to_bytes()


def test_a_version_1_snapshot_is_still_checked():
    data = bytearray(SNAPSHOT_V1.read_bytes())
    data[-1] ^= 1
    with pytest.raises(SnapshotFormatError, match="CRC-32 mismatch"):
        Snapshot.from_bytes(bytes(data))


def test_round_trip_of_an_empty_index():
    snap = RoutingIndex(EXCHANGES).snapshot(0, {})
    loaded = Snapshot.from_bytes(snap.to_bytes())
    assert len(loaded) == 0 and Matcher(loaded).match("amq", "a") == []


def test_restart_from_bytes_continues_the_index():
    index = _index()
    restored = RoutingIndex.from_snapshot(Snapshot.from_bytes(index.snapshot(1, {}).to_bytes()))
    for target in (index, restored):
        target.upsert(Subscription("new", "mq", "ivan", "a/#"))
    assert restored.snapshot(2, {}).to_bytes() == index.snapshot(2, {}).to_bytes()


def test_header_layout():
    data = _index().snapshot(1, {}).to_bytes()
    magic, version, reserved, header_len, crc = struct.unpack_from("<8sHHII", data)
    assert (magic, version, reserved) == (MAGIC, FORMAT_VERSION, 0)
    assert crc == zlib.crc32(data[20:])
    header = json.loads(data[20:20 + header_len])
    assert header["version"] == 1 and header["subscriptions"] == 9
    names = [name for name, _ in header["sections"]]
    assert names[:3] == ["sub_live", "sub_ids.offsets", "sub_ids.data"]
    assert "shapes" not in header and "filter_code" not in names  # format 1's filter classes


def _resealed(data: bytes, header: dict) -> bytes:
    """``data`` with its JSON header replaced (same length) and a valid CRC."""
    _, version, _, header_len, _ = struct.unpack_from("<8sHHII", data)
    text = json.dumps(header, separators=(",", ":")).encode()
    assert len(text) <= header_len
    body = text + b" " * (header_len - len(text)) + data[20 + header_len:]
    return struct.pack("<8sHHII", MAGIC, version, 0, header_len, zlib.crc32(body)) + body


@pytest.mark.parametrize(
    "mangle, message",
    [
        (lambda d: b"", "shorter than the header"),
        (lambda d: b"PK\x03\x04" + d[4:], "bad magic"),
        (lambda d: d[:8] + struct.pack("<H", FORMAT_VERSION + 1) + d[10:], "unsupported snapshot format version"),
        (lambda d: d[:8] + struct.pack("<H", 0) + d[10:], "unsupported snapshot format version"),
        (lambda d: d[:-1] + bytes([d[-1] ^ 1]), "CRC-32 mismatch"),
        (lambda d: d[:len(d) // 2], "CRC-32 mismatch"),
        (lambda d: d + b"\0" * 8, "CRC-32 mismatch"),
        (lambda d: d[:100] + bytes([d[100] ^ 0x40]) + d[101:], "CRC-32 mismatch"),
    ],
)
def test_corrupt_or_foreign_bytes_are_refused(mangle, message):
    data = _index().snapshot(1, {}).to_bytes()
    with pytest.raises(SnapshotFormatError, match=message):
        Snapshot.from_bytes(mangle(data))


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda h: h.update(subscriptions=3), "header counts 3 subscriptions"),
        (lambda h: h.update(exchanges=[["amq", "stomp"], ["mq", "mqtt"]]), "stomp"),
        (lambda h: h.update(exchanges=[["amq", "amqp"]]), "missing exchange"),
        (lambda h: h["sections"].pop(), "unexpected bytes"),
        (lambda h: h.pop("offsets"), "offsets"),
    ],
)
def test_well_sealed_but_inconsistent_bytes_are_refused(edit, message):
    data = _index_with_options().snapshot(1, {}).to_bytes()
    header_len = struct.unpack_from("<I", data, 12)[0]
    header = json.loads(data[20:20 + header_len])
    edit(header)
    with pytest.raises(SnapshotFormatError, match=message):
        Snapshot.from_bytes(_resealed(data, header))


def test_snapshot_rejects_bad_metadata():
    index = RoutingIndex(EXCHANGES)
    with pytest.raises(ValueError, match="offsets"):
        index.snapshot(1, {-1: 0})
    with pytest.raises(ValueError, match="version"):
        index.snapshot(-1, {})

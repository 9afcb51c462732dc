"""A plain Python topic trie: the honest baseline a Python engineer would write.

One dict of children per node, a separate child for the one-level wildcard
('*' in AMQP, '+' in MQTT) and for the multi-level wildcard '#', and the list
of subscription ids whose filter ends at the node.  No bitmaps, no caching:
this is what bitroute's index has to beat.

Semantics are the ones in docs/design.md, "Semantics (normative)":

- AMQP: '.'-separated words, '*' one word, '#' zero or more words anywhere and
  any number of times.  Every way a '#' can stretch is explored; a
  (node, position) pair already expanded from a '#' is not expanded again, so
  '#.#.#' costs O(levels^2), not an explosion of paths.
- MQTT: '/'-separated levels, '+' one level, '#' last only and also matching
  the parent ('a/#' matches 'a'); a topic starting with '$' is not matched by
  a filter whose first level is a wildcard.

Shared subscriptions ('$share/...') are not handled: the benchmark does not
generate them.
"""

from __future__ import annotations

from collections.abc import Iterable


class _Node:
    __slots__ = ("children", "one", "many", "ids")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.one: _Node | None = None
        self.many: _Node | None = None
        self.ids: list[str] | None = None


class TopicTrie:
    def __init__(self, dialect: str) -> None:
        if dialect == "amqp":
            self.sep, self.one_wc = ".", "*"
        elif dialect == "mqtt":
            self.sep, self.one_wc = "/", "+"
        else:
            raise ValueError(f"unknown dialect {dialect!r}")
        self.mqtt = dialect == "mqtt"
        self.root = _Node()
        self.subscriber_of: dict[str, str] = {}
        self.filter_of: dict[str, str] = {}

    # -- building -------------------------------------------------------
    def add(self, sub_id: str, subscriber: str, filter_: str) -> None:
        if sub_id in self.filter_of:
            self.remove(sub_id)
        node = self.root
        one_wc = self.one_wc
        for word in filter_.split(self.sep):
            if word == one_wc:
                nxt = node.one
                if nxt is None:
                    nxt = node.one = _Node()
            elif word == "#":
                nxt = node.many
                if nxt is None:
                    nxt = node.many = _Node()
            else:
                nxt = node.children.get(word)
                if nxt is None:
                    nxt = node.children[word] = _Node()
            node = nxt
        if node.ids is None:
            node.ids = [sub_id]
        else:
            node.ids.append(sub_id)
        self.subscriber_of[sub_id] = subscriber
        self.filter_of[sub_id] = filter_

    def remove(self, sub_id: str) -> None:
        filter_ = self.filter_of.pop(sub_id)
        del self.subscriber_of[sub_id]
        node = self.root
        path = []
        for word in filter_.split(self.sep):
            path.append((node, word))
            nxt = node.one if word == self.one_wc else node.many if word == "#" else node.children[word]
            if nxt is None:
                raise KeyError(f"{sub_id}: its filter's node is missing")  # add() made each one
            node = nxt
        if node.ids is None:
            raise KeyError(f"{sub_id}: not at its filter's node")
        node.ids.remove(sub_id)
        if not node.ids:
            node.ids = None
        # prune empty nodes bottom-up
        for parent, word in reversed(path):
            if node.ids or node.children or node.one or node.many:
                break
            if word == self.one_wc:
                parent.one = None
            elif word == "#":
                parent.many = None
            else:
                del parent.children[word]
            node = parent

    # -- matching -------------------------------------------------------
    def match_ids(self, topic: str) -> list[str]:
        """Matched subscription ids (each once, in no particular order)."""
        words = topic.split(self.sep)
        n = len(words)
        out: list[str] = []
        if self.mqtt:
            self._match_mqtt(words, n, out)
            return out
        # AMQP: several paths can end on one node ('#.#', '#.a' vs '*.#'),
        # so collect terminal nodes once.
        hits: dict[int, list[str]] = {}
        seen: set[tuple[int, int]] = set()
        stack = [(self.root, 0)]
        pop, push = stack.pop, stack.append
        while stack:
            node, i = pop()
            many = node.many
            if many is not None:
                key = id(many)
                for j in range(i, n + 1):
                    if (key, j) not in seen:
                        seen.add((key, j))
                        push((many, j))
            if i == n:
                if node.ids is not None:
                    hits[id(node)] = node.ids
                continue
            child = node.children.get(words[i])
            if child is not None:
                push((child, i + 1))
            if node.one is not None:
                push((node.one, i + 1))
        for ids in hits.values():
            out.extend(ids)
        return out

    def _match_mqtt(self, words: list[str], n: int, out: list[str]) -> None:
        # In MQTT no two paths reach one node, so no de-duplication is needed.
        root = self.root
        stack = []
        # '$' rule: a first-level wildcard never matches a '$' topic.
        if words[0][:1] == "$":
            child = root.children.get(words[0])
            if child is not None:
                stack.append((child, 1))
        else:
            stack.append((root, 0))
        pop, push = stack.pop, stack.append
        while stack:
            node, i = pop()
            many = node.many
            if many is not None and many.ids is not None:
                out.extend(many.ids)  # '#' matches the parent and below
            if i == n:
                if node.ids is not None:
                    out.extend(node.ids)
                continue
            child = node.children.get(words[i])
            if child is not None:
                push((child, i + 1))
            if node.one is not None:
                push((node.one, i + 1))

    def match(self, topic: str) -> dict[str, list[str]]:
        """Matched ids grouped by subscriber: one delivery per subscriber."""
        grouped: dict[str, list[str]] = {}
        sub_of = self.subscriber_of
        for sid in self.match_ids(topic):
            s = sub_of[sid]
            lst = grouped.get(s)
            if lst is None:
                grouped[s] = [sid]
            else:
                lst.append(sid)
        return grouped


def build_trie(dialect: str, subs: Iterable[tuple[str, str, str]]) -> TopicTrie:
    """subs: (id, subscriber, filter)."""
    trie = TopicTrie(dialect)
    add = trie.add
    for sid, subscriber, filt in subs:
        add(sid, subscriber, filt)
    return trie


# -- the batch path: same output as compiler's Matcher.match_frame ----------

def deliveries_type():
    import pyarrow as pa

    return pa.list_(
        pa.struct(
            [
                pa.field("subscriber", pa.string()),
                pa.field("subscription_ids", pa.list_(pa.string())),
            ]
        )
    )


def trie_match_frame(trie: TopicTrie, frame, out_type=None):
    """The trie's equivalent of ``Matcher.match_frame``: the same work.

    De-duplicates routing keys within the batch, matches each distinct key
    once, groups its matches into one (subscriber, [ids]) entry per
    subscriber, builds one Arrow list<struct> row per distinct key, and
    expands it to one row per publish with ``take`` (the copy is done in C++,
    not a Python loop per delivery).  Output columns: message_id, deliveries
    (ArrowDtype list<struct<subscriber, subscription_ids>>), error (None).
    """
    import numpy as np
    import pandas as pd
    import pyarrow as pa

    if out_type is None:
        out_type = deliveries_type()
    struct_type = out_type.value_type
    ids_type = struct_type.field("subscription_ids").type
    position: dict = {}
    rows = np.empty(len(frame), dtype=np.int64)
    subs_flat: list[str] = []
    ids_flat: list[str] = []
    ids_len: list[int] = []
    row_len: list[int] = []
    match = trie.match
    for i, key in enumerate(frame["routing_key"].tolist()):
        p = position.get(key)
        if p is None:
            p = position[key] = len(row_len)
            topic = key.decode() if isinstance(key, (bytes, bytearray)) else key
            grouped = match(topic)
            subs_flat.extend(grouped)
            for ids in grouped.values():
                ids_flat.extend(ids)
                ids_len.append(len(ids))
            row_len.append(len(grouped))
        rows[i] = p
    id_offsets = np.zeros(len(ids_len) + 1, dtype=np.int32)
    np.cumsum(ids_len, out=id_offsets[1:])
    row_offsets = np.zeros(len(row_len) + 1, dtype=np.int32)
    np.cumsum(row_len, out=row_offsets[1:])
    ids_arr = pa.ListArray.from_arrays(
        pa.array(id_offsets), pa.array(ids_flat, type=ids_type.value_type), type=ids_type
    )
    structs = pa.StructArray.from_arrays(
        [pa.array(subs_flat, type=struct_type.field("subscriber").type), ids_arr],
        fields=list(struct_type),
    )
    per_topic = pa.ListArray.from_arrays(pa.array(row_offsets), structs, type=out_type)
    per_publish = per_topic.take(pa.array(rows))
    return pd.DataFrame(
        {
            "message_id": frame["message_id"].to_numpy(),
            "deliveries": pd.Series(pd.arrays.ArrowExtensionArray(per_publish), index=frame.index),
            "error": pd.Series([None] * len(frame), dtype=object, index=frame.index),
        },
        index=frame.index,
    )


# -- the offline script: the same JSON Lines in and out as `bitroute match` ------

def _id_order(value):
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return (0, value) if number else (1, value)


def main(argv=None) -> int:
    """``python benchmarks/trie.py --dialect D --subscriptions S --topics T``:
    what ``bitroute match`` prints for files without headers, shared groups or
    rejections, with a json.loads / trie / json.dumps per line."""
    import argparse
    import json
    import sys

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("--dialect", required=True, choices=("amqp", "mqtt"))
    p.add_argument("--subscriptions", required=True)
    p.add_argument("--topics", required=True)
    args = p.parse_args(argv)
    trie = TopicTrie(args.dialect)
    given: dict[str, object] = {}
    with open(args.subscriptions, encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                record = json.loads(line)
                key = json.dumps(record["id"])
                given[key] = record["id"]
                trie.add(key, record.get("subscriber") or key, record["filter"])
    out = sys.stdout
    with open(args.topics, encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                topic = json.loads(line)["topic"]
                ids = [given[key] for key in trie.match_ids(topic)]
                ids.sort(key=_id_order)
                out.write(json.dumps({"topic": topic, "subscriptions": ids}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

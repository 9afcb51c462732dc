"""The reverse match (compiler/retained_index.py): both structures against the reference's
word matcher, the ``$`` rule, removals, bad input. No broker."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from compiler import FilterError, TopicError, mqtt
from compiler.reference import words_match
from compiler.retained_index import LevelBitmaps, RetainedIndex, TopicTrie

STRUCTURES: list[type[TopicTrie] | type[LevelBitmaps]] = [TopicTrie, LevelBitmaps]
TOPICS = ["a/b/c", "a/b", "a", "a/x/c", "b/b/c", "a/b/c/d", "/a", "/", "a/", "$SYS/x",
          "$SYS/x/c", "$SYS", "sensors/boiler/temperature", "sensors/attic/temperature",
          "sensors/attic/humidity"]


def expected(filter_text: str, topics) -> set[str]:
    words = mqtt.parse_filter(filter_text).words
    dollar = words[0] in ("+", "#")
    return {t for t in topics if words_match(words, tuple(t.split("/")), "+", "#")
            and not (dollar and t.startswith("$"))}


@pytest.mark.parametrize("structure", STRUCTURES)
@pytest.mark.parametrize("filter_text", [
    "a/+/c", "a/#", "+/+/c", "#", "+", "+/#", "a/b/c", "a", "a/+", "/+", "+/", "$SYS/#",
    "$SYS/+", "+/x", "sensors/+/temperature", "sensors/#", "a/b/c/d/#", "nothing/#", "a/b/+/+",
    "$share/g/a/+/c", "$share/g/#"])
def test_each_filter_matches_what_the_reference_matches(structure, filter_text):
    index = structure(TOPICS)
    assert len(index) == len(TOPICS)
    assert sorted(index.match(filter_text)) == sorted(expected(filter_text, TOPICS))


@pytest.mark.parametrize("structure", STRUCTURES)
def test_a_filter_starting_with_a_wildcard_skips_dollar_topics(structure):
    index = structure(["$SYS/broker/load", "sys/broker/load"])
    assert index.match("#") == ["sys/broker/load"]
    assert index.match("+/broker/load") == ["sys/broker/load"]
    assert sorted(index.match("$SYS/#")) == ["$SYS/broker/load"]
    assert index.match("$SYS/+/load") == ["$SYS/broker/load"]


@pytest.mark.parametrize("structure", STRUCTURES)
def test_removed_topics_stop_matching_and_slots_are_reused(structure):
    index = structure(["a/b", "a/c", "a"])
    index.discard("a/b")
    index.discard("a/b")  # twice: a no-op
    index.discard("never/held")
    assert sorted(index.match("a/#")) == ["a", "a/c"]
    assert "a/b" not in index and "a/c" in index and len(index) == 2
    index.add("z/b")
    index.add("z/b")  # held already
    assert index.match("+/b") == ["z/b"] and len(index) == 3


@pytest.mark.parametrize("structure", STRUCTURES)
def test_bad_filters_and_topics_are_refused(structure):
    index = structure()
    with pytest.raises(FilterError):
        index.match("a/#/b")
    with pytest.raises(TopicError):
        index.add("a/+")
    assert index.match("#") == []


def test_the_router_keeps_the_bitmaps():
    assert RetainedIndex is LevelBitmaps


_WORD = st.sampled_from(["a", "b", "", "$x", "c"])
_TOPIC = st.lists(_WORD, min_size=1, max_size=4).map("/".join).filter(bool)
_FILTER = st.lists(st.sampled_from(["a", "b", "", "+", "$x"]), min_size=1, max_size=4).flatmap(
    lambda ws: st.sampled_from(["/".join(ws), "/".join(ws + ["#"])])).filter(bool)


@settings(max_examples=300, deadline=None)
@given(topics=st.lists(_TOPIC, max_size=12), removed=st.lists(_TOPIC, max_size=4),
       filter_text=_FILTER)
def test_both_structures_agree_with_the_reference(topics, removed, filter_text):
    held = set(topics) - set(removed)
    for structure in STRUCTURES:
        index = structure(topics)
        for topic in removed:
            index.discard(topic)
        assert sorted(index.match(filter_text)) == sorted(expected(filter_text, held))

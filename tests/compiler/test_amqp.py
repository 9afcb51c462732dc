"""AMQP grammar and RabbitMQ topic-exchange semantics (compiler/amqp.py docstring)."""

from __future__ import annotations

import pytest

from compiler import FilterError, TopicError, amqp

VALID = ["", "a.b.c", "a..b", ".", "a.", "*", "#", "*.b.*", "#.c", "a.#", "a.#.c", "#.#", "#.b.#",
         "a.#.b.#.c", "*.#", "a*.b#", "ü.€", "a" * 255, "é" * 127]
INVALID = ["a" * 256, "é" * 128, "a\udc80", None, b"a.b", 42]
NOT_MATCHING_A_B_C = ["a.b", "a.*", "*.b", "b.c.a", "a.b.d", "a.b.c.*", "#.b", "a.#.d", "*.*.*.*",
                      "a.*.#.*.*", "a*.b.c", ""]
MATCHING_A_B_C = ["a.b.c", "#", "*.*.*", "a.#", "#.c", "a.#.c", "#.b.#", "#.#", "*.#", "#.*",
                  "a.b.c.#", "#.a.b.c", "a.#.b.#.c", "#.a.#.b.#.c.#", "*.b.*", "a.*.#", "#.*.*.*"]


@pytest.mark.parametrize("text", VALID)
def test_valid_filters_parse(text):
    assert amqp.parse_filter(text).text == text


@pytest.mark.parametrize("text", INVALID, ids=repr)
def test_invalid_filters_are_rejected_naming_the_filter(text):
    with pytest.raises(FilterError, match="binding key"):
        amqp.parse_filter(text)


@pytest.mark.parametrize("text", NOT_MATCHING_A_B_C)
def test_valid_filters_not_matching(text, amqp_routing):
    assert amqp_routing(text).ids("amq", "a.b.c") == []


@pytest.mark.parametrize("text", MATCHING_A_B_C)
def test_filters_matching(text, amqp_routing):
    assert amqp_routing(text).ids("amq", "a.b.c") == ["s0"]


def test_empty_routing_key_has_zero_words(amqp_routing):
    r = amqp_routing("", "#", "*", "#.#", "*.#", "a")
    assert r.ids("amq", "") == ["s0", "s1", "s3"]
    assert amqp.parse_topic("") == []


def test_empty_words_are_words(amqp_routing):
    assert amqp.parse_topic("a..b") == ["a", "", "b"]
    r = amqp_routing("a.*.b", "a..b", "*.*", "*.*.*", "a.#.b", "#.", ".#")
    assert r.ids("amq", "a..b") == ["s0", "s1", "s3", "s4"]
    assert r.ids("amq", ".") == ["s2", "s5", "s6"]
    assert r.ids("amq", "a.") == ["s2", "s5"]


def test_hash_matches_zero_or_more_words_anywhere(amqp_routing):
    r = amqp_routing("a.#.b", "#.b", "a.#", "#.a.#")
    assert r.ids("amq", "a.b") == ["s0", "s1", "s2", "s3"]
    assert r.ids("amq", "a.x.y.b") == ["s0", "s1", "s2", "s3"]
    assert r.ids("amq", "a") == ["s2", "s3"]
    assert r.ids("amq", "x.a") == ["s3"]
    assert r.ids("amq", "b") == ["s1"]


def test_rabbitmq_tutorial_examples(amqp_routing):
    # https://www.rabbitmq.com/tutorials/tutorial-five-python: Q1 *.orange.*, Q2 *.*.rabbit and lazy.#
    r = amqp_routing("*.orange.*", "*.*.rabbit", "lazy.#")
    assert r.ids("amq", "quick.orange.rabbit") == ["s0", "s1"]
    assert r.ids("amq", "lazy.orange.elephant") == ["s0", "s2"]
    assert r.ids("amq", "quick.orange.fox") == ["s0"]
    assert r.ids("amq", "lazy.brown.fox") == ["s2"]
    assert r.ids("amq", "lazy.pink.rabbit") == ["s1", "s2"]
    assert r.ids("amq", "quick.brown.fox") == []
    assert r.ids("amq", "orange") == []
    assert r.ids("amq", "quick.orange.new.rabbit") == []
    assert r.ids("amq", "lazy.orange.new.rabbit") == ["s2"]


def test_wildcard_characters_inside_words_are_literals(amqp_routing):
    r = amqp_routing("a*.b", "a#", "*x")
    assert r.ids("amq", "a*.b") == ["s0"]
    assert r.ids("amq", "ab.b") == []
    assert r.ids("amq", "a#") == ["s1"]
    assert r.ids("amq", "*x") == ["s2"]
    assert r.ids("amq", "yx") == []


def test_star_and_hash_in_routing_keys_are_ordinary_characters(amqp_routing):
    r = amqp_routing("*", "a.#", "#")
    assert r.ids("amq", "*") == ["s0", "s2"]
    assert r.ids("amq", "a.#") == ["s1", "s2"]


def test_routing_key_length_limit():
    assert amqp.parse_topic("a" * 255) == ["a" * 255]
    with pytest.raises(TopicError, match="256 bytes, longer than 255"):
        amqp.parse_topic("a" * 256)
    with pytest.raises(TopicError, match="258 bytes"):
        amqp.parse_topic("€" * 86)
    with pytest.raises(TopicError, match="not valid UTF-8"):
        amqp.parse_topic("a\udc80")
    with pytest.raises(TopicError, match="must be a string"):
        amqp.parse_topic(b"a.b")  # type: ignore[arg-type]  # the wrong type is the test


def test_many_hashes_match_without_blow_up(amqp_routing):
    # RabbitMQ 4.3.5 refuses more than two '#'; a backtracking matcher takes
    # exponential time on this pair. The kernel visits each (filter word,
    # key position) state once.
    pattern = ".".join(["#", "a"] * 20 + ["#", "b"])
    r = amqp_routing(pattern)
    assert r.matcher.match("amq", ".".join(["a"] * 120)) == []
    assert [d.subscription_ids for d in r.matcher.match("amq", ".".join(["a"] * 20 + ["b"]))] == [("s0",)]
    assert r.matcher.match("amq", ".".join(["a"] * 19 + ["b"])) == []


@pytest.mark.parametrize(
    "text, words",
    [("a.b", ("a", "b")), ("", ()), ("a.*.c", ("a", "*", "c")), ("#.a.#", ("#", "a", "#")), ("a..", ("a", "", ""))],
)
def test_parsed_words(text, words):
    parsed = amqp.parse_filter(text)
    assert (parsed.text, parsed.words, parsed.share_group) == (text, words, None)

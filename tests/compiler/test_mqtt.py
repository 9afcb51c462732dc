"""MQTT grammar and matching (compiler/mqtt.py docstring, MQTT 3.1.1 section 4.7, MQTT 5.0 section 4.8.2)."""

from __future__ import annotations

import pytest

from compiler import FilterError, TopicError, mqtt

VALID = ["a/b/+", "a/+/c", "a/#", "a/b/#", "#", "+/b/c", "+/+/+", "+", "/", "/+", "+/", "//",
         "sport/tennis/player1/#", "$SYS/#", "$SYS/+/x", "a/*", "$share/g/a/+", "$share/g/#",
         "$share/g/$SYS/#", "$share", "a" * 65535]
INVALID = ["", "a/#/c", "a+/b/c", "a/b#", "#/", "##", "a/++", "a\x00b", "$share/g", "$share/g/",
           "$share//a", "$share/g+/a", "$share/#/a", "$share/g/a/#/b", "a" * 65536, "a\udc80", None, 7]
NOT_MATCHING_A_B_C = ["a/b", "a/+", "+/b", "b/c/a", "a/b/d", "a/b/c/+", "+/+", "a/b/c/d/#"]
MATCHING_A_B_C = ["a/b/+", "a/+/c", "a/#", "a/b/#", "#", "+/b/c", "+/+/+", "a/b/c", "a/b/c/#", "+/#", "+/+/+/#"]
INVALID_TOPICS = ["", "a/+", "a/#", "+", "#", "a\x00b", "a" * 65536, "a\udc80"]


@pytest.mark.parametrize("text", VALID, ids=lambda t: repr(t)[:40])
def test_valid_filters_parse(text):
    assert mqtt.parse_filter(text).text == text


@pytest.mark.parametrize("text", INVALID, ids=lambda t: repr(t)[:40])
def test_invalid_filters_are_rejected(text):
    with pytest.raises(FilterError):
        mqtt.parse_filter(text)


@pytest.mark.parametrize("text", NOT_MATCHING_A_B_C)
def test_valid_filters_not_matching(text, mqtt_routing):
    assert mqtt_routing(text).ids("mq", "a/b/c") == []


@pytest.mark.parametrize("text", MATCHING_A_B_C)
def test_filters_matching(text, mqtt_routing):
    assert mqtt_routing(text).ids("mq", "a/b/c") == ["s0"]


@pytest.mark.parametrize("topic", INVALID_TOPICS, ids=lambda t: repr(t)[:40])
def test_invalid_topics_are_rejected(topic):
    with pytest.raises(TopicError):
        mqtt.parse_topic(topic)


@pytest.mark.parametrize(
    "text, message",
    [
        ("a/#/b", "'#' must be the last level: 'a/#/b'"),
        ("a/b#", "'#' must occupy a whole level: 'a/b#'"),
        ("a+/b", "'+' must occupy a whole level: 'a+/b'"),
        ("", "topic filter must not be empty"),
        ("$share/g", "needs '$share/<group>/<filter>'"),
        ("$share/g/", "needs a filter after the group"),
        ("$share//a", "group must not be empty"),
        ("$share/g#/a", "must not contain '+' or '#'"),
    ],
)
def test_errors_name_the_filter_and_the_problem(text, message):
    with pytest.raises(FilterError) as info:
        mqtt.parse_filter(text)
    assert message in str(info.value)


def test_spec_multi_level_wildcard(mqtt_routing):
    r = mqtt_routing("sport/tennis/player1/#", "sport/#")
    assert r.ids("mq", "sport/tennis/player1") == ["s0", "s1"]
    assert r.ids("mq", "sport/tennis/player1/ranking") == ["s0", "s1"]
    assert r.ids("mq", "sport/tennis/player1/score/wimbledon") == ["s0", "s1"]
    assert r.ids("mq", "sport") == ["s1"]


def test_spec_single_level_wildcard(mqtt_routing):
    r = mqtt_routing("sport/tennis/+", "sport/+", "+", "+/+", "/+")
    assert r.ids("mq", "sport/tennis/player1") == ["s0"]
    assert r.ids("mq", "sport/tennis/player2") == ["s0"]
    assert r.ids("mq", "sport/tennis/player1/ranking") == []
    assert r.ids("mq", "sport") == ["s2"]
    assert r.ids("mq", "sport/") == ["s1", "s3"]
    assert r.ids("mq", "/finance") == ["s3", "s4"]


def test_spec_dollar_topics(mqtt_routing):
    r = mqtt_routing("#", "+/monitor/Clients", "$SYS/#", "$SYS/monitor/+", "+/#", "$SYS/monitor/Clients")
    assert r.ids("mq", "$SYS/monitor/Clients") == ["s2", "s3", "s5"]
    assert r.ids("mq", "a/monitor/Clients") == ["s0", "s1", "s4"]
    assert r.ids("mq", "$SYS") == ["s2"]


def test_empty_levels_are_levels(mqtt_routing):
    r = mqtt_routing("/", "+/+", "/#", "#", "+")
    assert mqtt.parse_topic("/a") == ["", "a"]
    assert r.ids("mq", "/") == ["s0", "s1", "s2", "s3"]
    assert r.ids("mq", "a") == ["s3", "s4"]
    assert r.ids("mq", "//") == ["s2", "s3"]


def test_wildcard_free_levels_with_amqp_characters_are_literals(mqtt_routing):
    r = mqtt_routing("a/*", "a.b")
    assert r.ids("mq", "a/*") == ["s0"]
    assert r.ids("mq", "a/x") == []
    assert r.ids("mq", "a.b") == ["s1"]


def test_shared_subscription_parsing():
    parsed = mqtt.parse_filter("$share/consumers/sport/+/score")
    assert parsed.share_group == "consumers"
    assert parsed.words == ("sport", "+", "score")
    assert mqtt.parse_filter("sport/+").share_group is None
    assert mqtt.parse_filter("$share").words == ("$share",)


def test_shared_subscription_matches_like_its_filter(mqtt_routing):
    r = mqtt_routing("$share/g/a/#", "$share/g/#")
    assert r.ids("mq", "a") == ["s0", "s1"]
    assert r.ids("mq", "$SYS/x") == []


def test_topic_length_limit_counts_utf8_bytes():
    assert len(mqtt.parse_topic("é" * 32767)) == 1
    with pytest.raises(TopicError, match="65536 bytes"):
        mqtt.parse_topic("é" * 32768)

"""The reverse match of retained messages (issue 31): a new subscription's filter over
the retained topics, walk (:class:`compiler.retained_index.TopicTrie`) against
per-level inverted bitmaps (:class:`compiler.retained_index.LevelBitmaps`).

    python -m benchmarks retained-match [--topics 1000000] [--repeat 5] [--smoke]

Topics: ``t<i>/d<j>/m<k>`` with 100 first-level words, 1,000 second and 10 third
(``--topics`` of them, at most 1,000,000 distinct; 1,000,000 is every
combination), plus 1% under ``$SYS/``. Filters, one per shape the issue names:
``t7/+/m3`` (1,000 topics at 1M), ``t7/#`` (10,000), ``+/+/m3`` (100,000; the
``$SYS`` topics excluded by the ``$`` rule). Each structure is built once (its
build time printed), then each filter is matched ``--repeat`` times, the median
and the slowest printed with the topics it found (checked equal between the two).
The time includes turning the match into the list of topics, which the router needs.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

from compiler.retained_index import LevelBitmaps, TopicTrie

FILTERS = ("t7/+/m3", "t7/#", "+/+/m3")


def topics(count: int) -> list[str]:
    """``count`` topics of the three-level shape, then 1% of ``$SYS`` ones."""
    made = [f"t{i % 100}/d{(i // 1000) % 1000}/m{(i // 100) % 10}" for i in range(count)]
    return made + [f"$SYS/d{i}/m3" for i in range(count // 100)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="10,000 topics, 2 repeats")
    args = parser.parse_args(argv)
    if args.smoke:
        args.topics, args.repeat = 10_000, 2
    held = topics(min(args.topics, 1_000_000))
    print(f"{len(held):,} retained topics; {args.repeat} matches per filter", flush=True)
    results: dict[str, dict[str, tuple[float, float, int]]] = {}
    answers: dict[str, dict[str, int]] = {}
    for structure in (TopicTrie, LevelBitmaps):
        gc.collect()
        started = time.perf_counter()
        index = structure(held)
        built = time.perf_counter() - started
        print(f"{structure.__name__}: built in {built:.2f} s", flush=True)
        for filter_text in FILTERS:
            times = []
            for _ in range(args.repeat):
                started = time.perf_counter()
                found = index.match(filter_text)
                times.append(time.perf_counter() - started)
            results.setdefault(filter_text, {})[structure.__name__] = (
                statistics.median(times), max(times), len(found))
            answers.setdefault(filter_text, {})[structure.__name__] = len(set(found))
        del index
    print("| filter | topics matched | walk (trie) median / max ms | bitmaps median / max ms "
          "| walk / bitmaps |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for filter_text in FILTERS:
        walk, bitmaps = results[filter_text]["TopicTrie"], results[filter_text]["LevelBitmaps"]
        if answers[filter_text]["TopicTrie"] != answers[filter_text]["LevelBitmaps"]:
            raise SystemExit(f"{filter_text}: the two structures disagree: {answers[filter_text]}")
        print(f"| `{filter_text}` | {walk[2]:,} | {walk[0] * 1e3:.1f} / {walk[1] * 1e3:.1f} "
              f"| {bitmaps[0] * 1e3:.1f} / {bitmaps[1] * 1e3:.1f} | {walk[0] / bitmaps[0]:.2f}x |",
              flush=True)
    return 0

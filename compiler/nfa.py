"""Matching of filters with several ``#`` runs (AMQP ``#.a.#``, ``a.#.b.#.c``).

RabbitMQ's trie walk backtracks at every ``#`` (and 4.3.5 refuses bindings
with more than two). Here the distinct such filters are merged into one trie
and run as a nondeterministic automaton: the set of active trie nodes advances
one topic word at a time, so a topic of ``L`` words costs at most
``L x (trie nodes)`` steps, whatever the number of ``#``; no blow-up.

A node entered through a ``#`` edge loops on every word; entering any node
also enters its ``#`` child (``#`` may match zero words).
"""

from __future__ import annotations

from typing import Iterable, Sequence


class FilterAutomaton:
    """An automaton over a fixed set of filters, each given as its words and an
    integer label (the filter slot). ``one``/``many`` are the wildcard words.
    """

    __slots__ = ("_edges", "_one", "_many", "_loops", "_ends", "_start")

    def __init__(self, filters: Iterable[tuple[Sequence[str], int]], one: str, many: str) -> None:
        self._edges: list[dict[str, int]] = [{}]
        self._one: list[int] = [-1]
        self._many: list[int] = [-1]
        self._loops: list[bool] = [False]
        self._ends: list[list[int]] = [[]]
        for words, label in filters:
            node = 0
            for word in words:
                if word == one:
                    node = self._child(self._one, node, loops=False)
                elif word == many:
                    if self._loops[node]:
                        continue  # '#.#' matches what '#' matches
                    node = self._child(self._many, node, loops=True)
                else:
                    child = self._edges[node].get(word)
                    if child is None:
                        child = self._new_node(loops=False)
                        self._edges[node][word] = child
                    node = child
            self._ends[node].append(label)
        self._start = self._closure([0])

    def __len__(self) -> int:
        """Number of trie nodes."""
        return len(self._edges)

    def match(self, words: Sequence[str]) -> list[int]:
        """Labels of the filters matching ``words``, each once, in no particular order."""
        active = self._start
        edges, one, loops = self._edges, self._one, self._loops
        for word in words:
            step = []
            for node in active:
                child = edges[node].get(word)
                if child is not None:
                    step.append(child)
                if one[node] >= 0:
                    step.append(one[node])
                if loops[node]:
                    step.append(node)
            if not step:
                return []
            active = self._closure(step)
        out: list[int] = []
        for node in active:
            out += self._ends[node]
        return out

    def _new_node(self, loops: bool) -> int:
        self._edges.append({})
        self._one.append(-1)
        self._many.append(-1)
        self._loops.append(loops)
        self._ends.append([])
        return len(self._edges) - 1

    def _child(self, table: list[int], node: int, loops: bool) -> int:
        if table[node] < 0:
            table[node] = self._new_node(loops)
        return table[node]

    def _closure(self, nodes: list[int]) -> list[int]:
        """``nodes`` plus every node reachable through ``#`` edges, each once."""
        seen = set()
        out = []
        many = self._many
        for node in nodes:
            while node >= 0 and node not in seen:
                seen.add(node)
                out.append(node)
                node = many[node]
        return out

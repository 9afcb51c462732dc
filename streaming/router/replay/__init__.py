"""Replays of ``subscribe --since``.

- :mod:`~streaming.router.replay.replay`: a replay's boundary, range, chunks and progress;
- :mod:`~streaming.router.replay.requests`: what a ``since`` record may ask;
- :mod:`~streaming.router.replay.cli`: the client side of ``subscribe --since``.
"""

"""The publishes topic's lifecycle under the router.

- :mod:`~streaming.router.topics.retention`: publishes lost to retention, recorded as gaps;
- :mod:`~streaming.router.topics.incarnations`: the topic deleted and created again.
"""

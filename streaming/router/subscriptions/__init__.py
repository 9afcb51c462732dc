"""Subscription state: the changelog read into snapshot versions.

- :mod:`~streaming.router.subscriptions.changelog`,
  :mod:`~streaming.router.subscriptions.subscription_sync`: the subscription
  changelog read into new snapshot versions;
- :mod:`~streaming.router.subscriptions.snapshots`: the one owner of a batch's
  snapshot version (saved versions and their facts, pins, pruning, the live
  broadcast), and the store's read-only view;
- :mod:`~streaming.router.subscriptions.limits`: the limits a subscription is held to.
"""

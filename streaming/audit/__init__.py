"""The audit: the Delta tables of who got what, when and why.

- :mod:`~streaming.audit.writer`: the three tables, their schemas on disk and
  the exactly-once appends (delta-rs);
- :mod:`~streaming.audit.journal`, :mod:`~streaming.audit.committer`: a batch's
  rows journaled on its critical path and group-committed in the background;
- :mod:`~streaming.audit.properties`: the Delta table properties and Parquet writer
  properties every audit table carries;
- :mod:`~streaming.audit.maintenance`: compaction, retention, vacuum and log
  upkeep, so that a table's cost does not grow with time;
- :mod:`~streaming.audit.table_stats`: a table's size now (files, bytes, log entries);
- :mod:`~streaming.audit.migration`: older table layouts rewritten to the current one;
- :mod:`~streaming.audit.queries`: ``bitroute audit``'s look-ups (DataFusion);
- :mod:`~streaming.audit.sql`: ``bitroute sql`` (Spark SQL with delta-spark).
"""

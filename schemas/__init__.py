"""Record contracts: Kafka headers, changelog JSON fields and Delta table schemas.

The one place that names every field and header: :mod:`schemas.records`; the
Spark schemas of the audit tables and of the routing tasks' rows:
:mod:`schemas.tables`.
"""

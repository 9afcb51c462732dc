"""The user's own Spark session that docs/audit.md configures, as a script a test runs in
a child process (a JVM holds one SparkContext, whose jars and SQL extensions are fixed
when it starts, and the suite's shared session has no Delta)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPARK_TIMEOUT_S = 1800  # a bound, not an expectation: a Spark start takes 10-20 s on an idle 2-core machine


def docs_session_script(jars_folder: Path, warehouse: str) -> str:
    """docs/audit.md's pyspark block as it stands, its two paths replaced."""
    text = (ROOT / "docs" / "audit.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    [block] = [b for b in blocks if "spark.jars\"" in b and "DeltaSparkSessionExtension" in b]
    block, replaced = re.subn(r'^jars_folder = ".*?"', f"jars_folder = {str(jars_folder)!r}",
                              block, flags=re.M)
    assert replaced == 1
    block, replaced = re.subn(r'^warehouse = ".*?"', f"warehouse = {warehouse!r}", block,
                              flags=re.M)
    assert replaced == 1
    return block

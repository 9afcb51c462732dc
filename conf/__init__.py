"""Default configuration shipped with bitroute.

Data files, not code: ``bitroute.toml`` (the documented defaults read by
``streaming.config``) and ``jvm.toml`` (every JVM coordinate the project
resolves from Maven Central). ``path(name)`` returns a file's location.
"""

from importlib import resources
from pathlib import Path


def path(name: str) -> Path:
    """Return the filesystem path of a file shipped in this package."""
    return Path(str(resources.files(__name__).joinpath(name)))

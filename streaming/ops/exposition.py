"""The Prometheus exposition of a set of declared metrics: their samples, the text
format and the HTTP server.

The samples, the text format (version 0.0.4; OpenMetrics to a scraper that asks
for it) and the HTTP server are ``prometheus_client``'s (:class:`Registry` holds
one of its metrics per :class:`Metric` declaration and :class:`MetricsServer` is
its ``start_http_server``). What bitroute adds: a scrape sees a batch's updates
all or none (one lock around updates and collection), a gauge without a value
yet has no sample (rather than a 0 that would read as, say, batch 0), and no
``_created`` series (the names are exactly the declared ones).

What the router declares and feeds is :mod:`streaming.ops.metrics`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest, start_http_server
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import Metric as Family
from prometheus_client.validation import METRIC_LABEL_NAME_RE, METRIC_NAME_RE

from streaming.ops.errors import MetricsError

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
"""The answer's type to a plain ``GET`` (``curl``): text format 0.0.4."""
PATH = "/metrics"


@dataclass(frozen=True)
class Metric:
    """One metric family: ``kind`` is ``counter`` (name ends in ``_total``) or ``gauge``.

    Names and labels follow Prometheus's classic rules (what every scraper reads);
    a declaration breaking them is a ``ValueError``.
    """

    name: str
    kind: str
    help: str
    labels: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not METRIC_NAME_RE.match(self.name):
            raise ValueError(f"metric {self.name!r}: invalid name")
        if self.kind not in ("counter", "gauge"):
            raise ValueError(f"metric {self.name!r}: kind must be counter or gauge")
        if (self.kind == "counter") != self.name.endswith("_total"):
            raise ValueError(f"metric {self.name!r}: counters and only counters end in _total")
        if not all(METRIC_LABEL_NAME_RE.match(label) for label in self.labels):
            raise ValueError(f"metric {self.name!r}: invalid label name")


class Registry:
    """The declared metrics as ``prometheus_client`` metrics, in their own
    :class:`prometheus_client.CollectorRegistry` (:attr:`collectors`, what the server
    and :meth:`render` read). Thread-safe.

    Every update and every collection take one lock; :meth:`atomic` holds it
    across several updates, so a scrape sees a batch's counters all updated or
    none. A metric is updated with exactly its declared labels, a counter only
    goes up (``ValueError`` otherwise). A gauge without labels has no sample
    until it is first set.
    """

    def __init__(self, metrics: Iterable[Metric]) -> None:
        self._declared: dict[str, Metric] = {}
        self._metrics: dict[str, Counter | Gauge] = {}
        self._unset: set[str] = set()
        for metric in metrics:
            if metric.name in self._declared:
                raise ValueError(f"metric {metric.name!r}: repeated name")
            kind = Counter if metric.kind == "counter" else Gauge
            self._declared[metric.name] = metric
            self._metrics[metric.name] = kind(metric.name, metric.help, metric.labels,
                                              registry=None)
            if metric.kind == "gauge" and not metric.labels:
                self._unset.add(metric.name)
        self._lock = threading.RLock()
        self.collectors = CollectorRegistry()
        self.collectors.register(_Collector(self))

    def inc(self, name: str, amount: float = 1.0, **labels: object) -> None:
        """Add ``amount`` (>= 0) to a counter's sample."""
        if not amount >= 0:  # before the sample exists: a refused update leaves no trace
            raise ValueError(f"{name}: a counter only goes up: inc() needs a non-negative "
                             f"amount, got {amount!r}")
        metric = self._sample(name, "counter", labels)
        with self._lock:
            metric.inc(amount)

    def set(self, name: str, value: float, **labels: object) -> None:
        """Set a gauge's sample."""
        metric = self._sample(name, "gauge", labels)
        assert isinstance(metric, Gauge)  # _sample's kind "gauge"
        with self._lock:
            metric.set(value)
            self._unset.discard(name)

    @contextmanager
    def atomic(self) -> Iterator[Registry]:
        """Hold the lock across several updates: a scrape sees all of them or none."""
        with self._lock:
            yield self

    def clear(self, name: str) -> None:
        """Drop every sample of ``name`` (a family whose label values come and go)."""
        metric = self._family(name)
        with self._lock:
            metric.clear()

    def value(self, name: str, **labels: object) -> float | None:
        """A sample's current value, ``None`` when it has none yet."""
        wanted = {label: str(value) for label, value in labels.items()}
        for sample in self._samples(name):
            if sample.labels == wanted:
                return sample.value
        return None

    def label_values(self, name: str) -> list[tuple[str, ...]]:
        """The label values of every sample ``name`` has now."""
        declared = self._declared[name].labels
        return sorted(tuple(s.labels[label] for label in declared) for s in self._samples(name))

    def render(self) -> str:
        """The text exposition format 0.0.4: per family ``# HELP``, ``# TYPE``, then its
        samples (a family without samples yet has its two comment lines only)."""
        return generate_latest(self.collectors).decode("utf-8")

    def collect(self) -> list[Family]:
        """Every family with its samples now, in declaration order (under the lock)."""
        with self._lock:
            return [self._now(name) for name in self._metrics]

    def _now(self, name: str) -> Family:
        """``name``'s family now: no sample while unset, no ``_created`` series."""
        [family] = self._metrics[name].collect()
        family.samples = [] if name in self._unset else [
            s for s in family.samples if not s.name.endswith("_created")]
        return family

    def _samples(self, name: str) -> list:
        self._family(name)
        with self._lock:
            return self._now(name).samples

    def _family(self, name: str) -> Counter | Gauge:
        metric = self._metrics.get(name)
        if metric is None:
            raise ValueError(f"{name}: not a declared metric")
        return metric

    def _sample(self, name: str, kind: str, labels: Mapping[str, object]) -> Counter | Gauge:
        metric = self._family(name)
        declared = self._declared[name]
        if declared.kind != kind:
            raise ValueError(f"{name}: {'inc' if kind == 'counter' else 'set'}() needs a {kind}")
        if set(labels) != set(declared.labels):
            raise ValueError(f"{name}: labels {sorted(labels)} given, {list(declared.labels)} "
                             "declared")
        return metric.labels(**{k: str(v) for k, v in labels.items()}) if labels else metric


class _Collector:
    """The registry's families, as a ``prometheus_client`` collector."""

    def __init__(self, registry: Registry) -> None:
        self._registry = registry

    def collect(self) -> list[Family]:
        return self._registry.collect()

    def describe(self) -> list[Family]:
        return self._registry.collect()


class MetricsServer:
    """``GET /metrics`` over HTTP from a daemon thread, on ``host:port``
    (``prometheus_client.start_http_server``).

    :meth:`start` binds (raising :class:`MetricsError` naming the address when
    it cannot) and returns at once; each request is answered in its own daemon
    thread. Port 0 binds a free port (see :attr:`port`).
    """

    def __init__(self, registry: Registry, host: str, port: int) -> None:
        self._registry = registry
        self._host = host
        self._port = port
        self._server: WSGIServer | None = None

    @property
    def port(self) -> int:
        """The bound port (after :meth:`start`)."""
        return self._server.server_address[1] if self._server is not None else self._port

    @property
    def url(self) -> str:
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self.port}{PATH}"

    def start(self) -> None:
        try:
            self._server, _ = start_http_server(self._port, self._host,
                                                self._registry.collectors)
        except OSError as exc:
            raise MetricsError(f"cannot serve metrics on {self._host}:{self._port}: "
                               f"{exc.strerror or exc}") from None

    def stop(self) -> None:
        """Stop serving and close the socket (idempotent)."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()

"""The metrics endpoint, and the lines ``bitroute run`` prints as it routes.

Unit tests of the registry, the text format, the HTTP server, the input lag
and the progress lines need no Spark or Kafka; the end-to-end test scrapes a
real ``bitroute run`` child process while it routes on the session's broker.
"""

from __future__ import annotations

import io
import json
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import suppress
from pathlib import Path

import pytest

from isolation import isolated_settings
from router_process import RouterProcess, publish_keys
from streaming.cli.progress import BatchJson, BatchLines, CatchUpProgress, finished_line, progress_line
from streaming.config import Config, ConfigError, load
from streaming.kafka import client_verbs as client
from streaming.kafka.broker import free_port
from streaming.ops.exposition import CONTENT_TYPE, Metric, MetricsError, MetricsServer, Registry
from streaming.ops.metrics import METRICS, STAGES, RouterMetrics
from streaming.ops.query_progress import input_lag
from waiting import wait_until

OPERATIONS_DOC = Path(__file__).resolve().parents[3] / "docs" / "operations.md"
SCRAPE_DEADLINE_S = 300.0
_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_ESCAPE = re.compile(r"\\(.)", re.DOTALL)


def parse_exposition(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Samples of a text exposition by family name: ``{name: {((label, value), ...): value}}``.

    Reads the text format's sample lines (skipping comments); raises
    ``ValueError`` on a line it cannot read.
    """
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        found = _SAMPLE.match(line)
        if found is None:
            raise ValueError(f"not a sample line: {line!r}")
        name, labels, value = found.groups()
        pairs = tuple((k, _ESCAPE.sub(lambda m: "\n" if m.group(1) == "n" else m.group(1), v))
                      for k, v in _LABEL.findall(labels or ""))
        out.setdefault(name, {})[pairs] = float(value)
    return out


def _documented_names() -> list[str]:
    """The metric names in the table of docs/operations.md's Metrics section."""
    text = OPERATIONS_DOC.read_text()
    section = text.split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `(bitroute_[a-z_]+)", section, flags=re.MULTILINE)


# --- the registry and its text format --------------------------------------------------

def test_render_writes_help_type_and_samples_with_escaped_labels():
    registry = Registry([
        Metric("demo_events_total", "counter", "Events.\nSecond line with a \\ backslash.",
               ("kind",)),
        Metric("demo_level", "gauge", "A level."),
        Metric("demo_unset", "gauge", "Never set."),
    ])
    registry.inc("demo_events_total", kind='a "quoted"\nname')
    registry.inc("demo_events_total", 2.5, kind="b")
    registry.inc("demo_events_total", kind="b")
    registry.set("demo_level", 7)
    assert registry.render() == (
        "# HELP demo_events_total Events.\\nSecond line with a \\\\ backslash.\n"
        "# TYPE demo_events_total counter\n"
        'demo_events_total{kind="a \\"quoted\\"\\nname"} 1.0\n'
        'demo_events_total{kind="b"} 3.5\n'
        "# HELP demo_level A level.\n"
        "# TYPE demo_level gauge\n"
        "demo_level 7.0\n"
        "# HELP demo_unset Never set.\n"
        "# TYPE demo_unset gauge\n"
    )
    assert parse_exposition(registry.render()) == {
        "demo_events_total": {(("kind", 'a "quoted"\nname'),): 1.0, (("kind", "b"),): 3.5},
        "demo_level": {(): 7.0},
    }


def test_special_values_are_written_as_prometheus_reads_them():
    registry = Registry([Metric("demo_value", "gauge", "x", ("case",))])
    for case, value in (("nan", float("nan")), ("inf", float("inf")), ("ninf", float("-inf")),
                        ("big", 2.0 ** 60), ("small", 0.125)):
        registry.set("demo_value", value, case=case)
    lines = set(registry.render().splitlines()[2:])
    assert lines == {'demo_value{case="nan"} NaN', 'demo_value{case="inf"} +Inf',
                     'demo_value{case="ninf"} -Inf', 'demo_value{case="big"} 1.152921504606847e+18',
                     'demo_value{case="small"} 0.125'}


@pytest.mark.parametrize("declaration", [
    ("demo_events", "counter", "a counter must end in _total"),
    ("demo_level_total", "gauge", "a gauge must not"),
    ("demo level", "gauge", "bad name"),
    ("demo_x", "histogram", "unsupported kind"),
    ("demo_x", "gauge", "bad label", ("bad-label",)),
])
def test_bad_declarations_are_refused(declaration):
    with pytest.raises(ValueError):
        Metric(*declaration)


def test_a_name_is_declared_once():
    with pytest.raises(ValueError, match="repeated"):
        Registry([Metric("demo_level", "gauge", "a"), Metric("demo_level", "gauge", "b")])


def test_a_gauge_has_no_sample_until_set_and_no_created_series_is_exposed():
    registry = Registry([Metric("demo_total", "counter", "c"), Metric("demo_last", "gauge", "g")])
    assert parse_exposition(registry.render()) == {"demo_total": {(): 0.0}}
    assert registry.value("demo_last") is None
    registry.set("demo_last", 0)
    assert parse_exposition(registry.render()) == {"demo_total": {(): 0.0}, "demo_last": {(): 0.0}}
    assert "_created" not in registry.render()


def test_updates_must_match_the_declaration():
    registry = Registry([Metric("demo_total", "counter", "c", ("stage",)),
                         Metric("demo_gauge", "gauge", "g")])
    with pytest.raises(ValueError, match="labels"):
        registry.inc("demo_total")
    with pytest.raises(ValueError, match="non-negative"):
        registry.inc("demo_total", -1, stage="x")
    with pytest.raises(ValueError, match="needs a gauge"):
        registry.set("demo_total", 1, stage="x")
    with pytest.raises(ValueError, match="needs a counter"):
        registry.inc("demo_gauge")
    with pytest.raises(ValueError, match="not a declared metric"):
        registry.set("demo_other", 1)
    assert registry.value("demo_total", stage="x") is None


def test_concurrent_increments_are_all_counted_and_a_scrape_sees_whole_updates():
    registry = Registry([Metric("demo_a_total", "counter", "a"),
                         Metric("demo_b_total", "counter", "b")])
    torn: list[str] = []

    def work() -> None:
        for _ in range(5000):
            with registry.atomic() as r:
                r.inc("demo_a_total")
                r.inc("demo_b_total")

    def scrape() -> None:
        for _ in range(300):
            samples = parse_exposition(registry.render())
            a = samples.get("demo_a_total", {}).get(())
            if a != samples.get("demo_b_total", {}).get(()):
                torn.append(f"{a} != {samples.get('demo_b_total')}")

    threads = [threading.Thread(target=work) for _ in range(6)] + [threading.Thread(target=scrape)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert registry.value("demo_a_total") == registry.value("demo_b_total") == 30000
    assert not torn


def test_the_declared_metrics_are_the_documented_ones():
    declared = [m.name for m in METRICS]
    assert sorted(_documented_names()) == sorted(declared)
    assert all(m.name.startswith("bitroute_") for m in METRICS)


# --- the HTTP server -------------------------------------------------------------------

def _get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


def _get_as(url: str, accept: str) -> tuple[str, str]:
    request = urllib.request.Request(url, headers={"Accept": accept})
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.headers["Content-Type"], response.read().decode()


def test_the_server_answers_metrics_on_loopback_in_the_format_asked_for():
    registry = Registry([Metric("demo_total", "counter", "c")])
    registry.inc("demo_total", 3)
    server = MetricsServer(registry, "127.0.0.1", 0)
    server.start()
    try:
        assert server.url == f"http://127.0.0.1:{server.port}/metrics"
        status, content_type, body = _get(server.url)
        assert (status, content_type) == (200, CONTENT_TYPE)
        assert body == registry.render()
        registry.inc("demo_total")
        assert parse_exposition(_get(server.url)[2]) == {"demo_total": {(): 4.0}}
        # A Prometheus server asks for OpenMetrics first: same samples, same names.
        content_type, body = _get_as(server.url, "application/openmetrics-text;version=1.0.0")
        assert content_type.startswith("application/openmetrics-text")
        assert "demo_total 4.0" in body.splitlines() and body.endswith("# EOF\n")
    finally:
        server.stop()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(server.url, timeout=5)


def test_the_server_on_every_interface_answers_on_loopback_too():
    """metrics.host = "0.0.0.0" (docs/operations.md, "Metrics"; deploy/kubernetes/)."""
    registry = Registry([Metric("demo_total", "counter", "c")])
    server = MetricsServer(registry, "0.0.0.0", 0)
    server.start()
    try:
        status, _, body = _get(f"http://127.0.0.1:{server.port}/metrics")
        assert (status, body) == (200, registry.render())
    finally:
        server.stop()


def test_a_port_in_use_is_an_error_naming_the_address():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = MetricsServer(Registry([]), "127.0.0.1", port)
        with pytest.raises(MetricsError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            server.start()


def test_the_metrics_section_is_off_by_default_and_on_loopback_unless_told():
    config = load(environ={})
    assert (config.metrics.host, config.metrics.port) == ("127.0.0.1", 0)
    assert load(overrides={"metrics.port": "9464", "metrics.host": "::1"},
                environ={}).metrics.port == 9464
    assert load(environ={"BITROUTE_METRICS_PORT": "9464"}).metrics.port == 9464
    # A scraper on another host (a Kubernetes pod's Prometheus) needs another interface.
    for host in ("0.0.0.0", "10.1.2.3", "::"):
        assert load(overrides={"metrics.host": host}, environ={}).metrics.host == host
    for overrides, key in (({"metrics.host": "example.com"}, "metrics.host"),
                           ({"metrics.host": "10.1.2"}, "metrics.host"),
                           ({"metrics.port": "70000"}, "metrics.port"),
                           ({"metrics.port": "-1"}, "metrics.port")):
        with pytest.raises(ConfigError) as err:
            load(overrides=overrides, environ={})
        assert str(err.value).startswith(key)


# --- what feeds the metrics ------------------------------------------------------------

def test_input_lag_is_latest_minus_end_offsets_per_topic():
    sources = [{"description": "KafkaV2[Subscribe[pub]]",
                "endOffset": '{"pub":{"0":10,"1":4}}',
                "latestOffset": '{"pub":{"0":25,"1":4,"2":3}}'},
               {"description": "first trigger", "endOffset": '{"pub":{"0":1}}',
                "latestOffset": "None"},
               {"description": "not Kafka", "endOffset": "7", "latestOffset": "9"}]
    assert input_lag(sources) == {"pub": 15 + 0 + 3}
    assert input_lag([]) == {}


def test_router_metrics_count_batch_reports_and_query_events():
    from streaming.router.batch.report import BatchReport

    clock = iter([1000.0, 1005.0, 1010.0]).__next__
    metrics = RouterMetrics(load(environ={}).metrics, clock=clock)
    metrics.record_batch(BatchReport(0, 10, 25, 1, 3, 0.5, False,
                                     {"catch_up": 0.1, "route": 0.3, "audit": 0.1}))
    metrics.record_batch(BatchReport(0, 10, 25, 1, 3, 0.25, True,
                                     {"catch_up": 0.0, "route": 0.2, "audit": 0.05}))
    metrics.set_query_active(True)
    metrics.record_progress({
        "batchId": 0, "inputRowsPerSecond": 12.5, "processedRowsPerSecond": 40.0,
        "durationMs": {"triggerExecution": 750, "addBatch": 600},
        "sources": [{"endOffset": '{"pub":{"0":10}}', "latestOffset": '{"pub":{"0":14}}'}],
    })
    samples = parse_exposition(metrics.registry.render())

    def one(name: str, **labels: str) -> float:
        return samples[name][tuple(labels.items())]

    assert one("bitroute_start_time_seconds") == 1000.0
    assert one("bitroute_batches_total") == 2 and one("bitroute_batches_rerun_total") == 1
    # The former name stays, with the same value, until a later release removes it.
    assert one("bitroute_batches_replayed_total") == one("bitroute_batches_rerun_total")
    assert (one("bitroute_publishes_total"), one("bitroute_deliveries_total"),
            one("bitroute_rejected_total")) == (20, 50, 2)
    assert one("bitroute_batch_seconds_total") == pytest.approx(0.75)
    assert {stage: one("bitroute_batch_stage_seconds_total", stage=stage) for stage in STAGES} \
        == pytest.approx({"catch_up": 0.1, "route": 0.5, "audit": 0.15})
    assert (one("bitroute_last_batch_id"), one("bitroute_last_batch_timestamp_seconds"),
            one("bitroute_last_batch_seconds"), one("bitroute_snapshot_version")) == \
        (0, 1010.0, 0.25, 3)
    assert one("bitroute_query_active") == 1
    assert one("bitroute_query_input_rows_per_second") == 12.5
    assert one("bitroute_query_processed_rows_per_second") == 40.0
    assert one("bitroute_query_duration_seconds", phase="triggerExecution") == 0.75
    assert one("bitroute_input_lag_records", topic="pub") == 4
    metrics.record_progress({"durationMs": {"latestOffset": 5, "triggerExecution": 6},
                             "sources": []})
    samples = parse_exposition(metrics.registry.render())
    assert samples["bitroute_query_duration_seconds"] == {
        (("phase", "latestOffset"),): 0.005, (("phase", "triggerExecution"),): 0.006}
    metrics.record_idle()
    assert metrics.registry.value("bitroute_input_lag_records", topic="pub") == 0


# --- the lines bitroute run prints ---------------------------------------------------

def test_each_batch_is_one_line_on_stdout():
    from streaming.router.batch.report import BatchReport

    out = io.StringIO()
    lines = BatchLines(out)
    lines(BatchReport(7, 10, 25, 1, 3, 0.5, False, {"catch_up": 0.1, "route": 0.3, "audit": 0.1}))
    lines(BatchReport(7, 10, 25, 1, 3, 0.25, True, {"catch_up": 0.0, "route": 0.2, "audit": 0.05},
                      routed_in="driver"))
    assert out.getvalue().splitlines() == [
        "batch 7: 10 publishes, 25 deliveries, 1 rejected, snapshot v3, 0.50s "
        "(catch_up 0.10s route 0.30s audit 0.10s, routed in the executors)",
        "batch 7: 10 publishes, 25 deliveries, 1 rejected, snapshot v3, 0.25s "
        "(catch_up 0.00s route 0.20s audit 0.05s, routed in the driver) "
        "(re-run with its pinned version)",
    ]


def test_with_json_each_batch_is_one_json_object_of_the_report():
    from streaming.router.batch.report import BatchReport

    out = io.StringIO()
    lines = BatchJson(out, clock=lambda: 1700000000.5)
    lines(BatchReport(7, 10, 25, 1, 3, 0.5, False, {"catch_up": 0.1, "route": 0.3}))
    lines(BatchReport(8, 0, 0, 0, 3, 0.25, True, routed_in="driver", attempts=2))
    assert [json.loads(line) for line in out.getvalue().splitlines()] == [
        {"batch_id": 7, "rows": 10, "deliveries": 25, "rejected": 1, "snapshot_version": 3,
         "seconds": 0.5, "rerun": False, "stages": {"catch_up": 0.1, "route": 0.3},
         "attempts": 1, "routed_in": "executors", "lost": 0, "expired": 0,
         "finished_at": 1700000000.5, "replayed": False},
        {"batch_id": 8, "rows": 0, "deliveries": 0, "rejected": 0, "snapshot_version": 3,
         "seconds": 0.25, "rerun": True, "stages": {}, "attempts": 2,
         "routed_in": "driver", "lost": 0, "expired": 0,
         "finished_at": 1700000000.5, "replayed": True},
    ]

# --- catch-up progress lines -----------------------------------------------------------

def test_progress_and_final_lines_give_counts_rate_and_time_left():
    assert progress_line(412_000, 1_000_000, 4.2) == (
        "catching up the changelog: 412,000 of 1,000,000 records (98,095/s, about 6s left)")
    assert progress_line(100_000, 1_000_000, 2.0) == (
        "catching up the changelog: 100,000 of 1,000,000 records (50,000/s, about 18s left)")
    assert progress_line(1_000, 1_000_000, 2.0).endswith("(500/s, about 33m18s left)")
    assert progress_line(1, 1_000_000, 2.0).endswith("(0/s, about 555h33m left)")
    assert progress_line(0, 5, 3.0) == "catching up the changelog: 0 of 5 records (0/s)"
    assert finished_line(1_000_000, 10.2) == (
        "caught up the changelog: 1,000,000 records in 10.2s (98,039/s)")


def test_a_short_catch_up_is_silent_and_a_long_one_reports_every_two_seconds():
    now = [0.0]
    out = io.StringIO()
    short = CatchUpProgress(out, clock=lambda: now[0])
    for done, at in ((0, 0.0), (500, 0.5), (1000, 1.9)):
        now[0] = at
        short(done, 1000)
    assert out.getvalue() == ""

    now[0] = 100.0
    long = CatchUpProgress(out, clock=lambda: now[0])
    for done, at in ((0, 100.0), (100, 101.0), (250, 102.5), (300, 103.0), (500, 104.4),
                     (600, 104.6), (1000, 105.0)):
        now[0] = at
        long(done, 1000)
    assert out.getvalue().splitlines() == [
        "bitroute: catching up the changelog: 250 of 1,000 records (100/s, about 8s left)",
        "bitroute: catching up the changelog: 600 of 1,000 records (130/s, about 4s left)",
        "bitroute: caught up the changelog: 1,000 records in 5.0s (200/s)",
    ]


# --- end to end ------------------------------------------------------------------------

def _scrape(port: int) -> tuple[str, dict]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert response.headers["Content-Type"] == CONTENT_TYPE
        text = response.read().decode()
    return text, parse_exposition(text)


def _scrape_until(router: RouterProcess, port: int, done, what: str) -> tuple[str, dict]:
    def scraped() -> tuple[str, dict] | None:
        assert router.process.poll() is None, "bitroute run exited"
        text, samples = _scrape(port)
        if done(samples):
            return text, samples
        with suppress(queue.Empty):  # the counters move when a batch ends: its line
            router.seen.append(router.lines.get(timeout=1.0))
        return None

    return wait_until(scraped, f"the metrics showing {what}", SCRAPE_DEADLINE_S)


def test_a_running_router_serves_every_documented_metric_with_its_counts(
        base_config: Config, tmp_path: Path):
    port = free_port()
    settings = isolated_settings(base_config, tmp_path, **{"metrics.port": str(port)})
    config = load(overrides=settings, environ={})
    client.subscribe(config, "amq.topic", "alpha", "orders.#", sub_id="a1")
    client.subscribe(config, "mqtt", "beta", "door/+", sub_id="b1")
    client.subscribe(config, "mqtt", "beta", "door/#", sub_id="b2")
    router = RouterProcess(settings, tmp_path / "router.log")
    try:
        router.wait_for(re.compile(r"Ctrl-C stops after the current batch"))
        assert f"bitroute: metrics at http://127.0.0.1:{port}/metrics" in router.seen
        _, samples = _scrape(port)
        assert samples["bitroute_subscriptions"][()] == 3
        assert samples["bitroute_publishes_total"][()] == 0

        publish_keys(config, [("amq.topic", f"orders.{i}.paid") for i in range(5)]
                 + [("mqtt", "door/front")] * 3 + [("nope", "orders.x")])

        def routed(s: dict) -> bool:
            return bool(s["bitroute_publishes_total"][()] >= 9
                        and s.get("bitroute_input_lag_records")
                        and s.get("bitroute_query_duration_seconds"))

        text, samples = _scrape_until(router, port, routed, "9 publishes and a progress event")
    finally:
        status = router.terminate(signal.SIGTERM)
    assert status == 0, (tmp_path / "router.log").read_text()[-3000:]

    def one(name: str, **labels: str) -> float:
        return samples[name][tuple(labels.items())]

    assert one("bitroute_publishes_total") == 9
    assert one("bitroute_deliveries_total") == 5 + 3  # beta once per message, for 2 filters
    assert one("bitroute_rejected_total") == 1
    batches = one("bitroute_batches_total")
    assert 1 <= batches <= 9 and one("bitroute_batches_rerun_total") == 0
    assert one("bitroute_last_batch_id") == batches - 1
    assert time.time() - 300 < one("bitroute_last_batch_timestamp_seconds") <= time.time()
    stages = {s: one("bitroute_batch_stage_seconds_total", stage=s) for s in STAGES}
    assert all(seconds > 0 for seconds in stages.values()), stages
    assert one("bitroute_batch_seconds_total") == pytest.approx(sum(stages.values()), rel=0.01)
    assert one("bitroute_snapshot_version") >= 1
    assert one("bitroute_subscriptions") == 3
    assert one("bitroute_query_active") == 1
    assert one("bitroute_input_lag_records", topic=settings["kafka.publishes_topic"]) == 0
    assert one("bitroute_query_duration_seconds", phase="triggerExecution") > 0
    for metric in METRICS:
        assert f"# HELP {metric.name} " in text and f"# TYPE {metric.name} {metric.kind}\n" in text
        assert samples.get(metric.name), f"{metric.name} has no sample"


def test_a_metrics_port_in_use_stops_bitroute_run_before_spark(base_config: Config,
                                                                tmp_path: Path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        settings = isolated_settings(base_config, tmp_path, **{"metrics.port": str(port)})
        started = time.monotonic()
        result = subprocess.run(
            [sys.executable, "-m", "streaming.cli.main", "run",
             *[arg for k, v in settings.items() for arg in ("--set", f"{k}={v}")]],
            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith(
        f"bitroute: error: cannot serve metrics on 127.0.0.1:{port}: ")
    assert time.monotonic() - started < 30  # no Spark session was started

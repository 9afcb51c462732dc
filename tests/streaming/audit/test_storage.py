"""The audit warehouse on an object store: a real S3-compatible server (moto, a separate
process speaking HTTP on loopback), written by `bitroute run`, read back by `bitroute
audit` and `bitroute status`, maintained by `bitroute audit maintain`; concurrent
delta-rs commits that lose nothing; a store without conditional writes refused; one
router per publishes topic and warehouse, a router moved with its checkpoint folder
carrying on.
"""

from __future__ import annotations

import http.client
import http.server
import json
import re
import shutil
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from cli_runner import run_cli
from isolation import isolated_settings
from router_process import RouterProcess
from s3_server import S3Server
from streaming.audit import storage
from streaming.audit.storage import StorageError, check_commit_safety, storage_options
from streaming.config import Config, load
from streaming.kafka import client_verbs as client
from streaming.kafka.broker import free_port
from streaming.state import lease as router_lease
from waiting import wait_until

READY = re.compile(r"Ctrl-C stops after the current batch")


@pytest.fixture
def s3_env(s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """The server's AWS_* variables in this process's environment (and its children's)."""
    for name, value in s3.environ.items():
        monkeypatch.setenv(name, value)
    storage._checked.clear()
    return s3


def test_s3_settings_come_from_the_environment_only_and_hide_the_secret():
    config = load(overrides={"delta.warehouse": "s3://bucket/audit"}, environ={})
    env = {"AWS_ACCESS_KEY_ID": "AKIA1", "AWS_SECRET_ACCESS_KEY": "s3cr3t-value",
           "AWS_REGION": "eu-west-1", "AWS_ENDPOINT_URL": "https://s3.example:9000/",
           "AWS_SESSION_TOKEN": "t0ken-value"}
    options = storage_options(config.delta, env)
    assert options == {"AWS_ACCESS_KEY_ID": "AKIA1", "AWS_SECRET_ACCESS_KEY": "s3cr3t-value",
                       "AWS_SESSION_TOKEN": "t0ken-value", "AWS_REGION": "eu-west-1",
                       "AWS_ENDPOINT_URL": "https://s3.example:9000"}
    assert "s3cr3t" not in repr(options) and "t0ken" not in str(options)
    assert storage_options(load(overrides={"delta.warehouse": "/tmp/w"}, environ={}).delta,
                           env) == {}
    with pytest.raises(StorageError, match=r"no S3 credentials in the environment"):
        storage_options(config.delta, {"AWS_REGION": "eu-west-1"})
    with pytest.raises(StorageError, match=r"AWS_SECRET_ACCESS_KEY is not set"):
        storage_options(config.delta, {"AWS_ACCESS_KEY_ID": "AKIA1"})
    with pytest.raises(StorageError, match=r"plain http: set AWS_ALLOW_HTTP=true"):
        storage_options(config.delta, {**env, "AWS_ENDPOINT_URL": "http://127.0.0.1:9"})
    spark = storage.spark_settings(config.delta, env)
    assert spark["spark.hadoop.fs.s3a.endpoint"] == "https://s3.example:9000"
    assert not any("s3cr3t" in v or "AKIA1" in v for v in spark.values())


def test_concurrent_delta_rs_writers_on_s3_lose_no_commit(s3_env: S3Server):
    """The router's committer, its maintenance and `audit maintain` are delta-rs writers of
    the same tables: on S3 each commit is a conditional put, so racing appends all land."""
    config = load(overrides={"delta.warehouse": s3_env.warehouse("race")}, environ={})
    check_commit_safety(config.delta)  # moto honours If-None-Match
    options = storage_options(config.delta)
    uri = config.delta.table_path("t")
    write_deltalake(uri, pa.table({"w": pa.array([-1], pa.int64())}), storage_options=options)
    start = threading.Barrier(3)
    failures: list[BaseException] = []

    def writer(number: int) -> None:
        try:
            start.wait()
            for i in range(6):
                write_deltalake(uri, pa.table({"w": pa.array([number * 100 + i], pa.int64())}),
                                mode="append", storage_options=options)
        except BaseException as exc:  # noqa: BLE001 - the test asserts on every writer's failure
            failures.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not failures, failures
    table = DeltaTable(uri, storage_options=options)
    assert table.version() == 18
    assert sorted(table.to_pyarrow_table()["w"].to_pylist()) == \
        [-1] + sorted(n * 100 + i for n in range(3) for i in range(6))


def test_files_written_outside_delta_rs_reach_the_same_bucket(s3_env: S3Server):
    """warehouse_filesystem: the pyarrow filesystem of files written outside delta-rs (the
    routing tasks' audit files), with the same settings: what it writes, obstore lists."""
    import obstore
    import pyarrow.parquet as pq

    config = load(overrides={"delta.warehouse": s3_env.warehouse("files")}, environ={})
    filesystem, root = storage.warehouse_filesystem(config.delta)
    assert root == f"{s3_env.bucket}/files"
    pq.write_table(pa.table({"a": [1, 2]}), f"{root}/staged/part-0.parquet",
                   filesystem=filesystem)
    listed = [m["path"] for batch in obstore.list(storage.object_store(config.delta, "staged"))
              for m in batch]
    assert listed == ["part-0.parquet"]  # paths relative to the store's prefix
    assert pq.read_table(f"{root}/staged/part-0.parquet", filesystem=filesystem)["a"].to_pylist() \
        == [1, 2]


class _DroppingProxy(http.server.BaseHTTPRequestHandler):
    """Forwards to the S3 server without the conditional headers: a store that ignores them."""

    target: tuple[str, int]

    def _forward(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        headers = {k: v for k, v in self.headers.items()
                   if k.lower() not in ("if-none-match", "if-match", "host")}
        upstream = http.client.HTTPConnection(*self.target, timeout=30)
        upstream.request(self.command, self.path, body=body, headers=headers)
        answer = upstream.getresponse()
        data = answer.read()
        self.send_response(answer.status)
        for key, value in answer.getheaders():
            if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_PUT = do_HEAD = do_DELETE = do_POST = _forward

    def log_message(self, *_args) -> None:
        pass


def test_a_store_that_ignores_conditional_writes_is_refused_unless_allowed(
        s3_env: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    host, port = s3_env.endpoint.removeprefix("http://").split(":")
    handler = type("Proxy", (_DroppingProxy,), {"target": (host, int(port))})
    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{proxy.server_port}")
        config = load(overrides={"delta.warehouse": s3_env.warehouse("unsafe"),
                                 "streaming.checkpoint_dir": str(tmp_path / "c")}, environ={})
        with pytest.raises(StorageError, match=r"ignores conditional writes \(If-None-Match\)"
                                               r".*delta.allow_unsafe_commits = true"):
            check_commit_safety(config.delta)
        lease = router_lease.RouterLease(config)
        with pytest.raises(StorageError, match=r"ignores conditional writes"):
            lease.acquire(lambda: "r1")  # a router on it is refused before it writes
        check_commit_safety(config.delta, allow_unsafe=True)  # the operator's opt-in
    finally:
        proxy.shutdown()


def test_an_unreachable_endpoint_or_a_missing_credential_is_one_line(s3_env: S3Server, monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path: Path, cli):
    settings = {"delta.warehouse": s3_env.warehouse("nowhere"), "streaming.checkpoint_dir": str(tmp_path / "c")}
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    started = time.monotonic()
    result = cli("audit", "deliveries", settings=settings)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bitroute: error: "), result.stderr
    assert "error sending request" in lines[0] and time.monotonic() - started < 60
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    result = cli("audit", "maintain", settings=settings)
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"bitroute: error: delta.warehouse {settings['delta.warehouse']}: AWS_SECRET_ACCESS_KEY "
        "is not set (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY go together)"
    )


def _rows(settings: dict[str, str], table: str) -> list[dict]:
    result = run_cli("audit", table, "--json", settings=settings)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_routers_on_an_s3_warehouse_audit_there_one_per_topic_and_move_with_their_checkpoint(
    base_config: Config, s3_env: S3Server, tmp_path: Path, cli
):
    settings = isolated_settings(
        base_config,
        tmp_path,
        **{"delta.warehouse": s3_env.warehouse(f"wh-{tmp_path.name}"), "audit.commit_interval": "500 milliseconds"},
    )
    config = load(overrides=settings, environ={})
    client.subscribe(config, "amq.topic", "alpha", "orders.#", sub_id="a1")
    first = RouterProcess(settings, tmp_path / "first.log")
    try:
        first.wait_for(READY)
        client.publish(config, "amq.topic", "orders.eu.paid", b"1")
        first.wait_for(re.compile(r"^batch \d+: 1 publishes, 1 deliveries"))
        rows = wait_until(lambda: _rows(settings, "deliveries"), "the audit row on S3", 60)
        assert [(r["subscriber"], r["routing_key"]) for r in rows] == [("alpha", "orders.eu.paid")]

        # A second router on the same topic and warehouse, another checkpoint folder.
        other = {**settings, "streaming.checkpoint_dir": str(tmp_path / "other")}
        second = cli("run", settings=other, timeout=300)
        assert second.returncode == 1, second.stderr[-2000:]
        refusal = second.stderr.strip().splitlines()[-1]
        holder = _lease_record(config)
        assert refusal.startswith(
            f"bitroute: error: cannot start the router: another router routes "
            f"{settings['kafka.publishes_topic']} into {settings['delta.warehouse']}: router "
            f"{holder['router_id']} on {holder['host']} (pid {first.process.pid}, checkpoint "
            f"{settings['streaming.checkpoint_dir']}, epoch 1), renewed "
        ), refusal
        assert not (tmp_path / "other" / "publishes").exists()  # it routed nothing

        client.publish(config, "amq.topic", "orders.us.paid", b"2")
        first.wait_for(re.compile(r"^batch \d+: 1 publishes, 1 deliveries"))  # still routes
        maintain = cli("audit", "maintain", "--json", settings=settings)  # beside the router
        assert maintain.returncode == 0, maintain.stderr
        assert json.loads(maintain.stdout)["ok"] is True
        status = json.loads(cli("status", "--json", settings=settings).stdout)
        assert status["lease"]["router_id"] == holder["router_id"]
        deliveries = status["audit_tables"]["deliveries"]
        assert deliveries["version"] >= 1 and deliveries["log_entries"] >= 2, deliveries
    finally:
        first.kill()  # gone without releasing its lease

    # The checkpoint folder moved to another host (another path, the lease naming the old
    # host): the same router id carries on at once and routes what was published meanwhile.
    moved = tmp_path / "moved"
    shutil.move(settings["streaming.checkpoint_dir"], moved)
    record = _lease_record(config)
    blob = router_lease._blob(config)
    read = blob.read()
    assert read is not None
    data, tag = read
    blob.replace(json.dumps({**record, "host": "old-host"}).encode(), tag)
    client.publish(config, "amq.topic", "orders.asia.paid", b"3")
    again = RouterProcess({**settings, "streaming.checkpoint_dir": str(moved)}, tmp_path / "moved.log")
    try:
        again.wait_for(READY)
        wait_until(lambda: len(_rows(settings, "deliveries")) == 3, "3 audit rows", 120)
        record = _lease_record(config)
        assert (record["host"], record["checkpoint_dir"], record["epoch"]) == (holder["host"], str(moved), 2)
    finally:
        assert again.terminate() == 0
    assert _lease_record(config)["released_at"] is not None
    routed = sorted(r["routing_key"] for r in _rows(settings, "deliveries"))
    assert routed == ["orders.asia.paid", "orders.eu.paid", "orders.us.paid"]


def test_bitroute_sql_reads_an_s3_warehouse_through_s3a_and_refuses_to_write_it(s3_env: S3Server, tmp_path: Path, cli):
    settings = {
        "delta.warehouse": s3_env.warehouse(f"sql-{tmp_path.name}"),
        "streaming.checkpoint_dir": str(tmp_path / "c"),
        "spark.master": "local[1]",
        "spark.log_level": "ERROR",
        # One task where Spark and Delta plan 4 and 50 (shuffle, the log's read):
        # each task is a round trip to S3, and the tables hold one file.
        "spark.shuffle_partitions": "1",
        "spark.options.spark.databricks.delta.snapshotPartitions": "1",
    }
    config = load(overrides=settings, environ={})
    uri = config.delta.table_path("deliveries")
    write_deltalake(
        uri, pa.table({"subscriber": ["alpha", "beta", "alpha"]}), storage_options=storage_options(config.delta)
    )
    result = cli(
        "sql",
        "--json",
        "SELECT subscriber, count(*) AS n FROM deliveries GROUP BY subscriber ORDER BY subscriber",
        settings=settings,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert [json.loads(line) for line in result.stdout.splitlines()] == [
        {"subscriber": "alpha", "n": 2},
        {"subscriber": "beta", "n": 1},
    ]
    assert s3_env.environ["AWS_SECRET_ACCESS_KEY"] not in result.stdout + result.stderr
    refused = cli("sql", "OPTIMIZE deliveries", settings=settings, timeout=900)
    assert refused.returncode == 1
    assert (
        refused.stderr.strip()
        .splitlines()[-1]
        .startswith(
            f"bitroute: error: bitroute sql does not write to {settings['delta.warehouse']} "
            "(OptimizeTableCommand): Delta-Spark's commits on S3 are not safe"
        )
    ), refused.stderr[-2000:]
    assert DeltaTable(uri, storage_options=storage_options(config.delta)).version() == 0


def _lease_record(config) -> dict:
    """The lease's record as stored (there is one)."""
    record = router_lease.read(config)
    assert record is not None, "no lease record"
    return record

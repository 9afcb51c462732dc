"""A real S3-compatible server on loopback for the object-store tests: moto in server mode.

:func:`running` starts ``python -m moto.server`` as a separate process speaking
S3 over HTTP on a free loopback port (not an in-process patch: every client,
delta-rs, obstore, pyarrow, a `bitroute` child process, talks HTTP to it),
creates a bucket, and hands back the environment a bitroute process needs to
reach it. The credentials are made up for the test; moto accepts any.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from streaming.kafka.broker import free_port
from waiting import wait_until


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    bucket: str
    environ: dict[str, str]
    """AWS_* variables that point a process at this server (with made-up credentials)."""

    def warehouse(self, prefix: str) -> str:
        return f"s3://{self.bucket}/{prefix}"


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


@contextmanager
def running(log: Path, bucket: str = "bitroute-test") -> Iterator[S3Server]:
    port = free_port()
    with log.open("ab") as out:
        process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1",
                                    "-p", str(port)], stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    try:
        wait_until(lambda: _answers(port) or process.poll() is not None,
                   "the S3 server to listen", timeout=60)
        assert process.poll() is None, log.read_text()[-2000:]
        endpoint = f"http://127.0.0.1:{port}"
        environ = {"AWS_ACCESS_KEY_ID": "bitroute-test-key",
                   "AWS_SECRET_ACCESS_KEY": "bitroute-test-secret-0123456789",
                   "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint,
                   "AWS_ALLOW_HTTP": "true"}
        import boto3  # moto's own dependency: only to create the bucket

        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                     aws_access_key_id=environ["AWS_ACCESS_KEY_ID"],
                     aws_secret_access_key=environ["AWS_SECRET_ACCESS_KEY"]
                     ).create_bucket(Bucket=bucket)
        yield S3Server(endpoint, bucket, environ)
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=15)

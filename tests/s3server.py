"""A real S3-compatible server for the tests: moto's standalone server as its own process on 127.0.0.1.

Not a mocked client: the app's boto3 client talks HTTP to another process, which a test can stop (the bucket
unreachable) and start again on the same port. moto keeps its objects in memory, so a restart starts empty;
:meth:`MotoServer.start` makes the test's buckets again.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import boto3

CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class MotoServer:
    def __init__(self, *, check_credentials: bool = False) -> None:
        # moto accepts any key unless its IAM checks are on from the first request; then every key we know
        # of is unknown to it, which is what refused credentials look like.
        self.env = {**os.environ, **({"INITIAL_NO_AUTH_ACTION_COUNT": "0"} if check_credentials else {})}
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.buckets: set[str] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self) -> Any:
        return boto3.client("s3", endpoint_url=self.url, region_name="us-east-1", **CREDENTIALS)

    def start(self, timeout: float = 60) -> MotoServer:
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=self.env)
        deadline = time.monotonic() + timeout  # a hung-start stop only, not a speed bound
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("moto's S3 server did not start") from None
                time.sleep(0.05)
        if self.env.get("INITIAL_NO_AUTH_ACTION_COUNT"):
            return self
        client = self.client()
        for bucket in sorted(self.buckets):
            client.create_bucket(Bucket=bucket)
        return self

    def freeze(self) -> None:
        """SIGSTOP: the port still accepts connections (the kernel's backlog) but nothing is ever answered, as
        with a hung gateway or a bucket host that stalls."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(30)
            self.proc = None

    def new_bucket(self) -> str:
        bucket = f"photos-{secrets.token_hex(4)}"
        self.client().create_bucket(Bucket=bucket)
        self.buckets.add(bucket)
        return bucket

    def settings_for(self, bucket: str, **extra: Any) -> dict[str, Any]:
        """The settings overrides that point picpeak-lite at ``bucket`` on this server."""
        return {"storage": "s3", "s3_endpoint_url": self.url, "s3_bucket": bucket, "s3_region": "us-east-1",
                "s3_access_key_id": CREDENTIALS["aws_access_key_id"],
                "s3_secret_access_key": CREDENTIALS["aws_secret_access_key"], **extra}

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return sorted(item["Key"] for page in pages for item in page.get("Contents", ()))

    def __enter__(self) -> MotoServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

"""Real S3-compatible servers for the tests, each its own process on 127.0.0.1: moto's standalone server, and
s3rver (a Node.js implementation, installed from ``tests/s3rver/package.json`` by ``.ci/run``).

Not a mocked client: the app's boto3 client talks HTTP to another process, which a test can stop (the bucket
unreachable) and start again on the same port. moto keeps its objects in memory, so a restart starts empty;
:meth:`MotoServer.start` makes the test's buckets again.

Two implementations because S3-compatible services differ where it matters: moto answers a completed multipart
upload with AWS's ETag (the MD5 of the parts' MD5s, ``-N``); s3rver with the whole object's MD5, as some
S3-compatible services do. Code that is right on one only fails on the other.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, ClassVar

import boto3

CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


S3RVER = Path(__file__).parent / "s3rver" / "node_modules" / "s3rver" / "bin" / "s3rver.js"


class S3Server:
    """One S3-compatible server process on a free port of 127.0.0.1 (a subclass says which)."""

    name = ""
    aborts_uploads = True  # AbortMultipartUpload removes the upload's parts
    private_buckets = True  # an object fetched without a signature is refused
    credentials: ClassVar[dict[str, str]] = CREDENTIALS

    def __init__(self, env: dict[str, str] | None = None, host: str = "127.0.0.1") -> None:
        self.env = env or dict(os.environ)
        self.host = host  # the address to listen on (the multi-host suite's bridge address)
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.buckets: set[str] = set()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def client(self) -> Any:
        return boto3.client("s3", endpoint_url=self.url, region_name="us-east-1", **self.credentials)

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self, timeout: float = 60) -> S3Server:
        self.proc = subprocess.Popen(self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     env=self.env)
        deadline = time.monotonic() + timeout  # a hung-start stop only, not a speed bound
        while True:
            try:
                with socket.create_connection((self.host, self.port), timeout=1):
                    break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{self.name}'s S3 server did not start") from None
                time.sleep(0.05)
        if self.env.get("INITIAL_NO_AUTH_ACTION_COUNT"):
            return self
        client = self.client()
        for bucket in sorted(self.buckets - self.kept_buckets()):
            client.create_bucket(Bucket=bucket)
        return self

    def kept_buckets(self) -> set[str]:
        """The buckets a restarted server still has (its objects kept on disk): not made again."""
        return set()

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
                "s3_access_key_id": self.credentials["aws_access_key_id"],
                "s3_secret_access_key": self.credentials["aws_secret_access_key"], **extra}

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return sorted(item["Key"] for page in pages for item in page.get("Contents", ()))

    def pending_uploads(self, bucket: str) -> list[str]:
        """The multipart uploads begun and neither completed nor aborted."""
        return [u["Key"] for u in self.client().list_multipart_uploads(Bucket=bucket).get("Uploads", [])]

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class MotoServer(S3Server):
    name = "moto"

    def __init__(self, *, check_credentials: bool = False) -> None:
        # moto accepts any key unless its IAM checks are on from the first request; then every key we know
        # of is unknown to it, which is what refused credentials look like.
        super().__init__({**os.environ, **({"INITIAL_NO_AUTH_ACTION_COUNT": "0"} if check_credentials else {})})

    def command(self) -> list[str]:
        return [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]


class S3rverServer(S3Server):
    """s3rver, objects on disk in a directory of its own (so a restart keeps them). It knows one key pair,
    S3RVER/S3RVER, and does not implement ListMultipartUploads (its upload directories are looked at instead) nor
    AbortMultipartUpload (it answers 204 and keeps the parts), and it serves any object without a signature (it
    has no access control)."""

    name = "s3rver"
    aborts_uploads = False
    private_buckets = False
    credentials: ClassVar[dict[str, str]] = {"aws_access_key_id": "S3RVER", "aws_secret_access_key": "S3RVER"}

    def __init__(self, host: str = "127.0.0.1") -> None:
        super().__init__(host=host)
        if not S3RVER.exists():
            raise RuntimeError(f"s3rver is not installed ({S3RVER} is missing): run `npm ci --prefix tests/s3rver` "
                               "(the README's test command does), with Node.js and npm on the PATH")
        self.directory = Path(tempfile.mkdtemp(prefix="s3rver-"))

    def command(self) -> list[str]:
        return ["node", str(S3RVER), "-d", str(self.directory), "-a", self.host, "-p", str(self.port), "-s",
                "--no-vhost-buckets"]

    def kept_buckets(self) -> set[str]:
        return {bucket for bucket in self.buckets if (self.directory / bucket).is_dir()}

    def pending_uploads(self, bucket: str) -> list[str]:
        uploads = self.directory / bucket / "._S3rver_uploads"
        return sorted(p.name for p in uploads.iterdir()) if uploads.exists() else []

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        shutil.rmtree(self.directory, ignore_errors=True)


SERVERS = {"moto": MotoServer, "s3rver": S3rverServer}

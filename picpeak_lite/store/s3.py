"""Photo files as objects in an S3-compatible bucket (AWS S3, Backblaze B2, Wasabi, Cloudflare R2, MinIO).

The only module that imports the client library (boto3/botocore). Object names are the same as the local
layout's (``store/storage.py``), under ``s3_prefix``; only ``tmp/`` stays on the local disk, and the disk
reserve applies to it as before.

Durable means in the bucket: :meth:`S3Storage.put_file` uploads a temp file (one PUT up to
:data:`MULTIPART_THRESHOLD`, a multipart upload above it), sends each part's MD5 and SHA-256 for the server to
verify, checks the ETag of each PUT and each part against the MD5 computed while reading (a multipart object
then by its size and any SHA-256 the server answers, not by its ETag, whose form differs between services), and
checks the SHA-256 of what was sent against the one the intake computed while receiving (the row's). Only then
does it return, and only then is the row committed.

Errors are turned into ours at this boundary: a missing object is FileNotFoundError (as a missing file is), an
unreachable endpoint, a timeout or a 5xx is ``StorageUnavailable`` (503 with Retry-After: nothing recorded, a
worker's photo handed back without counting an attempt), and refused credentials at start are a ConfigError
with a sentence (``check_access``).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import logging
import secrets
import shutil
import urllib.parse
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path, PurePath, PurePosixPath
from typing import Any, BinaryIO, cast

import boto3
import botocore.exceptions
from botocore.config import Config

from picpeak_lite.config import Settings
from picpeak_lite.errors import ConfigError, StorageUnavailable
from picpeak_lite.store.storage import (
    TEMP_PREFIX,
    LocalCopy,
    ObjectInfo,
    PhotoFiles,
    disk_errors,
    ensure_space,
    original_name,
    remove_quietly,
    sweep_temp,
)

log = logging.getLogger(__name__)

MB = 1024 * 1024
MULTIPART_THRESHOLD = 16 * MB  # one PUT up to this (read into memory once), a multipart upload above it
PART_BYTES = 8 * MB  # S3's smallest part is 5 MiB; 8 MiB keeps a 2 GB original under 256 parts
READ_CHUNK = 1024 * 1024
PRESIGN_SECONDS = 300  # a guest's redirect is good for five minutes: long enough to start, short enough to not share
RETRY_AFTER = 10
_NOT_FOUND = {"404", "NoSuchKey", "NotFound", "NoSuchUpload"}
# forget_original's deletes: two threads of their own, so that the intake's synchronous exit never waits on the
# network (a bucket that does not answer would hold the event loop for its timeouts).
_FORGET = ThreadPoolExecutor(max_workers=2, thread_name_prefix="picpeak-s3-forget")
_CREDENTIALS = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403", "InvalidToken",
                "ExpiredToken", "AuthorizationHeaderMalformed"}


@dataclass(frozen=True, eq=False)
class S3Storage(PhotoFiles):
    root: Path  # the data directory: the database and tmp/ stay local
    bucket: str
    prefix: str
    client: Any = field(repr=False)
    presigned_redirects: bool = False
    multipart_threshold: int = MULTIPART_THRESHOLD
    part_bytes: int = PART_BYTES
    kind = "s3"

    @classmethod
    def from_settings(cls, s: Settings) -> S3Storage:
        config = Config(
            region_name=s.s3_region or None,
            s3={"addressing_style": s.s3_addressing_style},
            # Few, quick retries: an upload waiting on a dead bucket holds its client; a 503 tells it to come back.
            # A bucket that accepts the connection and then says nothing (a frozen process, a hung gateway)
            # held uploads for as long as it was frozen: 3 attempts (``max_attempts`` counts retries) of a 60 s
            # read timeout. Now two attempts in all, and each wait for the next bytes (connect, send, read) is
            # s3_timeout_seconds, so an upload has its 503 within about twice that (plus botocore's 1 s wait for
            # "100 Continue" per attempt). The timeout is per socket operation: a large part on a slow uplink
            # is not cut off.
            retries={"total_max_attempts": 2, "mode": "standard"},
            connect_timeout=s.s3_timeout_seconds, read_timeout=s.s3_timeout_seconds, max_pool_connections=32,
            # We send our own Content-MD5 and SHA-256 per request (below); no second checksum per body.
            request_checksum_calculation="when_required", response_checksum_validation="when_required",
            # SigV4 for presigned URLs too: botocore signs them with SigV2 when the region is empty or us-east-1,
            # which SigV4-only services (and AWS's newer regions) refuse.
            signature_version="s3v4",
        )
        # Credentials: the config file's when set, else boto3's standard chain (AWS_ACCESS_KEY_ID /
        # AWS_SECRET_ACCESS_KEY in the environment, then ~/.aws).
        client = boto3.client("s3", endpoint_url=s.s3_endpoint_url or None,
                              aws_access_key_id=s.s3_access_key_id or None,
                              aws_secret_access_key=s.s3_secret_access_key or None, config=config)
        prefix = s.s3_prefix.strip("/")
        return cls(root=s.data_path, bucket=s.s3_bucket, prefix=f"{prefix}/" if prefix else "", client=client,
                   presigned_redirects=s.s3_presigned_redirects)

    # --- the local side: temp files
    @property
    def tmp_dir(self) -> Path:
        return self.root / "tmp"

    def create_dirs(self) -> None:
        self.tmp_dir.mkdir(parents=True, exist_ok=True)

    def new_temp_path(self) -> Path:
        return self.tmp_dir / f"{TEMP_PREFIX}{secrets.token_hex(12)}"

    def ensure_space(self, incoming: int) -> None:
        ensure_space(self.root, incoming)

    def sweep_temp(self, max_age: float, now: float | None = None) -> int:
        return sweep_temp(self.tmp_dir, max_age, now)

    def disk_usage(self) -> shutil._ntuple_diskusage:
        return shutil.disk_usage(self.root)

    def describe(self) -> str:
        return f"bucket {self.bucket!r}" + (f" under {self.prefix!r}" if self.prefix else "")

    def check_access(self) -> None:
        """One HEAD of the bucket at start, so that a wrong setting is one clear sentence, not a traceback."""
        where = f"the S3 bucket {self.bucket!r} at {self.client.meta.endpoint_url}"
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except botocore.exceptions.NoCredentialsError:
            raise ConfigError(f"no credentials for {where}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
                              "or s3_access_key_id and s3_secret_access_key in the config file") from None
        except botocore.exceptions.ClientError as error:
            code = _code(error)
            if code in _CREDENTIALS:
                raise ConfigError(f"{where} refused the credentials ({code}): check AWS_ACCESS_KEY_ID and "
                                  "AWS_SECRET_ACCESS_KEY (or s3_access_key_id / s3_secret_access_key)") from None
            if code in _NOT_FOUND or code == "NoSuchBucket":
                raise ConfigError(f"{where} does not exist: create it, or correct s3_bucket") from None
            raise ConfigError(f"{where} answered {code}: {error}") from None
        except (botocore.exceptions.BotoCoreError, ValueError) as error:
            raise ConfigError(f"cannot reach {where}: {error}") from None

    # --- objects by name
    def _key(self, name: str) -> str:
        return self.prefix + name

    def local_path(self, name: str) -> Path | None:
        return None

    def location(self, name: str) -> PurePath:
        return PurePosixPath(self.bucket, self._key(name))

    def exists(self, name: str) -> bool:
        try:
            self.stat(name)
        except FileNotFoundError:
            return False
        return True

    def stat(self, name: str) -> ObjectInfo:
        with _errors(name):
            head = self.client.head_object(Bucket=self.bucket, Key=self._key(name))
        return ObjectInfo(head["ContentLength"], head["LastModified"].timestamp(), head["ETag"])

    def open(self, name: str, start: int = 0, end: int | None = None) -> BinaryIO:
        """A reader of the object (from ``start`` to ``end``, exclusive), streamed as it is read."""
        return cast(BinaryIO, self._reader(name, start, end))

    def _reader(self, name: str, start: int = 0, end: int | None = None) -> _Reader:
        extra = {"Range": f"bytes={start}-{'' if end is None else end - 1}"} if start or end is not None else {}
        with _errors(name):
            got = self.client.get_object(Bucket=self.bucket, Key=self._key(name), **extra)
        return _Reader(got["Body"], name, got["ContentLength"])

    def read_range(self, name: str, start: int, length: int) -> bytes:
        with self.open(name, start, start + length) as f:
            return f.read()

    def read_bytes(self, name: str) -> bytes:
        with self.open(name) as f:
            return f.read()

    def local_copy(self, name: str) -> LocalCopy:
        """Download to a temp file (the disk reserve applies); the caller closes it on every path."""
        reader = self._reader(name)
        try:
            self.ensure_space(reader.size)
            temp = self.new_temp_path()
            self.create_dirs()  # a tidied data directory: cheap, and the copy must not fail for it
            try:
                with disk_errors(), open(temp, "xb") as out:
                    while chunk := reader.read(READ_CHUNK):
                        out.write(chunk)
            except BaseException:
                remove_quietly(temp)
                raise
        finally:
            reader.close()
        return LocalCopy(temp, temporary=True)

    def sha256_of(self, name: str) -> str:
        digest = hashlib.sha256()
        with self.open(name) as f:
            while chunk := f.read(READ_CHUNK):
                digest.update(chunk)
        return digest.hexdigest()

    def presigned_url(self, name: str, *, content_type: str, disposition: str | None = None) -> str | None:
        if not self.presigned_redirects:
            return None
        params = {"Bucket": self.bucket, "Key": self._key(name), "ResponseContentType": content_type,
                  "ResponseCacheControl": "private, no-cache"}
        if disposition is not None:
            params["ResponseContentDisposition"] = disposition
        url: str = self.client.generate_presigned_url("get_object", Params=params, ExpiresIn=PRESIGN_SECONDS)
        return url

    def presigned_origin(self) -> str | None:
        """Where the client's presigned URLs point, taken from one it signs (no request is sent): the endpoint's
        origin, or AWS's virtual-host or path-style one, exactly as botocore builds it for this bucket."""
        if not self.presigned_redirects:
            return None
        url = urllib.parse.urlsplit(self.client.generate_presigned_url(
            "get_object", Params={"Bucket": self.bucket, "Key": self._key("originals/")}, ExpiresIn=60))
        return f"{url.scheme}://{url.netloc}"

    # --- writes
    def link_original(self, source: Path, key: str) -> None:
        raise ConfigError("Originals can be referenced in place only with local storage; this server stores them "
                          "in a bucket, so the hot folder copies them.")

    def referenced_source(self, key: str) -> Path | None:
        return None

    def commit_original(self, temp: Path, key: str, sha256: str | None = None) -> None:
        """Upload ``temp`` as the original, verified (see the module docstring); the temp file is then removed."""
        self.put_file(temp, original_name(key), sha256)

    def put_file(self, temp: Path, name: str, sha256: str | None = None) -> None:
        size = temp.stat().st_size
        with open(temp, "rb") as f:
            if size <= self.multipart_threshold:
                data = f.read()
                sent = hashlib.sha256(data).hexdigest()
                if sha256 is not None and sent != sha256:
                    raise OSError(f"the temp file of {name} changed on disk before its upload")
                self._put(name, data, sent)
            else:
                self._put_multipart(name, f, sha256)
        remove_quietly(temp)

    def put_bytes(self, name: str, data: bytes) -> None:
        self._put(name, data, hashlib.sha256(data).hexdigest())

    def _put(self, name: str, data: bytes, sha256: str) -> None:
        md5 = hashlib.md5(data, usedforsecurity=False).digest()
        with _errors(name):
            answer = self.client.put_object(
                Bucket=self.bucket, Key=self._key(name), Body=data, ContentType=_content_type(name),
                ContentMD5=_b64(md5), ChecksumSHA256=_b64(bytes.fromhex(sha256)), Metadata={"sha256": sha256})
        _verify_etag(name, answer.get("ETag", ""), md5.hex())

    def _put_multipart(self, name: str, f: BinaryIO, expected: str | None) -> None:
        """Each part is verified by the ETag its UploadPart answer carries (the part's MD5 on every S3-compatible
        service, for all but SSE-KMS), and the completed object by its size (a HEAD) and, where the server echoes
        one, its SHA-256 checksum. Never by the completed upload's ETag: its form differs between services (AWS
        and moto: the MD5 of the parts' MD5s with ``-N``; others: the whole object's MD5, or an opaque string)."""
        key = self._key(name)
        digest = hashlib.sha256()
        with _errors(name):
            upload = self.client.create_multipart_upload(
                Bucket=self.bucket, Key=key, ContentType=_content_type(name), ChecksumAlgorithm="SHA256",
                Metadata={"sha256": expected or ""})
        upload_id = upload["UploadId"]
        completed = False
        try:
            parts, part_shas = [], []
            number = sent = 0
            while data := f.read(self.part_bytes):
                number += 1
                sent += len(data)
                digest.update(data)
                md5 = hashlib.md5(data, usedforsecurity=False).digest()
                part_sha = hashlib.sha256(data).digest()
                with _errors(name):
                    answer = self.client.upload_part(
                        Bucket=self.bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=data,
                        ContentMD5=_b64(md5), ChecksumSHA256=_b64(part_sha))
                _verify_etag(f"{name} part {number}", answer["ETag"], md5.hex())
                parts.append({"PartNumber": number, "ETag": answer["ETag"], "ChecksumSHA256": _b64(part_sha)})
                part_shas.append(part_sha)
            if expected is not None and digest.hexdigest() != expected:
                raise OSError(f"the temp file of {name} changed on disk during its upload")
            with _errors(name):
                done = self.client.complete_multipart_upload(
                    Bucket=self.bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts})
            completed = True
            composite = _b64(hashlib.sha256(b"".join(part_shas)).digest())
            _verify_checksum(name, done.get("ChecksumSHA256"),
                             {composite, f"{composite}-{number}", _b64(digest.digest())})
            with _errors(name):
                stored = self.client.head_object(Bucket=self.bucket, Key=key)["ContentLength"]
            if stored != sent:
                raise OSError(f"the bucket stored {name} with {stored} bytes where {sent} were sent")
        except BaseException:
            if completed:  # stored, but not as sent: no object of that name is better than a wrong one
                self.remove(name)
                raise
            try:
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
            except Exception:  # the bucket expires abandoned uploads by its own rules; nothing more to do here
                log.warning("could not abort the multipart upload of %s", name)
            raise

    def remove(self, name: str) -> None:
        """Delete an object; a missing one is fine. If the bucket cannot be reached the object stays: it has no
        row any more, so the reconciler removes it as an orphan once the bucket answers again."""
        try:
            with _errors(name):
                self.client.delete_object(Bucket=self.bucket, Key=self._key(name))
        except (FileNotFoundError, StorageUnavailable) as error:
            if isinstance(error, StorageUnavailable):
                log.warning("could not delete %s from the bucket (%s); the reconciler removes it later", name,
                            error.message)

    def forget_original(self, key: str) -> None:
        """Delete an original without waiting: queued to a thread of its own; one that fails stays an orphan."""
        name = original_name(key)
        _FORGET.submit(self.remove, name)

    def list_objects(self, prefix: str) -> Iterator[tuple[str, ObjectInfo]]:
        """Every object under ``prefix``, a page (up to 1000) at a time."""
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self._key(prefix))
        with _errors(prefix):
            for page in pages:
                for item in page.get("Contents", ()):
                    name = item["Key"][len(self.prefix):]
                    yield name, ObjectInfo(item["Size"], item["LastModified"].timestamp(), item["ETag"])


class _Reader(io.RawIOBase):
    """An object's body as a file: ``read`` maps the client's errors to ours; ``size`` is its length."""

    def __init__(self, body: Any, name: str, size: int) -> None:
        super().__init__()
        self._body = body
        self._name = name
        self.size = size

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        with _errors(self._name):
            data: bytes = self._body.read(None if size is None or size < 0 else size)
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            self._body.close()
        super().close()


@contextlib.contextmanager
def _errors(name: str) -> Iterator[None]:
    """Turn the client's exceptions into ours (see the module docstring)."""
    try:
        yield
    except botocore.exceptions.ClientError as error:
        code = _code(error)
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        if code in _NOT_FOUND:
            raise FileNotFoundError(name) from None
        if status >= 500 or code in ("SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout"):
            log.warning("the bucket answered %s for %s", code or status, name)
            raise StorageUnavailable(retry_after=RETRY_AFTER) from error
        if code in _CREDENTIALS:
            log.error("the bucket refused the credentials (%s) for %s", code, name)
            raise StorageUnavailable("The photo storage refused the server's credentials; nothing was saved.",
                                     retry_after=RETRY_AFTER) from error
        raise
    except (botocore.exceptions.BotoCoreError, ConnectionError, TimeoutError) as error:
        log.warning("the bucket did not answer (%s: %s)", type(error).__name__, error)
        raise StorageUnavailable(retry_after=RETRY_AFTER) from error


def _code(error: botocore.exceptions.ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _content_type(name: str) -> str:
    return "image/jpeg" if name.endswith(".jpg") else "application/octet-stream"


def _verify_etag(what: str, etag: str, expected: str) -> None:
    """The ETag of an unencrypted PUT or UploadPart is the MD5 of what the server stored, on every S3-compatible
    service. An ETag of another shape (SSE-KMS) is not a digest; the server verified Content-MD5 then. (Not for
    a completed multipart upload: see ``_put_multipart``.)"""
    etag = etag.strip('"')
    looks_like_md5 = len(etag.split("-", 1)[0]) == 32 and all(c in "0123456789abcdef-" for c in etag)
    if looks_like_md5 and etag != expected:
        raise OSError(f"the bucket stored {what} with another checksum than was sent ({etag} != {expected})")


def _verify_checksum(what: str, echoed: str | None, accepted: set[str]) -> None:
    """A SHA-256 the server computed itself, where it answers one: of the parts' checksums (AWS's composite form,
    with or without ``-N``) or of the whole object. A server that echoes none leaves the size check."""
    if echoed and echoed not in accepted:
        raise OSError(f"the bucket stored {what} with another SHA-256 than was sent ({echoed})")

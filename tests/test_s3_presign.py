"""Presigned URLs and the pages' CSP, without a server: botocore signs locally, so these check what the client
builds for each kind of setting (AWS in each region, an endpoint of another service)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from picpeak_lite.services import Services
from picpeak_lite.store.db import Database
from picpeak_lite.store.s3 import S3Storage
from picpeak_lite.web.app import create_app

from .conftest import make_settings

KEYS = {"s3_access_key_id": "AKIDEXAMPLE", "s3_secret_access_key": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"}


@pytest.mark.parametrize("region", ["", "us-east-1", "eu-central-1"])
def test_presigned_urls_are_sigv4_in_every_region(tmp_path: Path, region: str) -> None:
    """botocore signs presigned URLs with SigV2 when the region is empty or us-east-1 unless told otherwise;
    SigV4-only services refuse those."""
    settings = make_settings(tmp_path, storage="s3", s3_bucket="photos", s3_region=region,
                             s3_presigned_redirects=True, **KEYS)
    url = S3Storage.from_settings(settings).presigned_url("originals/ab/abcd", content_type="image/jpeg")
    assert url is not None
    query = parse_qs(urlsplit(url).query)
    assert query["X-Amz-Algorithm"] == ["AWS4-HMAC-SHA256"], url
    assert "X-Amz-Signature" in query and "Signature" not in query and "AWSAccessKeyId" not in query


@pytest.mark.parametrize(("extra", "origin"), [
    ({"s3_endpoint_url": "http://127.0.0.1:9000"}, "http://127.0.0.1:9000"),
    ({"s3_endpoint_url": "https://acct.r2.cloudflarestorage.com", "s3_region": "auto"},
     "https://acct.r2.cloudflarestorage.com"),
    ({"s3_region": "eu-central-1", "s3_addressing_style": "path"}, "https://s3.eu-central-1.amazonaws.com"),
    ({"s3_region": "eu-central-1", "s3_addressing_style": "virtual"}, "https://photos.s3.eu-central-1.amazonaws.com"),
])
def test_the_pages_csp_allows_the_bucket_origin_for_images_and_media(tmp_path: Path, extra: dict[str, str],
                                                                     origin: str) -> None:
    settings = make_settings(tmp_path, storage="s3", s3_bucket="photos", s3_presigned_redirects=True,
                             **KEYS, **extra)
    storage = S3Storage.from_settings(settings)
    assert storage.presigned_origin() == origin
    url = storage.presigned_url("derived/ab/abcd.grid.jpg", content_type="image/jpeg")
    assert url is not None and url.startswith(origin + "/")
    without = S3Storage.from_settings(make_settings(tmp_path, storage="s3", s3_bucket="photos", **KEYS, **extra))
    assert without.presigned_origin() is None


async def test_the_app_sends_the_csp_with_the_bucket_only_when_redirecting(tmp_path: Path) -> None:
    for redirects, wanted in ((True, " http://127.0.0.1:9000"), (False, "")):
        settings = make_settings(tmp_path / str(redirects), storage="s3", s3_bucket="photos",
                                 s3_endpoint_url="http://127.0.0.1:9000", s3_presigned_redirects=redirects, **KEYS)
        settings.data_path.mkdir(parents=True)
        svc = Services(settings=settings, db=Database(settings.database))
        try:
            response = await create_app(svc).test_client().get("/healthz")
        finally:
            svc.db.close()
        csp = dict(part.strip().split(" ", 1) for part in response.headers["Content-Security-Policy"].split(";"))
        assert csp["img-src"] == f"'self' data: blob:{wanted}" and csp["media-src"] == f"'self'{wanted}"
        assert csp["default-src"] == "'self'"

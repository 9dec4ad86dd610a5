"""The bake's feed, on loopback: the agent archive served once to the bake server's one-time
token, and the server's report of a failed bake, which ends the bake at its step with the
server's reason instead of waiting out the timeout."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests

from sp00ky_infra.controller.bake import BakeError, BakeRequest, ImageFeed, bake
from sp00ky_infra.controller.images import PoolImage
from sp00ky_infra.hetzner.client import HetznerAPI
from sp00ky_infra.rehearse.cloud import TOKEN, FakeHetzner
from sp00ky_infra.shared.cloud_init import agent_archive

IMAGE = PoolImage("registry", "registry.example/render@sha256:" + "b" * 64)


@pytest.fixture
def feed() -> Iterator[ImageFeed]:
    with ImageFeed("127.0.0.1") as serving:
        yield serving


def _get(feed: ImageFeed, path: str, token: str) -> requests.Response:
    return requests.get(feed.url + path, headers={"Authorization": f"Bearer {token}"}, timeout=10)


def test_the_agent_archive_is_served_once_to_its_own_token(feed: ImageFeed) -> None:
    request = feed.for_request(BakeRequest("shop", "render", IMAGE))
    assert (request.feed_url, request.feed_token) == (feed.url, feed.token)
    assert _get(feed, "/agent", feed.token).status_code == 404  # the image token is not it
    first = _get(feed, "/agent", request.agent_token)
    assert first.status_code == 200 and first.content == agent_archive()
    assert _get(feed, "/agent", request.agent_token).status_code == 404  # spent
    assert _get(feed, f"/images/{IMAGE.reference}", feed.token).status_code == 404  # none served


def test_a_failure_the_bake_server_reports_ends_the_bake_at_its_step(feed: ImageFeed) -> None:
    refused = requests.post(f"{feed.url}/failed", json={"reason": "x"}, timeout=10)
    assert refused.status_code == 404 and feed.failed is None  # not without the token
    told = requests.post(
        f"{feed.url}/failed", json={"reason": "apt-get install docker.io exited 100"},
        headers={"Authorization": f"Bearer {feed.token}"}, timeout=10,
    )  # fmt: skip
    assert told.status_code == 204
    lines: list[str] = []
    with FakeHetzner() as cloud:
        api = HetznerAPI(TOKEN, cloud.url, wait=lambda *_: 0.0)
        request = feed.for_request(BakeRequest("shop", "render", IMAGE, server_type="cx23"))
        with pytest.raises(BakeError) as failed:
            bake(api, request, lines.append, timeout=600, every=0.01, reported=lambda: feed.failed)
        assert cloud.servers == {} and cloud.snapshots == {}  # the bake server deleted
    assert failed.value.step == "install"
    assert str(failed.value).startswith("bake server ")
    assert str(failed.value).endswith("failed: apt-get install docker.io exited 100")

"""The fake Hetzner API's images, over real HTTP on 127.0.0.1: GET /images lists the system
images it knows and the docker-ce app image, with the real API's filters and sort; POST
/servers boots an image by name or by id, and answers an unknown one as the API does."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import requests

from sp00ky_infra.rehearse.cloud import TOKEN, FakeHetzner

AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def fake() -> Iterator[FakeHetzner]:
    with FakeHetzner() as api:
        yield api


def _images(fake: FakeHetzner, **params: Any) -> list[dict[str, Any]]:
    answer = requests.get(f"{fake.url}/images", headers=AUTH, params=params, timeout=10)
    assert answer.status_code == 200, answer.text
    found: list[dict[str, Any]] = answer.json()["images"]
    return found


def _create(fake: FakeHetzner, image: object, name: str = "m1") -> requests.Response:
    body = {"name": name, "server_type": "cx33", "image": image, "location": "fsn1"}
    return requests.post(f"{fake.url}/servers", headers=AUTH, json=body, timeout=10)


def test_the_public_images_are_the_system_images_and_the_docker_ce_app(
    fake: FakeHetzner,
) -> None:
    listed = _images(fake)
    assert [(i["name"], i["type"]) for i in listed] == [
        ("docker-ce", "app"),
        ("debian-12", "system"),
        ("ubuntu-24.04", "system"),
        ("ubuntu-22.04", "system"),
    ]
    app = _images(fake, type="app")
    assert [(i["name"], i["os_flavor"], i["os_version"]) for i in app] == [
        ("docker-ce", "ubuntu", "24.04")
    ]
    assert set(app[0]) >= {"id", "status", "description", "architecture", "labels", "deprecated"}
    assert [i["name"] for i in _images(fake, name="debian-12")] == ["debian-12"]
    assert _images(fake, architecture="arm") == []
    assert len(_images(fake, architecture="x86")) == 4


def test_snapshots_are_found_by_label_selector_newest_first_and_never_by_name(
    fake: FakeHetzner,
) -> None:
    old = fake.add_snapshot({"sp00ky/agent": "abc"}, datetime(2026, 1, 1, tzinfo=UTC))
    new = fake.add_snapshot({"sp00ky/agent": "abc"}, datetime(2026, 6, 1, tzinfo=UTC))
    fake.add_snapshot({"sp00ky/agent": "other"}, datetime(2026, 9, 1, tzinfo=UTC))
    found = _images(fake, type="snapshot", label_selector="sp00ky/agent=abc", sort="created:desc")
    assert [i["id"] for i in found] == [new["id"], old["id"]]
    assert found[0]["name"] is None
    assert [i["id"] for i in _images(fake, type="snapshot", sort="created")][:2] == [
        old["id"],
        new["id"],
    ]
    assert _images(fake, name="snapshot") == []


def test_a_deprecated_image_is_listed_only_when_asked_for(fake: FakeHetzner) -> None:
    deprecated = fake.add_snapshot({"os": "debian"})
    deprecated["deprecated"] = "2026-01-01T00:00:00+00:00"
    assert _images(fake, type="snapshot") == []
    assert [i["id"] for i in _images(fake, type="snapshot", include_deprecated="true")] == [
        deprecated["id"]
    ]


def test_one_image_by_id_and_an_unknown_id_is_not_found(fake: FakeHetzner) -> None:
    docker_ce = _images(fake, name="docker-ce")[0]
    one = requests.get(f"{fake.url}/images/{docker_ce['id']}", headers=AUTH, timeout=10)
    assert one.json()["image"] == docker_ce
    missing = requests.get(f"{fake.url}/images/999999", headers=AUTH, timeout=10)
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"


def test_a_server_boots_an_image_by_name_or_by_id(fake: FakeHetzner) -> None:
    snapshot = fake.add_snapshot({"sp00ky/agent": "abc"})
    by_name = _create(fake, "docker-ce", "m1")
    assert by_name.status_code == 201, by_name.text
    assert by_name.json()["server"]["image"]["name"] == "docker-ce"
    for name, ref in (("m2", snapshot["id"]), ("m3", str(snapshot["id"]))):
        made = _create(fake, ref, name)
        assert made.status_code == 201, made.text
        assert made.json()["server"]["image"]["id"] == snapshot["id"]


@pytest.mark.parametrize("image", ["debian-99", 999999, "999999"])
def test_an_unknown_image_is_refused_as_hetzner_refuses_it(
    fake: FakeHetzner, image: object
) -> None:
    answer = _create(fake, image)
    assert answer.status_code == 422
    assert answer.json()["error"] == {
        "code": "invalid_input",
        "message": "image not found",
        "details": {},
    }
    assert fake.servers == {}


def test_a_label_selector_that_does_not_parse_is_invalid_input(fake: FakeHetzner) -> None:
    answer = requests.get(
        f"{fake.url}/servers", headers=AUTH, params={"label_selector": "=x"}, timeout=10
    )
    assert answer.status_code == 422
    assert answer.json()["error"]["code"] == "invalid_input"

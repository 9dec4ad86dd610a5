"""The agents' hot routes (poll, result) are answered in front of the framework: the same
shapes and statuses as its routes and the OpenAPI document say, on a real controller."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
import requests

from sp00ky_infra.client import Client
from tests.controllers import ControllerProcess, paused_controller


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ControllerProcess, Client]]:
    with paused_controller(tmp_path_factory.mktemp("hot")) as served:
        yield served


def _validation_schema(controller: ControllerProcess, path: str) -> dict[str, Any]:
    """The 422 body the OpenAPI document promises for ``path``, with its components."""
    spec = requests.get(f"{controller.agents_url}/v1/openapi.json", timeout=10).json()
    response = spec["paths"][path]["post"]["responses"]["422"]
    schema = response["content"]["application/json"]["schema"]
    return {**schema, "components": spec["components"]}


@pytest.mark.parametrize(
    ("body", "content_type", "where"),
    [
        (b"{not json", "application/json", ["body"]),
        (b"^\xf3\xa0\x14\xf5\x9c", "application/json", ["body"]),  # not even UTF-8
        (b'{"free_slots": -1}', "application/json", ["body", "free_slots"]),
        (b'{"wait": 61}', "application/json", ["body", "wait"]),
        (b'{"running": [{"job": 5}]}', "application/json", ["body", "running", 0, "job"]),
        (b"{}", "text/plain", ["body"]),
    ],
)
def test_a_poll_the_model_refuses_gets_the_documented_422(
    served: tuple[ControllerProcess, Client], body: bytes, content_type: str, where: list[Any]
) -> None:
    controller, _ = served
    answer = requests.post(
        f"{controller.agents_url}/v1/machines/m1/poll",
        data=body,
        headers={"Authorization": "Bearer x", "Content-Type": content_type},
        timeout=10,
    )
    assert answer.status_code == 422, answer.text
    detail = answer.json()
    schema = _validation_schema(controller, "/v1/machines/{name}/poll")
    jsonschema.validate(detail, schema)
    assert detail["detail"][0]["loc"][: len(where)] == where


def test_a_poll_and_a_result_answer_as_the_controller_decides(
    served: tuple[ControllerProcess, Client],
) -> None:
    """401 without a session or with another machine's, a reply with the lease and the
    controller's clock, and 409 for a result of an attempt that is not current."""
    controller, client = served
    base = f"{controller.agents_url}/v1/machines/hot-m1"
    refused = requests.post(f"{base}/poll", json={}, timeout=10)
    assert refused.status_code == 401
    assert "Authorization: Bearer" in refused.json()["error"]
    other = requests.post(
        f"{base}/poll", json={}, headers={"Authorization": "Bearer nope"}, timeout=10
    )
    assert other.status_code == 401
    assert "unknown machine 'hot-m1'" in other.json()["error"]

    headers = {"Authorization": f"Bearer {controller.join(client, 'hot-m1')}"}
    another = requests.post(
        f"{base}/poll", json={}, headers={"Authorization": "Bearer nope"}, timeout=10
    )
    assert another.status_code == 401
    assert "session is not machine 'hot-m1''s" in another.json()["error"]
    assert requests.post(f"{base}/ready", json={"ok": True}, headers=headers, timeout=10).ok
    polled = requests.post(f"{base}/poll", json={"free_slots": 1}, headers=headers, timeout=10)
    assert polled.status_code == 200, polled.text
    assert polled.headers["content-type"] == "application/json"
    reply = polled.json()
    assert reply["assignments"] == [] and reply["stop"] == [] and reply["drain"] is False
    assert reply["lease"] > 0 and abs(reply["now"] - time.time()) < 60

    stale = requests.post(
        f"{base}/jobs/nope/attempts/a1/result",
        json={"status": "success", "result": {"ok": True}},
        headers=headers,
        timeout=10,
    )
    assert stale.status_code == 409, stale.text
    assert "no job 'nope'" in stale.json()["error"]
    wrong = requests.post(
        f"{base}/jobs/nope/attempts/a1/result",
        json={"status": "maybe"},
        headers=headers,
        timeout=10,
    )
    assert wrong.status_code == 422
    jsonschema.validate(
        wrong.json(),
        _validation_schema(controller, "/v1/machines/{name}/jobs/{job}/attempts/{attempt}/result"),
    )
    assert wrong.json()["detail"][0]["loc"] == ["body", "status"]

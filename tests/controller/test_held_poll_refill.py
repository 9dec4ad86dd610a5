"""A full machine's held poll that a result posted on its own answers carries the next job for
the slot that result freed, when the agent says it takes work there (``refill``); otherwise it
answers empty, as the agent then polls again with the slot free. On a real controller, the
machine played over its agents' API."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from sp00ky_infra.client import Client
from tests.controllers import ControllerProcess, paused_controller


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[ControllerProcess, Client]]:
    with paused_controller(tmp_path) as served:
        yield served


def _held_until_freed(
    controller: ControllerProcess, client: Client, refill: bool
) -> tuple[dict[str, Any], str, str]:
    """A ready one-slot machine runs a job; a second waits; its held poll (no free slot) is
    answered by the first job's result posted on its own: that answer, and both job ids."""
    base = f"{controller.agents_url}/v1/machines/m1"
    headers = {"Authorization": f"Bearer {controller.join(client, 'm1')}"}
    assert requests.post(f"{base}/ready", json={"ok": True}, headers=headers, timeout=10).ok
    first = client.run("renderer", "/render", {"gameId": "first"})
    assert controller.admin("POST", "/pools/render/resume").status_code == 200
    polled = requests.post(f"{base}/poll", json={"free_slots": 1}, headers=headers, timeout=10)
    ((running,),) = [polled.json()["assignments"]]
    assert running["job"] == first.id
    second = client.run("renderer", "/render", {"gameId": "second"})
    answers: list[dict[str, Any]] = []
    held = {
        "free_slots": 0,
        "wait": 20,
        "refill": refill,
        "running": [{"job": first.id, "attempt": running["attempt"], "fresh": True}],
    }
    poll = threading.Thread(
        target=lambda: answers.append(
            requests.post(f"{base}/poll", json=held, headers=headers, timeout=30).json()
        )
    )
    poll.start()
    try:
        time.sleep(0.3)  # the poll is held by then (were it not, its first pass answers alike)
        done = requests.post(
            f"{base}/jobs/{first.id}/attempts/{running['attempt']}/result",
            json={"status": "success", "result": {"ok": True}},
            headers=headers,
            timeout=10,
        )
        assert done.status_code == 200, done.text
    finally:
        poll.join(timeout=30)
    (answer,) = answers
    return answer, first.id, second.id


def test_the_answer_to_a_refill_poll_carries_the_next_job(
    served: tuple[ControllerProcess, Client],
) -> None:
    controller, client = served
    answer, _, second = _held_until_freed(controller, client, refill=True)
    assert [each["job"] for each in answer["assignments"]] == [second]
    assert client.store.get(second).status == "processing"


def test_without_refill_the_freed_slot_s_poll_answers_empty(
    served: tuple[ControllerProcess, Client],
) -> None:
    controller, client = served
    answer, _, second = _held_until_freed(controller, client, refill=False)
    assert answer["assignments"] == []
    assert client.store.get(second).status == "pending"

"""A full machine's results go beside its held poll, on a poll answered at once: that answer
carries the next job for the slot the result freed, and the held poll stays held (a kill still
reaches it at once). When the poll beside it claims nothing (no work due), the held poll
answers, so that the agent polls again offering the slot, and a job that arrives later reaches
it. On a real controller, the one-slot machine played over its agents' API."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from sp00ky_infra.client import Client
from tests.controllers import (
    ControllerProcess,
    backend_app,
    project,
    running_controller,
    wait_for,
)

# the default lease: a poll is held up to 20 s, longer than any wait here
TIMINGS = "lease=90s,idleTimeout=60s,bootTimeout=15s"


class Machine:
    """Machine m1, ready, over the agents' API: its polls, one of them held on a thread."""

    def __init__(self, controller: ControllerProcess, client: Client) -> None:
        self.base = f"{controller.agents_url}/v1/machines/m1"
        self.headers = {"Authorization": f"Bearer {controller.join(client, 'm1')}"}
        self.answers: list[dict[str, Any]] = []
        self.thread: threading.Thread | None = None
        assert self.post("ready", {"ok": True}).ok

    def post(self, path: str, body: dict[str, Any], timeout: float = 10) -> requests.Response:
        return requests.post(
            f"{self.base}/{path}", json=body, headers=self.headers, timeout=timeout
        )

    def poll(self, body: dict[str, Any]) -> dict[str, Any]:
        answer = self.post("poll", body)
        assert answer.status_code == 200, answer.text
        reply: dict[str, Any] = answer.json()
        return reply

    def hold(self, body: dict[str, Any]) -> None:
        """``body`` polled on a thread; its answer lands in ``answers``."""
        self.thread = threading.Thread(
            target=lambda: self.answers.append(self.post("poll", body, timeout=30).json())
        )
        self.thread.start()
        time.sleep(0.3)  # the poll is held by then

    def answered(self, timeout: float) -> dict[str, Any]:
        assert self.thread is not None
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the held poll was not answered"
        self.thread = None
        return self.answers.pop()

    def join(self) -> None:
        if self.thread is not None:
            self.thread.join(30)


@pytest.fixture
def full(tmp_path: Path) -> Iterator[tuple[Machine, Client, dict[str, Any]]]:
    """Machine m1 (one slot) runs a first job and holds a poll that offers no slot: the
    machine, a client, and the first job's running attempt."""
    store_url = f"sqlite:///{tmp_path}/state.db"
    app = backend_app("render", "render_job", tmp_path / "backend.jsonl")
    pools = {"render": {"min": 0, "autoscale": True, "max": 1}}
    config = project(tmp_path, pools, {"renderer": app})
    client = Client(store_url, config)
    with running_controller(tmp_path, config, store_url, SPKY_POOL_TIMINGS=TIMINGS) as controller:
        wait_for(controller.leader, what="leadership")
        assert controller.admin("POST", "/pools/render/pause").status_code == 200  # no boots
        machine = Machine(controller, client)
        try:
            first = client.run("renderer", "/render", {"gameId": "first"})
            assert controller.admin("POST", "/pools/render/resume").status_code == 200
            (running,) = machine.poll({"free_slots": 1})["assignments"]
            assert running["job"] == first.id
            held = {
                "free_slots": 0,
                "wait": 20,
                "refill": True,
                "running": [{"job": first.id, "attempt": running["attempt"], "fresh": True}],
            }
            machine.hold(held)
            yield machine, client, running
        finally:
            machine.join()
            client.close()


def _beside(running: dict[str, Any]) -> dict[str, Any]:
    """The poll beside the held one that carries the first job's result."""
    done = {"job": running["job"], "attempt": running["attempt"], "status": "success"}
    return {"free_slots": 1, "refill": True, "beside": True, "results": [done]}


def test_a_result_beside_the_held_poll_brings_the_next_job_and_the_held_poll_stays(
    full: tuple[Machine, Client, dict[str, Any]],
) -> None:
    machine, client, running = full
    second = client.run("renderer", "/render", {"gameId": "second"})
    reply = machine.poll(_beside(running))
    assert [ack["job_status"] for ack in reply["results"]] == ["success"]
    assert [each["job"] for each in reply["assignments"]] == [second.id]
    assert client.store.get(second.id).status == "processing"
    time.sleep(0.5)
    assert machine.thread is not None and machine.thread.is_alive()  # still held
    # a kill of the job the answer brought still reaches the held poll at once
    client.store.kill(second.id, time.time())
    answer = machine.answered(timeout=5)
    assert answer["stop"] == [
        {"job": second.id, "attempt": reply["assignments"][0]["attempt"], "reason": "cancelled"}
    ]


def test_a_result_beside_that_claims_nothing_answers_the_held_poll_for_a_later_job(
    full: tuple[Machine, Client, dict[str, Any]],
) -> None:
    machine, client, running = full
    reply = machine.poll(_beside(running))  # no work due: the freed slot stays free
    assert reply["assignments"] == [] and len(reply["results"]) == 1
    answer = machine.answered(timeout=5)
    assert answer["assignments"] == [] and answer["stop"] == []
    # the agent polls again offering the slot: a job that arrives later reaches it
    machine.hold({"free_slots": 1, "wait": 20, "refill": True})
    later = client.run("renderer", "/render", {"gameId": "later"})
    answer = machine.answered(timeout=5)
    assert [each["job"] for each in answer["assignments"]] == [later.id]

"""The agents' endpoint refuses what it must, and the admin API does what it says."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from sp00ky_infra.client import Client
from sp00ky_infra.policy.machines import Reason
from sp00ky_infra.shared import tokens
from tests.controllers import (
    SECRET,
    ControllerProcess,
    backend_app,
    project,
    running_controller,
    wait_for,
)


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[ControllerProcess, Client]]:
    """A controller, and a client whose ``config`` names its sp00ky.yml."""
    store_url = f"sqlite:///{tmp_path}/state.db"
    log = tmp_path / "backend.jsonl"
    app = backend_app("render", "render_job", log)
    app["env"]["API_KEY"] = "backend-secret-value"
    config = project(
        tmp_path, {"render": {"min": 0, "autoscale": True, "max": 2}}, {"renderer": app}
    )
    client = Client(store_url, config)
    with running_controller(tmp_path, config, store_url) as controller:
        wait_for(controller.leader, what="leadership")
        yield controller, client
    client.close()


def _machine(client: Client, name: str) -> str:
    """A machine row the way the controller writes one, and its join token."""
    revision = client.config.backend_for("render").revision(client.config.pools["render"])
    client.store.machines.add(name, "render", "local", revision, 1, time.time())
    return tokens.issue_join_token(SECRET, name, time.time(), ttl=60)


def _join(controller: ControllerProcess, machine: str, token: str) -> requests.Response:
    return requests.post(
        f"{controller.agents_url}/v1/join", json={"machine": machine, "token": token}, timeout=10
    )


def _post(controller: ControllerProcess, path: str, session: str, body: Any) -> requests.Response:
    return requests.post(
        f"{controller.agents_url}{path}",
        json=body,
        headers={"Authorization": f"Bearer {session}"},
        timeout=10,
    )


def test_forged_expired_wrong_and_replayed_join_tokens_are_refused(
    setup: tuple[ControllerProcess, Client],
) -> None:
    controller, client = setup
    token = _machine(client, "m1")
    forged = tokens.issue_join_token("another-secret", "m1", time.time())
    expired = tokens.issue_join_token(SECRET, "m1", time.time() - 120, ttl=60)
    for bad, why in (
        (forged, "signature does not match"),
        (expired, "has expired"),
        (token[:-4] + "AAAA", "signature does not match"),
        ("garbage", "malformed"),
    ):
        answer = _join(controller, "m1", bad)
        assert answer.status_code == 401 and why in answer.json()["error"], answer.text
    assert "is for machine 'm1', not 'm2'" in _join(controller, "m2", token).json()["error"]
    joined = _join(controller, "m1", token)
    assert joined.status_code == 200
    reply = joined.json()
    assert reply["backend"]["env"]["API_KEY"] == "backend-secret-value"
    assert not {"SPKY_STORE", "SPKY_POOL_SECRET", "SPKY_ADMIN_TOKEN"} & set(reply["backend"]["env"])
    assert SECRET not in joined.text
    replay = _join(controller, "m1", token)
    assert replay.status_code == 401 and "used before (a replay)" in replay.json()["error"]


def test_sessions_are_per_machine_and_stale_results_are_refused(
    setup: tuple[ControllerProcess, Client],
) -> None:
    controller, client = setup
    one = _join(controller, "m1", _machine(client, "m1")).json()["session"]
    two = _join(controller, "m2", _machine(client, "m2")).json()["session"]
    for machine, session in (("m1", one), ("m2", two)):
        assert (
            _post(controller, f"/v1/machines/{machine}/ready", session, {"ok": True}).status_code
            == 200
        )
    assert _post(controller, "/v1/machines/m1/poll", two, {}).status_code == 401
    assert _post(controller, "/v1/machines/m1/poll", "nonsense", {}).status_code == 401
    unauthenticated = requests.post(
        f"{controller.agents_url}/v1/machines/m1/poll", json={}, timeout=5
    )
    assert unauthenticated.status_code == 401

    job = client.run("renderer", "/render", {"gameId": "g"})
    polled = _post(controller, "/v1/machines/m1/poll", one, {"free_slots": 1, "wait": 2}).json()
    (assignment,) = polled["assignments"]
    assert assignment["job"] == job.id and assignment["payload"] == {"gameId": "g"}
    result_path = f"/v1/machines/m1/jobs/{job.id}/attempts/%s/result"
    stale = _post(controller, result_path % "not-the-attempt", one, {"status": "success"})
    assert stale.status_code == 409 and "no longer current" in stale.json()["error"]
    # another machine cannot report this machine's attempt
    other = _post(
        controller,
        f"/v1/machines/m2/jobs/{job.id}/attempts/{assignment['attempt']}/result",
        two,
        {"status": "success"},
    )
    assert other.status_code == 409
    done = _post(
        controller,
        result_path % assignment["attempt"],
        one,
        {"status": "success", "result": {"ok": 1}},
    )
    assert done.status_code == 200 and done.json() == {"job_status": "success"}
    again = _post(controller, result_path % assignment["attempt"], one, {"status": "success"})
    assert again.status_code == 409
    assert client.store.get(job.id).result == {"ok": 1}


def test_a_lost_poll_answer_is_sent_again(setup: tuple[ControllerProcess, Client]) -> None:
    controller, client = setup
    session = _join(controller, "m1", _machine(client, "m1")).json()["session"]
    _post(controller, "/v1/machines/m1/ready", session, {"ok": True})
    job = client.run("renderer", "/render", {"gameId": "g"})
    first = _post(controller, "/v1/machines/m1/poll", session, {"free_slots": 1, "wait": 2}).json()
    # the machine never saw that answer: it reports nothing running and has no free slot
    again = _post(
        controller, "/v1/machines/m1/poll", session, {"running": [], "free_slots": 0}
    ).json()
    assert [a["attempt"] for a in again["assignments"]] == [first["assignments"][0]["attempt"]]
    assert client.store.get(job.id).attempt_number == 1


def test_the_openapi_documents(setup: tuple[ControllerProcess, Client]) -> None:
    controller, _ = setup
    spec = requests.get(f"{controller.agents_url}/v1/openapi.json", timeout=5).json()
    assert {"/v1/join", "/v1/machines/{name}/rejoin", "/v1/machines/{name}/poll"} <= set(
        spec["paths"]
    )
    admin_spec = controller.admin("GET", "/openapi.json").json()
    assert "/pools/{name}/queue/{key}/cancel" in admin_spec["paths"]


def test_admin_api_needs_its_token(setup: tuple[ControllerProcess, Client]) -> None:
    controller, _ = setup
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        answer = requests.get(f"{controller.admin_url}/pools", headers=headers, timeout=5)
        assert answer.status_code == 401


def test_pause_resume_cancel_and_manual_start(setup: tuple[ControllerProcess, Client]) -> None:
    controller, client = setup
    store = client.store
    paused = controller.admin("POST", "/pools/render/pause").json()
    assert paused["paused"] is True
    started = controller.admin(
        "POST", "/pools/render/jobs", json={"path": "/render", "payload": {"gameId": "m"}}
    )
    assert started.status_code == 202
    body = started.json()
    assert (
        body["queued"] is True
        and body["pool"] == "render"
        and body["queueId"].startswith("render_job:")
    )
    waiting = client.run("renderer", "/render", {"gameId": "w"})
    time.sleep(1.0)
    assert store.machines.live("render") == []  # paused: nothing created, nothing bound
    assert store.get(body["queueId"]).status == "pending"
    cancelled = controller.admin("POST", f"/pools/render/queue/{waiting.id}/cancel").json()
    assert cancelled["status"] == "failed" and cancelled["errors"][-1]["code"] == "cancelled"
    bad = controller.admin("POST", "/pools/render/jobs", json={"path": "/render", "payload": {}})
    assert bad.status_code == 409 and "payload.gameId is required" in bad.json()["error"]
    assert controller.admin("GET", "/pools/nope").status_code == 404
    controller.admin("POST", "/pools/render/resume")
    wait_for(
        lambda: store.get(body["queueId"]).status == "success", timeout=30, what="the start ran"
    )
    listed = controller.admin("GET", "/pools").json()
    assert [pool["name"] for pool in listed] == ["render"] and listed[0]["paused"] is False


def test_manual_start_takes_every_option_and_the_docs_names(tmp_path: Path, store_url: str) -> None:
    app = backend_app("render", "render_job", tmp_path / "backend.jsonl")
    pool = {"min": 0, "autoscale": True, "max": 1, "slots": 2}
    config = project(tmp_path, {"render": pool}, {"renderer": app})
    client = Client(store_url, config)
    with running_controller(tmp_path, config, store_url) as controller:
        wait_for(controller.leader, what="leadership")
        controller.admin("POST", "/pools/render/pause")  # the rows stay as written

        def start(**options: Any) -> requests.Response:
            body = {"path": "/render", "payload": {"gameId": "m"}, **options}
            return controller.admin("POST", "/pools/render/jobs", json=body)

        docs = start(
            queuePriority=9,
            poolSlots=2,
            retry_strategy="exponential",
            assigned_to="game:m",
            max_retries=1,
        )
        assert docs.status_code == 202, docs.text
        job = client.store.get(docs.json()["queueId"])
        assert (job.priority, job.slots, job.retry_strategy, job.assigned_to) == (
            9,
            2,
            "exponential",
            "game:m",
        )
        assert job.max_retries == 1
        today = client.store.get(start(priority=4, slots=2, queuePriority=4).json()["queueId"])
        assert (today.priority, today.slots, today.retry_strategy) == (4, 2, "linear")
        both = start(priority=1, queuePriority=2)
        assert both.status_code == 409 and both.json()["error"] == (
            "priority (1) and queuePriority (2) are two names for one setting and disagree; "
            "give one of them"
        )
        slots = start(slots=1, poolSlots=2)
        assert slots.status_code == 409
        assert slots.json()["error"].startswith("slots (1) and poolSlots (2) are two names")
        unknown = start(slot=2)
        assert unknown.status_code == 422 and "slot" in unknown.text
        assert start(retry_strategy="random").status_code == 422
        assert client.store.counts()["pending"] == 2
    client.close()


def test_drain_by_hand(setup: tuple[ControllerProcess, Client]) -> None:
    controller, client = setup
    store = client.store
    job = client.run("renderer", "/render", {"gameId": "g", "seconds": 2})
    machine = wait_for(lambda: store.get(job.id).machine, what="running")
    drained = controller.admin("POST", f"/machines/{machine}/drain")
    assert drained.status_code == 200 and drained.json()["state"] == "draining"
    assert controller.admin("POST", f"/machines/{machine}/drain").status_code == 409
    done = wait_for(lambda: store.get(job.id).status == "success" and store.get(job.id), timeout=20)
    assert done.machine == machine  # the drain let its job finish
    gone = wait_for(
        lambda: store.machines.get(machine).state == "destroyed" and store.machines.get(machine),
        timeout=20,
    )
    assert gone.drain_reason == "manual"


def test_a_rejoin_swaps_the_session_keeps_the_state_and_a_failed_machine_gets_410(
    setup: tuple[ControllerProcess, Client],
) -> None:
    controller, client = setup
    store = client.store
    joined = _join(controller, "m1", _machine(client, "m1")).json()
    one, credential = joined["session"], joined["credential"]
    assert credential and store.machines.get("m1").credential_hash == tokens.credential_hash(
        credential
    )
    assert credential not in json.dumps(store.machines.get("m1").as_json())
    assert _post(controller, "/v1/machines/m1/ready", one, {"ok": True}).status_code == 200
    job = client.run("renderer", "/render", {"gameId": "g"})
    polled = _post(controller, "/v1/machines/m1/poll", one, {"free_slots": 1, "wait": 2}).json()
    (assignment,) = polled["assignments"]

    def rejoin(machine: str, offered: str) -> requests.Response:
        return requests.post(
            f"{controller.agents_url}/v1/machines/{machine}/rejoin",
            json={"credential": offered},
            timeout=10,
        )

    again = rejoin("m1", credential)
    assert again.status_code == 200, again.text
    reply = again.json()
    assert reply["credential"] is None and reply["machine"] == "m1" and reply["pool"] == "render"
    assert reply["backend"]["env"]["API_KEY"] == "backend-secret-value"
    two = reply["session"]
    assert _post(controller, "/v1/machines/m1/poll", one, {}).status_code == 401  # the old one
    assert store.machines.get("m1").state == "ready"  # a rejoin moves no machine
    # The attempt bound to it is sent again, the same one: never a second attempt alongside.
    resent = _post(controller, "/v1/machines/m1/poll", two, {"free_slots": 1}).json()
    assert [(a["job"], a["attempt"]) for a in resent["assignments"]] == [
        (job.id, assignment["attempt"])
    ]
    # path, payload and deadline as first sent; the lease renewed by this poll
    (again,) = resent["assignments"]
    assert again["lease_expires_at"] >= assignment["lease_expires_at"]
    assert {**again, "lease_expires_at": None} == {**assignment, "lease_expires_at": None}
    path = f"/v1/machines/m1/jobs/{job.id}/attempts/{assignment['attempt']}/result"
    assert _post(controller, path, two, {"status": "success"}).status_code == 200

    for machine, offered in (("m1", "another"), ("m1", ""), ("nosuch", credential)):
        refused = rejoin(machine, offered)
        assert refused.status_code == 401, refused.text
    assert store.machines.move("m1", Reason.SILENT, time.time())
    gone = rejoin("m1", credential)
    assert gone.status_code == 410 and "is failed" in gone.json()["error"], gone.text

"""The routes a machine's bootstrap calls before the join, against a real controller: the agent
archive and a failed boot, authorized by the machine's own join token (its signature, machine
and expiry) without spending it, and by nothing once the machine has joined."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import requests

from sp00ky_infra.client import Client
from sp00ky_infra.shared import tokens
from sp00ky_infra.shared.cloud_init import agent_archive, agent_sha256
from tests.controllers import (
    SECRET,
    ControllerProcess,
    backend_app,
    project,
    running_controller,
    wait_for,
)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ControllerProcess, Client]]:
    """A controller whose pool starts nothing by itself (machines are added by the tests)."""
    folder = tmp_path_factory.mktemp("booting")
    store_url = f"sqlite:///{folder}/state.db"
    app = backend_app("render", "render_job", folder / "backend.jsonl")
    config = project(folder, {"render": {"min": 0, "autoscale": True, "max": 1}}, {"r": app})
    with Client(store_url, config) as client, running_controller(folder, config, store_url) as c:
        wait_for(c.leader, what="leadership")
        assert c.admin("POST", "/pools/render/pause").status_code == 200
        yield c, client


def _machine(client: Client, name: str) -> str:
    """A machine row, as its provisioner writes it, and the join token of its user-data."""
    revision = client.config.backend_for("render").revision(client.config.pools["render"])
    client.store.machines.add(name, "render", "local", revision, 1, time.time())
    return tokens.issue_join_token(SECRET, name, time.time())


def _agent(controller: ControllerProcess, name: str, token: str | None) -> requests.Response:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    return requests.get(
        f"{controller.agents_url}/v1/machines/{name}/agent", headers=headers, timeout=30
    )


def _failed(controller: ControllerProcess, name: str, token: str, reason: str) -> requests.Response:
    return requests.post(
        f"{controller.agents_url}/v1/machines/{name}/boot-failed",
        json={"reason": reason},
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )


def _error(answer: requests.Response) -> tuple[int, str]:
    return answer.status_code, answer.json()["error"]


def test_a_join_token_fetches_the_agent_until_its_machine_joins(
    served: tuple[ControllerProcess, Client],
) -> None:
    controller, client = served
    token = _machine(client, "render-fetch1")
    for _ in range(2):  # as often as the bootstrap retries: the token is not spent
        fetched = _agent(controller, "render-fetch1", token)
        assert fetched.status_code == 200, fetched.text
        assert fetched.content == agent_archive()
        assert fetched.headers["content-type"] == "application/x-bzip2"
    joined = requests.post(
        f"{controller.agents_url}/v1/join",
        json={"machine": "render-fetch1", "token": token},
        timeout=30,
    )
    assert joined.status_code == 200, joined.text  # the join spends it
    spent = (401, "machine render-fetch1 has joined: its join token is spent")
    assert _error(_agent(controller, "render-fetch1", token)) == spent
    assert _error(_failed(controller, "render-fetch1", token, "too late")) == spent
    # the joined agent is told what the controller serves, and fetches it with its session
    assert joined.json()["agent"] == agent_sha256()
    assert client.store.machines.get("render-fetch1").agent == agent_sha256()  # it runs that
    fetched = _agent(controller, "render-fetch1", joined.json()["session"])
    assert fetched.status_code == 200 and fetched.content == agent_archive()
    assert client.store.machines.get("render-fetch1").failed_reason is None


def test_only_the_machines_own_unexpired_token_fetches_the_agent(
    served: tuple[ControllerProcess, Client],
) -> None:
    controller, client = served
    own = _machine(client, "render-fetch2")
    other = _machine(client, "render-fetch3")
    now = time.time()
    expired = tokens.issue_join_token(SECRET, "render-fetch2", now - 10, ttl=5)
    forged = tokens.issue_join_token("another-secret", "render-fetch2", now)
    stranger = tokens.issue_join_token(SECRET, "render-ghost", now)
    refused = [  # (machine, token, why)
        (
            "render-fetch2",
            None,
            "send the join token or session as `Authorization: Bearer <join token or session>`",
        ),
        ("render-fetch2", other, "join token is for machine 'render-fetch3', not 'render-fetch2'"),
        ("render-fetch2", expired, "join token has expired"),
        (
            "render-fetch2",
            forged,
            "join token signature does not match (forged, or another secret)",
        ),
        ("render-ghost", stranger, "unknown machine 'render-ghost'"),
    ]
    for name, token, why in refused:
        assert _error(_agent(controller, name, token)) == (401, why)
    assert _agent(controller, "render-fetch2", own).status_code == 200


def test_a_failed_boot_reported_with_the_token_fails_the_machine_with_its_reason(
    served: tuple[ControllerProcess, Client],
) -> None:
    controller, client = served
    token = _machine(client, "render-fetch4")
    reason = "the agent fetched from the controller has sha256 ab12, the user-data expects cd34"
    reported = _failed(controller, "render-fetch4", token, reason)
    assert reported.status_code == 200 and reported.json() == {"ok": True}, reported.text
    row = client.store.machines.get("render-fetch4")
    assert row.state in ("failed", "destroyed") and row.failed_reason == reason
    gone = _error(_agent(controller, "render-fetch4", token))
    assert gone[0] == 410 and gone[1].startswith("machine render-fetch4 is ")
    assert _failed(controller, "render-fetch4", token, "again").status_code == 410
    assert client.store.machines.get("render-fetch4").failed_reason == reason

"""The controller records which agent each machine runs (its join or rejoin says) and tells a
machine on another agent than the one it serves, in every poll reply until it rejoins on
that one; a machine on the served agent, or on one never recorded, is told nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sp00ky_infra.config.loader import load_config
from sp00ky_infra.controller.admin import pool_view
from sp00ky_infra.controller.agents import Agents
from sp00ky_infra.controller.core import Controller
from sp00ky_infra.controller.protocol import PollRequest
from sp00ky_infra.controller.settings import ControllerSettings
from sp00ky_infra.controller.state import Deployment
from sp00ky_infra.policy.machines import Reason
from sp00ky_infra.shared import tokens
from sp00ky_infra.shared.cloud_init import agent_sha256
from sp00ky_infra.store import SqlStore
from tests.controller.test_controller_executor import Recording
from tests.controller.test_lease_renewals import T0, Clock
from tests.controllers import backend_app, leading, project

MACHINE = "render-m1"
OLD = "0" * 64
CREDENTIAL = "the-machine-credential"


@pytest.fixture
def controller(tmp_path: Path, store: SqlStore) -> Iterator[Controller]:
    """A leading controller, one ready machine (session ``tok``, credential ``cred``)."""
    app = backend_app("render", "render_job", tmp_path / "log")
    config = load_config(project(tmp_path, {"render": {"min": 1}}, {"renderer": app}))
    settings = ControllerSettings(secret="s", state_dir=str(tmp_path))
    store.migrate()
    revision = Deployment.of(config, settings.pool).revisions["render"]
    store.machines.add(MACHINE, "render", "local", revision, 1, T0)
    store.machines.move(MACHINE, Reason.PROVISIONED, T0)
    store.machines.join(MACHINE, tokens.session_hash("tok"), T0, tokens.credential_hash(CREDENTIAL))
    store.machines.move(MACHINE, Reason.READY, T0)
    provisioner = Recording(delivers_join_token=True)
    with leading(Controller(settings, config, store, provisioner, clock=Clock())) as made:
        yield made


def test_a_machine_on_another_agent_is_told_until_it_rejoins_on_the_served_one(
    controller: Controller,
) -> None:
    agents, store = Agents(controller), controller.store
    served = agent_sha256()
    assert agents.poll(MACHINE, "tok", PollRequest()).agent is None  # never recorded
    store.machines.ran_agent(MACHINE, OLD)
    for _ in range(2):  # every poll, not once: the agent may have missed one
        assert agents.poll(MACHINE, "tok", PollRequest()).agent == served
        assert agents.look(MACHINE, "tok", PollRequest()).agent == served
    machine = next(m for m in pool_view(controller, "render")["machine_list"])
    assert machine["agent"] == OLD and machine["agent_current"] is False  # pools get --json
    # its agent upgraded and rejoined, saying so
    reply = agents.rejoin(MACHINE, CREDENTIAL, served)
    assert reply.agent == served and store.machines.get(MACHINE).agent == served
    assert agents.poll(MACHINE, reply.session, PollRequest()).agent is None
    machine = next(m for m in pool_view(controller, "render")["machine_list"])
    assert machine["agent"] == served and machine["agent_current"] is True
    # a rejoin that does not say (an agent that knows nothing of upgrades) keeps the record
    agents.rejoin(MACHINE, CREDENTIAL)
    assert store.machines.get(MACHINE).agent == served

"""A machine's server already there under its name (made by an update killed before it could
record it): the provider takes it when its labels say it is this machine of this project, and
refuses the create otherwise. Against the fake Hetzner API over loopback."""

from __future__ import annotations

import pytest

from sp00ky_infra.hetzner import HetznerAPI
from sp00ky_infra.infra.machine import MachineError, create_server
from sp00ky_infra.rehearse.cloud import TOKEN, FakeHetzner
from sp00ky_infra.shared import labels

MINE = {labels.PROJECT: "shop", labels.MACHINE: "render-a1", labels.REVISION: "r1"}
PROPS = {"name": "render-a1", "server_type": "cx33", "locations": ["fsn1"], "labels": MINE,
         "user_data": "#cloud-config\n{}\n", "image": "debian-12"}  # fmt: skip


def test_the_machines_own_server_is_taken_not_made_again() -> None:
    with FakeHetzner() as fake:
        left = fake.add_server("render-a1", {**MINE, labels.REVISION: "r0"})
        server, skipped = create_server(HetznerAPI(TOKEN, fake.url), PROPS)
        assert server.id == left["id"] and skipped == []
        assert list(fake.servers) == [left["id"]]


def test_another_projects_server_of_that_name_is_a_refusal() -> None:
    with FakeHetzner() as fake:
        theirs = fake.add_server("render-a1", {**MINE, labels.PROJECT: "another"})
        with pytest.raises(MachineError, match="uniqueness_error"):
            create_server(HetznerAPI(TOKEN, fake.url), PROPS)
        assert list(fake.servers) == [theirs["id"]]

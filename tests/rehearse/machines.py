"""A pool machine booted in the fake cloud as the Hetzner provisioner makes one."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from sp00ky_infra.client import Client
from sp00ky_infra.config.loader import load_config
from sp00ky_infra.hetzner.client import HetznerAPI
from sp00ky_infra.hetzner.domain import Server
from sp00ky_infra.rehearse.cloud import TOKEN, FakeHetzner
from sp00ky_infra.shared import tokens
from sp00ky_infra.shared.cloud_init import user_data
from tests.controllers import SECRET, wait_for


def ready_machine(
    cloud: FakeHetzner, client: Client, controller: Any, config: Path, image_id: str,
    machine: str = "render-vm1", image: str = "debian-12",
) -> Server:  # fmt: skip
    """The machine's row (the revision its controller settles for ``image_id``), its server
    made from ``image`` with the real user-data; returned once the machine is ready, the
    server's console in the failure otherwise."""
    assert cloud.boot is not None
    loaded = load_config(config)
    revision = loaded.backend_for("render").revision(loaded.pools["render"], image_id)
    # the machine row a provisioner writes; the server is made as infra/machine.py does
    client.store.machines.add(machine, "render", "local", revision, 1, time.time())
    token = tokens.issue_join_token(SECRET, machine, time.time())
    server = HetznerAPI(TOKEN, cloud.url, wait=lambda *_: 0.2).create_server(
        name=machine, server_type="cx23", image=image, location="fsn1",
        user_data=user_data(machine, controller.agents_url, token, runtime="docker"),
    )  # fmt: skip
    try:
        wait_for(
            lambda: client.store.machines.get(machine).state == "ready",
            timeout=240, interval=0.5, what="the machine ready",
        )  # fmt: skip
    except AssertionError:
        raise AssertionError(cloud.boot.console(server.id)) from None
    return server

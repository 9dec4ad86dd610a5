"""A controller in this process on a real Pulumi stack (tests/pulumi_engine.py) against the
fake Hetzner API: the prod stack with its pool's firewall made, the controller's provisioner
driving it through the Automation API, and ticks until what the store wants is applied."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from sp00ky_infra.config.loader import load_config
from sp00ky_infra.controller.core import Controller
from sp00ky_infra.controller.provisioners.pulumi import PulumiProvisioner, automation_stack
from sp00ky_infra.controller.reconcile import tick
from sp00ky_infra.controller.settings import ControllerSettings
from sp00ky_infra.rehearse.cloud import FakeHetzner
from sp00ky_infra.store import SqlStore
from tests.controllers import SECRET, wait_for
from tests.infra.test_pulumi_engine import _prod, _revision
from tests.pulumi_engine import StackProject

PIN = {
    "sp00ky:project": "shop",
    "sp00ky:poolUrl": "https://pool.shop.example",
    "sp00ky:poolSecret": SECRET,
}


@contextmanager
def engine_env(project: StackProject) -> Iterator[None]:
    """The Automation API runs the CLI with this process's environment."""
    saved = dict(os.environ)
    os.environ.update(
        {k: v for k, v in project.env.items() if k.startswith(("PULUMI", "HCLOUD", "PATH"))}
    )
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextmanager
def fresh_controller(
    folder: Path, stack: StackProject, store: SqlStore, machines: int, **settings: Any
) -> Iterator[tuple[Controller, PulumiProvisioner]]:
    """A controller on the store and the stack, its pool wanting ``machines`` machines;
    ``settings``: more of its ControllerSettings."""
    doc = yaml.safe_load((folder / "sp00ky.yml").read_text())  # the stack's, resized
    doc["pools"]["render"].update(min=machines, max=max(machines, 1))
    (folder / "fresh.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    config = load_config(folder / "fresh.yml")
    with engine_env(stack):
        provisioner = PulumiProvisioner(lambda: automation_stack("prod", str(stack.dir)))
        given = {"secret": SECRET, "state_dir": str(folder), "provider": "", "project": "shop"}
        chosen = ControllerSettings(**{**given, **settings})
        controller = Controller(chosen, config, store, provisioner)
        try:
            provisioner.pin(PIN)
            yield controller, provisioner
        finally:
            provisioner.close()
            controller.leader_lock.release()


def converge(controller: Controller, provisioner: PulumiProvisioner, updates: int = 1) -> None:
    """Tick until the stack has applied what the store wants (after ``updates`` updates at
    least, failed ones too), and the outcomes are on the rows."""

    def settled() -> bool:
        tick(controller)
        return provisioner.idle() and len(provisioner.durations) >= updates

    wait_for(settled, timeout=300, interval=0.5, what="the controller's updates")
    tick(controller)


def firewalled_stack(
    tmp_path: Path, pulumi_bin: str, cloud: FakeHetzner
) -> tuple[StackProject, str]:
    """The prod stack with its pool's firewall made (no machine yet), and the revision."""
    project = _prod(tmp_path, pulumi_bin, cloud)
    project.machines({"render": {}})
    project.up()
    return project, _revision(tmp_path / "sp00ky.yml")

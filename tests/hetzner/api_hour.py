"""An hour of a controller holding 50 machines, counted in requests to the fake Hetzner API.

The hour runs on a fake clock: the fake's budget refills by it, and each of its 60 minutes
is one controller tick (the heartbeat, the price reading: the controller's own requests), one
scale event (a machine made, then the newest one destroyed, in turn) and every fifth minute
one guardian pass. A scale event is what a ``pulumi up`` asks the engine's provider host:
one resource's ``create`` or ``delete``, run here by the same provider in this process
(tests/hetzner/test_api_budget_engine.py counts real ``pulumi up``s against these figures).
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sp00ky_infra.config.loader import load_config
from sp00ky_infra.controller.core import Controller
from sp00ky_infra.controller.provisioners import MachineSpec, Provisioned, Provisioner
from sp00ky_infra.controller.reconcile import tick
from sp00ky_infra.controller.settings import ControllerSettings
from sp00ky_infra.guardian.passes import run_pass
from sp00ky_infra.hetzner import HetznerAPI
from sp00ky_infra.infra.machine import HetznerMachineProvider
from sp00ky_infra.rehearse.cloud import TOKEN, FakeHetzner
from sp00ky_infra.shared import labels
from sp00ky_infra.shared.desired import CONTROLLER, UPDATED_BY_ENV
from sp00ky_infra.store import open_store
from tests.controllers import SECRET, backend_app, project
from tests.pulumi_engine import StackProject, example_config

MACHINES = 50
MINUTES = 60
GUARDIAN_EVERY = 5  # minutes
PROJECT = "shop"
# tick, scale_up, scale_down, guardian: what each operation of the hour spends
KINDS = ("tick", "scale_up", "scale_down", "guardian")


class Elsewhere:
    """The tick's own machines: made elsewhere (the hour's scale events are the provider's)."""

    name = "elsewhere"
    delivers_join_token = True

    def create(self, spec: MachineSpec) -> Provisioned:
        return Provisioned(provider_id=spec.name)

    def destroy(self, name: str, provider_id: str | None, provider_state: str | None) -> None:
        return None

    def close(self) -> None:
        return None


def machine_props(name: str) -> dict[str, Any]:
    """What the Pulumi program gives one machine resource of pool ``render``."""
    return {
        "name": name, "server_type": "cpx42", "fallback_types": [], "locations": ["fsn1"],
        "labels": {labels.PROJECT: PROJECT, labels.POOL: "render", labels.MACHINE: name,
                   labels.LIMIT: str(MACHINES)},
        "user_data": "#cloud-config\n{}\n", "firewall_ids": [], "image": "debian-12",
    }  # fmt: skip


@dataclass
class Hour:
    cloud: FakeHetzner
    controller: Controller
    now: list[float]
    spent: dict[str, Counter[str]] = field(default_factory=lambda: {k: Counter() for k in KINDS})
    machines: list[tuple[str, str]] = field(default_factory=list)  # (name, server id)
    destroyed_by_guardian: int = 0

    def counting(self, kind: str, do: Callable[[], object]) -> None:
        before = self.cloud.counted()
        do()
        self.spent[kind] += self.cloud.counted() - before

    def scale_up(self) -> None:
        name = f"render-{len(self.machines) + 1000}"
        made = HetznerMachineProvider().create(machine_props(name))
        self.machines.append((name, str(made.id)))

    def scale_down(self) -> None:
        name, server_id = self.machines.pop()
        HetznerMachineProvider().delete(server_id, machine_props(name))

    def tick(self) -> None:
        tick(self.controller)
        for thread in threading.enumerate():  # the heartbeat's, prices' and sweep's threads
            if thread.name in ("heartbeat", "prices", "server-sweep"):
                thread.join(timeout=30)

    def guardian(self) -> None:
        api = HetznerAPI(TOKEN, self.cloud.url, caller="guardian", clock=lambda: self.now[0])
        self.destroyed_by_guardian += len(run_pass(api, self.now[0]).destroyed)

    def run(self) -> None:
        for minute in range(MINUTES):
            self.now[0] += 60.0
            self.counting("tick", self.tick)
            kind = "scale_up" if minute % 2 == 0 else "scale_down"
            self.counting(kind, getattr(self, kind))
            if minute % GUARDIAN_EVERY == 0:
                self.counting("guardian", self.guardian)

    def total(self) -> int:
        return sum(sum(each.values()) for each in self.spent.values())

    def lines(self) -> Iterator[str]:
        for kind in KINDS:
            spent = self.spent[kind]
            yield f"{kind}: {sum(spent.values())} requests ({dict(sorted(spent.items()))})"
        yield f"hour: {self.total()} requests of the {self.cloud.rate_limit} an hour allows"


@contextmanager
def a_controller(
    folder: Path, provisioner: Provisioner, clock: Callable[[], float] = time.time, **settings: Any
) -> Iterator[Controller]:
    """An in-process controller of one autoscaled pool ``render`` on a SQLite store."""
    app = backend_app("render", "render_job", folder / "log")
    pools = {"render": {"autoscale": True, "min": 0, "max": MACHINES + 10}}
    config = load_config(project(folder, pools, {"renderer": app}))
    store = open_store(f"sqlite:///{folder}/state.db")
    made = ControllerSettings(secret=SECRET, state_dir=str(folder), **settings)
    controller = Controller(made, config, store, provisioner, clock)
    try:
        yield controller
    finally:
        controller.leader_lock.release()
        store.close()


@contextmanager
def an_hour(folder: Path, env: MutableMapping[str, str] | None = None) -> Iterator[Hour]:
    """A controller and MACHINES machines on a fresh fake, HCLOUD_* pointed at it (in
    ``env``, os.environ unless given) for the hour; nothing counted yet."""
    env = os.environ if env is None else env
    now = [time.time()]  # the fake's servers are made at the real time; the guardian ages them
    saved = {key: env.get(key) for key in ("HCLOUD_TOKEN", "HCLOUD_ENDPOINT")}
    # The hour's servers are made by the provider, not by rows of this store: the sweep lists
    # them as it would (its requests count) with a grace past the hour, so it deletes none.
    past_the_hour = 2 * MINUTES * 60.0
    with FakeHetzner() as cloud, a_controller(folder, Elsewhere(), lambda: now[0],
                                              project=PROJECT,
                                              sweep_grace=past_the_hour) as controller:  # fmt: skip
        cloud.clock = lambda: now[0]
        env.update({"HCLOUD_TOKEN": TOKEN, "HCLOUD_ENDPOINT": cloud.url})
        hour = Hour(cloud, controller, now)
        try:
            for _ in range(MACHINES):
                hour.scale_up()
            yield hour
        finally:
            for key, value in saved.items():
                if value is None:
                    env.pop(key, None)
                else:
                    env[key] = value


def a_stack(folder: Path, pulumi_bin: str, cloud: FakeHetzner) -> tuple[StackProject, str]:
    """The prod stack of the example's pool ``render`` against ``cloud``, run as the
    controller runs it, and the revision its machines carry."""
    config = example_config(folder, max=MACHINES + 10)
    stack = StackProject.make(
        folder, pulumi_bin, "prod",
        {"HCLOUD_TOKEN": TOKEN, "HCLOUD_ENDPOINT": cloud.url, UPDATED_BY_ENV: CONTROLLER},
    )  # fmt: skip
    for key, value in (("provider", "hetzner"), ("configFile", str(config)),
                       ("project", PROJECT), ("poolUrl", "https://pool.shop.example")):  # fmt: skip
        stack.config(f"sp00ky:{key}", value)
    stack.config("sp00ky:poolSecret", SECRET, secret=True)
    loaded = load_config(config)
    return stack, loaded.backend_for("render").revision(loaded.pools["render"])


def measured_ups(
    stack: StackProject, cloud: FakeHetzner, revision: str, rounds: int = 1
) -> dict[str, list[Counter[str]]]:
    """Real ``pulumi up``s of a stack holding MACHINES machines: what each scale-up (one
    machine more), scale-down (one less), unchanged up and ``pulumi refresh`` spent,
    ``rounds`` of each."""
    wanted = {f"render-{n}": revision for n in range(MACHINES)}
    stack.machines({"render": wanted})
    stack.up()
    kinds = ("scale_up", "scale_down", "unchanged", "refresh")
    spent: dict[str, list[Counter[str]]] = {kind: [] for kind in kinds}
    for n in range(rounds):
        extra = {**wanted, f"render-extra{n}": revision}
        for kind, machines in zip(kinds, (extra, wanted, wanted, wanted), strict=True):
            stack.machines({"render": machines})
            before = cloud.counted()
            if kind == "refresh":
                stack.pulumi("refresh", "--yes", "--skip-preview")
            else:
                stack.up()
            spent[kind].append(cloud.counted() - before)
    return spent

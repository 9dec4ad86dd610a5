"""The leader's sweep of the cloud: every ``sweep_every`` seconds (five minutes) it lists the
project's machine servers (labels ``sp00ky/project`` and ``sp00ky/machine``) and deletes each
one no live machine row holds, once it is older than ``sweep_grace`` (ten minutes: a younger
one may be a create still in flight, its update not yet reported). It catches what a killed
update left that the stack's own recovery could not (controller/provisioners/pulumi.py):
a server whose row was failed or destroyed meanwhile, or one made for a row that is gone.

Each deletion is logged with its reason and counted by reason in /metrics
(``sp00ky_servers_swept_total``). The sweep runs off the tick's thread, as the heartbeat does:
a slow API never holds the tick up. It needs SPKY_PROJECT and HCLOUD_TOKEN, as the heartbeat
does. The guardian stays the backstop for a controller that is gone for good.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import Counter
from collections.abc import Callable

from sp00ky_infra.controller.settings import SWEEP_EVERY_SECONDS, SWEEP_GRACE_SECONDS
from sp00ky_infra.controller.state import Periodic
from sp00ky_infra.hetzner import HetznerAPI, Server
from sp00ky_infra.policy.machines import LIVE_STATES
from sp00ky_infra.shared import labels
from sp00ky_infra.store.machines import MachineNotFound, MachineTable

log = logging.getLogger("sp00ky.controller")

NO_ROW = "no_machine_row"  # the store never had the machine, or forgot it
ROW_ENDED = "machine_row_ended"  # its row is failed or destroyed: the server should be gone
REASONS = (NO_ROW, ROW_ENDED)


def unheld(
    servers: list[Server], state_of: Callable[[str], str | None], now: float, grace: float
) -> list[tuple[Server, str]]:
    """The servers to delete and why: each machine server whose row (``state_of``: its state,
    None when there is no row) is not live, older than ``grace``."""
    found = []
    for server in servers:
        machine = server.labels.get(labels.MACHINE)
        if not machine or now - server.created < grace:
            continue
        state = state_of(machine)
        if state not in LIVE_STATES:
            found.append((server, NO_ROW if state is None else ROW_ENDED))
    return found


class ServerSweep:
    """The sweep's schedule and counts (one per controller)."""

    def __init__(self, every: float = SWEEP_EVERY_SECONDS, grace: float = SWEEP_GRACE_SECONDS):
        self.due = Periodic(every)
        self.grace = grace
        self.counts: Counter[str] = Counter()  # deleted servers by reason
        self._running = threading.Lock()

    def maybe(self, machines: MachineTable, project: str, now: float) -> None:
        """Start a sweep in the background when one is due (and none runs)."""
        if not project or not os.environ.get("HCLOUD_TOKEN") or not self.due.due(now):
            return
        if not self._running.acquire(blocking=False):
            return

        def run() -> None:
            try:
                self.run(HetznerAPI.from_env(busy_tries=3), machines, project, now)
            except Exception as exc:  # logged; the next sweep tries again
                log.warning("the sweep of project %s's servers failed: %s", project, exc)
            finally:
                self._running.release()

        threading.Thread(target=run, name="server-sweep", daemon=True).start()

    def run(
        self, api: HetznerAPI, machines: MachineTable, project: str, now: float
    ) -> list[tuple[str, str]]:
        """One sweep: the servers deleted (their names) and why."""
        servers = api.servers(label_selector=f"{labels.PROJECT}={project},{labels.MACHINE}")
        live = {m.name for m in machines.live()}

        def state_of(machine: str) -> str | None:
            if machine in live:
                return LIVE_STATES[0]
            try:
                return machines.get(machine).state
            except MachineNotFound:
                return None

        deleted = []
        for server, reason in unheld(servers, state_of, now, self.grace):
            api.delete_server(server.id)
            self.counts[reason] += 1
            deleted.append((server.name, reason))
            log.warning(
                "event=server_swept server=%s id=%d project=%s reason=%s: no live machine row "
                "holds it (%.0fs old)", server.name, server.id, project, reason,
                now - server.created,
            )  # fmt: skip
        return deleted

"""A second `dev` on the same store waits as a standby, never touches the
leader's machines, never takes the state file, and refuses admin writes naming the leader."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import requests

from sp00ky_infra.store import open_store
from tests.controllers import wait_for
from tests.dev_process import Dev, example_project, kill_all_in
from tests.helpers import cli


def test_a_standby_dev_leaves_the_leaders_machines_and_names_the_leader(tmp_path: Path) -> None:
    folder = example_project(tmp_path / "project")
    leader = Dev(
        folder, "--burst", "1", "--path", "/render", "--payload", '{"gameId": "a", "seconds": 6}'
    )
    standby: Dev | None = None
    store = None
    try:
        leader_url = leader.admin_url
        store = open_store(f"sqlite:///{folder}/.sp00ky/state.db")
        running = wait_for(
            lambda: [j for j in store.list_jobs(limit=10) if j.status == "processing"],
            timeout=60,
            what="the leader's job running",
        )[0]
        machine = running.machine
        assert machine is not None

        standby = Dev(folder)
        standby_url = standby.admin_url
        standby.wait_line(r"a standby: the leader at .* keeps its machines; waiting")
        assert standby_url != leader_url

        state = json.loads((folder / ".sp00ky" / "controller.json").read_text())
        assert state["admin_url"] == leader_url and state["pid"] == leader.proc.pid
        assert state["role"] == "leader"

        token = (folder / ".sp00ky" / "admin-token").read_text().strip()
        refused = requests.post(
            f"{standby_url}/pools/render/pause",
            headers={"Authorization": f"Bearer {token}"},
            timeout=10,
        )
        assert refused.status_code == 503, refused.text
        assert f"the leader at {leader_url}" in refused.json()["error"]
        assert not store.pools.state("render").paused

        paused = cli("pools", "pause", "render", cwd=folder, env={"SPKY_ADMIN_URL": ""})
        assert paused.returncode == 0 and "render: paused" in paused.stdout, paused.stderr
        events = requests.get(
            f"{leader_url}/events", headers={"Authorization": f"Bearer {token}"}, timeout=10
        ).json()
        assert any(e["kind"] == "paused" for e in events)  # the leader itself took it
        resumed = cli("pools", "resume", "render", cwd=folder, env={"SPKY_ADMIN_URL": ""})
        assert resumed.returncode == 0, resumed.stderr

        standby.signal(signal.SIGINT)  # Ctrl-C in the second terminal
        assert standby.wait(timeout=15) == 0, standby.output
        assert "no machine destroyed" in standby.output, standby.output
        assert "machine(s) destroyed" not in standby.output
        assert "no machine time of its own (a standby)" in standby.output

        assert store.machines.get(machine).state in ("ready", "draining")
        job = store.get(running.id)
        assert job.status in ("processing", "success") and job.attempt == running.attempt
        done = wait_for(
            lambda: store.get(running.id).status == "success" and store.get(running.id),
            timeout=30,
            what="the leader's job finishing on its first attempt",
        )
        assert len(done.attempts) == 1 and done.retries == 0

        # the leader stops: a standby that takes over names itself in the state file
        standby = Dev(folder)
        taking_over = standby.admin_url
        standby.wait_line("a standby: the leader at")
        leader.signal(signal.SIGINT)
        assert leader.wait(timeout=30) == 0, leader.output
        assert "dev: stopped; 1 machine(s) destroyed" in leader.output
        standby.wait_line(r"\* leader: .* is the leader", timeout=30)
        state = json.loads((folder / ".sp00ky" / "controller.json").read_text())
        assert state["admin_url"] == taking_over and state["pid"] == standby.proc.pid
    finally:
        if standby is not None:
            standby.stop()
        leader.stop()
        if store is not None:
            store.close()
        kill_all_in(folder)

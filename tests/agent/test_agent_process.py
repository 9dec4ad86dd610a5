"""The agent with the real controller and a real backend on loopback (lease 3 s)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from sp00ky_infra.client import Client
from sp00ky_infra.controller.provisioners.local import session_members
from tests.controllers import (
    ControllerProcess,
    backend_app,
    backend_events,
    kill_machines,
    live_machines,
    project,
    running_controller,
    wait_for,
    work_stopped,
)
from tests.helpers import ROOT
from tests.proxy import CuttableProxy


def _setup(tmp_path: Path, pool: dict[str, Any]) -> tuple[Path, Path, str, Client]:
    log = tmp_path / "backend.jsonl"
    config = project(
        tmp_path, {"render": pool}, {"renderer": backend_app("render", "render_job", log)}
    )
    store_url = f"sqlite:///{tmp_path}/state.db"
    return log, config, store_url, Client(store_url, config)


def _machine_log(tmp_path: Path, machine: str) -> str:
    return (tmp_path / ".sp00ky" / "machines" / f"{machine}.log").read_text()


def test_cut_off_from_the_controller_a_machine_stops_its_job_before_the_lease_ends(
    tmp_path: Path,
) -> None:
    log, config, store_url, client = _setup(tmp_path, {"min": 2})
    store = client.store
    with (
        CuttableProxy() as proxy,
        running_controller(
            tmp_path, config, store_url, SPKY_POOL_PUBLIC_URL=proxy.url
        ) as controller,
    ):
        proxy.upstream = controller.agents_url
        wait_for(lambda: len(live_machines(store, "render", "ready")) == 2, what="two machines")
        job = client.run("renderer", "/render", {"gameId": "g", "seconds": 6}, max_retries=2)
        first = wait_for(lambda: store.get(job.id).machine, what="running")
        first_attempt = store.get(job.id).attempt
        wait_for(lambda: any(e["event"] == "start" for e in backend_events(log)), what="started")
        proxy.cut.add(first)  # the machine's traffic to the controller is lost from here
        done = wait_for(
            lambda: store.get(job.id).status == "success" and store.get(job.id), timeout=40
        )
        events = backend_events(log)
        stopped = work_stopped(events, first_attempt or "")
        second = [e for e in events if e["event"] == "start" and e["attempt"] == done.attempt]
        assert stopped and second, events
        # the backend's own log: the first attempt's work stopped before the second began
        assert stopped[0]["t"] < second[0]["t"]
        assert not any(e["event"] == "end" and e["attempt"] == first_attempt for e in events)
        assert done.machine != first and done.errors[0]["code"] == "lease_expired"
        assert f"event=abandon job={job.id} attempt={first_attempt}" in _machine_log(
            tmp_path, first
        )
    client.close()


def test_out_of_contact_too_long_a_machine_shuts_itself_down(tmp_path: Path) -> None:
    _, config, store_url, client = _setup(tmp_path, {"min": 1})
    marker = tmp_path / "powered-off"
    # On a VM the command is systemctl poweroff; here a harmless stand-in shows it ran.
    env = {"SPKY_AGENT_POWEROFF": json.dumps(["touch", str(marker)])}
    controller = ControllerProcess(tmp_path, config, store_url, env).start()
    try:
        machine = wait_for(lambda: live_machines(client.store, "render", "ready"), what="ready")[0]
        agent = int(client.store.machines.get(machine).provider_id or 0)
        controller.stop(signal.SIGKILL)  # nobody is left to destroy the machine
        lost_at = time.monotonic()
        wait_for(lambda: session_members(agent) == [], timeout=30, what="the machine gone")
        # out of contact for max_offline (3 x the lease, 9 s here), it left, backend and all
        assert time.monotonic() - lost_at >= 8
        text = _machine_log(tmp_path, machine)
        assert "event=offline" in text and "event=exit code=6" in text
        assert f"event=poweroff command=touch {marker}" in text and marker.exists()
    finally:
        controller.stop()
        kill_machines(store_url)
        client.close()


def _pids(client: Client, ids: list[str]) -> list[int]:
    return [client.store.get(job_id).result["pid"] for job_id in ids]


def test_recycle_job_gives_every_job_a_fresh_backend_process(tmp_path: Path) -> None:
    _, config, store_url, client = _setup(tmp_path, {"min": 1})
    with running_controller(tmp_path, config, store_url):
        ids = []
        for n in range(3):
            ids.append(client.run("renderer", "/render", {"gameId": f"g{n}"}).id)
            wait_for(lambda: client.store.get(ids[-1]).status == "success", timeout=20)
        assert len(set(_pids(client, ids))) == 3
    client.close()


def test_recycle_never_keeps_the_backend_process(tmp_path: Path) -> None:
    _, config, store_url, client = _setup(tmp_path, {"min": 1, "recycle": "never"})
    with running_controller(tmp_path, config, store_url):
        ids = []
        for n in range(3):
            ids.append(client.run("renderer", "/render", {"gameId": f"g{n}"}).id)
            wait_for(lambda: client.store.get(ids[-1]).status == "success", timeout=20)
        assert len(set(_pids(client, ids))) == 1
    client.close()


def test_sigterm_drains_the_machine_and_a_second_signal_stops_it_at_once(tmp_path: Path) -> None:
    _, config, store_url, client = _setup(tmp_path, {"min": 1})
    store = client.store
    with running_controller(tmp_path, config, store_url):
        machine = wait_for(lambda: live_machines(store, "render", "ready"), what="ready")[0]
        job = client.run("renderer", "/render", {"gameId": "g", "seconds": 2})
        wait_for(lambda: store.get(job.id).status == "processing", what="running")
        os.kill(int(store.machines.get(machine).provider_id or 0), signal.SIGTERM)
        done = wait_for(
            lambda: store.get(job.id).status == "success" and store.get(job.id), timeout=20
        )
        assert done.machine == machine and done.attempt_number == 1  # it finished its job
        gone = wait_for(
            lambda: (
                store.machines.get(machine).state == "destroyed" and store.machines.get(machine)
            ),
            timeout=20,
        )
        assert gone.drain_reason == "agent_stop" and gone.drained
        text = _machine_log(tmp_path, machine)
        assert "event=draining reason=signal" in text and "event=exit code=0" in text

        second = wait_for(lambda: live_machines(store, "render", "ready"), what="a replacement")[0]
        job = client.run("renderer", "/render", {"gameId": "h", "seconds": 30})
        wait_for(lambda: store.get(job.id).status == "processing", what="running")
        pid = int(store.machines.get(second).provider_id or 0)
        os.kill(pid, signal.SIGTERM)
        time.sleep(0.3)
        stopped_at = time.monotonic()
        os.kill(pid, signal.SIGTERM)
        wait_for(lambda: session_members(pid) == [], timeout=10, what="the agent gone")
        assert time.monotonic() - stopped_at < 8  # at once, not after the job's 30 s
        assert "event=exit code=1" in _machine_log(tmp_path, second)
    client.close()


def test_an_unreachable_controller_gets_backoff_not_a_tight_loop(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "SPKY_AGENT_CONTROLLER_URL": "http://127.0.0.1:9",  # nothing listens there
        "SPKY_AGENT_MACHINE": "m1",
        "SPKY_AGENT_JOIN_TOKEN": "t",
        "SPKY_AGENT_WORKDIR": str(tmp_path),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent"], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
    )
    time.sleep(4)
    proc.send_signal(signal.SIGKILL)
    out, _ = proc.communicate(timeout=10)
    waits = [float(w) for w in re.findall(r"event=join_retry .* wait=([\d.]+)", out)]
    assert 3 <= len(waits) <= 10, out  # 0.2 s doubling with jitter: a handful in 4 s
    assert waits[-1] > waits[0]
    assert all(line.split()[1:4][1] == "machine=m1" for line in out.splitlines()[:1])


def test_bad_agent_settings_exit_2_naming_them(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPKY_AGENT_")}
    done = subprocess.run(
        [sys.executable, "-m", "agent"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert "missing controller_url, machine, join_token (SPKY_AGENT_CONTROLLER_URL" in done.stderr

"""A machine's agent started again (as systemd would after a reboot) rejoins with the machine
credential of its first join, or is refused, powers off and exits with a code the unit does not
restart: never a loop. Real agent processes against a real controller on loopback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import requests

from sp00ky_infra.client import Client
from sp00ky_infra.controller.provisioners.local import session_members
from tests.controllers import (
    backend_app,
    live_machines,
    project,
    running_controller,
    wait_for,
)
from tests.helpers import ROOT

REFUSED = 3  # agent/main.py: a refused join or rejoin
# A lease long enough that a killed agent is started again before its machine counts as silent.
TIMINGS = "lease=10s,idleTimeout=2s,bootTimeout=15s"


def _no_restart_codes() -> set[int]:
    unit = (ROOT / "cloud-init" / "sp00ky-agent.service").read_text()
    (line,) = [each for each in unit.splitlines() if each.startswith("RestartPreventExitStatus=")]
    return {int(code) for code in line.split("=", 1)[1].split()}


def _setup(tmp_path: Path) -> tuple[Path, str, Client]:
    log = tmp_path / "backend.jsonl"
    config = project(
        tmp_path, {"render": {"min": 1}}, {"renderer": backend_app("render", "render_job", log)}
    )
    store_url = f"sqlite:///{tmp_path}/state.db"
    return config, store_url, Client(store_url, config)


def _agent_env(pid: int) -> tuple[dict[str, str], str]:
    """The environment and working directory the provisioner started the agent with: what
    systemd would start it with again."""
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    env = dict(entry.decode().split("=", 1) for entry in raw if b"=" in entry)
    return env, os.readlink(f"/proc/{pid}/cwd")


def _kill_session(pid: int, child: subprocess.Popen[str] | None = None) -> None:
    for member in session_members(pid):
        with suppress(ProcessLookupError):
            os.kill(member, signal.SIGKILL)
    if child is not None:
        child.wait(timeout=10)  # this test's own child: reaped, not left a zombie
    wait_for(lambda: not _running(pid), timeout=10, what="the agent's session gone")


def _running(session: int) -> list[int]:
    """The session's processes, but zombies (the controller reaps its dead agent only later)."""
    found = []
    for member in session_members(session):
        with suppress(OSError):
            if Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                found.append(member)
    return found


@contextmanager
def _agent(env: dict[str, str], cwd: str, log: Path) -> Iterator[subprocess.Popen[str]]:
    """An agent started by hand, in a session of its own; killed, backend and all, at the end."""
    with open(log, "a") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "agent"],
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
    try:
        yield proc
    finally:
        _kill_session(proc.pid, proc)


def _refused_once(env: dict[str, str], cwd: str, tmp_path: Path, name: str) -> str:
    """Run an agent that must be refused: it powers off (a marker line) and exits REFUSED."""
    marker = tmp_path / f"{name}.poweroff"
    env = {**env, "SPKY_AGENT_POWEROFF": json.dumps(["sh", "-c", f"echo off >> {marker}"])}
    done = subprocess.run(
        [sys.executable, "-m", "agent"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == REFUSED, done.stdout + done.stderr
    assert REFUSED in _no_restart_codes()  # systemd does not start it again: no loop
    assert marker.read_text() == "off\n", done.stdout  # powered off once
    assert "next=poweroff" in done.stdout and f"event=exit code={REFUSED}" in done.stdout
    return done.stdout


def test_a_restarted_agent_rejoins_with_its_credential_and_runs_jobs_again(
    tmp_path: Path,
) -> None:
    config, store_url, client = _setup(tmp_path)
    store = client.store
    with running_controller(tmp_path, config, store_url, SPKY_POOL_TIMINGS=TIMINGS):
        (machine,) = wait_for(lambda: live_machines(store, "render", "ready"), what="ready")
        first = client.run("renderer", "/render", {"gameId": "a"})
        wait_for(lambda: store.get(first.id).status == "success", timeout=20, what="a job")
        row = store.machines.get(machine)
        credential_file = tmp_path / ".sp00ky" / "machines" / f"{machine}.credential"
        credential = credential_file.read_text().strip()
        assert credential and credential_file.stat().st_mode & 0o777 == 0o600
        assert row.credential_hash and credential not in row.credential_hash
        machine_log = (tmp_path / ".sp00ky" / "machines" / f"{machine}.log").read_text()
        assert "event=credential_saved" in machine_log and credential not in machine_log

        pid = int(row.provider_id or 0)
        env, cwd = _agent_env(pid)
        _kill_session(pid)  # kill -9, agent and backend: a reboot
        restarted = tmp_path / "restarted.log"
        with _agent(env, cwd, restarted) as agent:
            wait_for(lambda: "event=ready" in restarted.read_text(), what="the rejoined backend")
            text = restarted.read_text()
            assert "event=credential_found" in text and "event=rejoined" in text
            assert "event=join " not in text and credential not in text
            second = client.run("renderer", "/render", {"gameId": "b"})
            done = wait_for(
                lambda: store.get(second.id).status == "success" and store.get(second.id),
                timeout=20,
                what="a job after the rejoin",
            )
            assert done.machine == machine
            assert store.machines.get(machine).state == "ready"
            assert [m.name for m in store.machines.live("render")] == [machine]  # no new one

            # Stopped on its machine: it drains and the controller destroys it.
            agent.send_signal(signal.SIGTERM)
            wait_for(
                lambda: store.machines.get(machine).state == "destroyed",
                timeout=30,
                what="the machine destroyed",
            )
        # Started again, with its credential, for a destroyed machine: 410, power off.
        kept = tmp_path / "credential"
        kept.write_text(credential + "\n")
        out = _refused_once({**env, "SPKY_AGENT_CREDENTIAL_FILE": str(kept)}, cwd, tmp_path, "gone")
        assert "event=rejoin_refused status=410" in out
    client.close()


def test_a_used_join_token_or_another_credential_is_refused_and_powers_off_once(
    tmp_path: Path,
) -> None:
    config, store_url, client = _setup(tmp_path)
    store = client.store
    with running_controller(tmp_path, config, store_url, SPKY_POOL_TIMINGS=TIMINGS) as controller:
        (machine,) = wait_for(lambda: live_machines(store, "render", "ready"), what="ready")
        env, cwd = _agent_env(int(store.machines.get(machine).provider_id or 0))
        # A second start with the used join token and no credential file: 401, power off.
        no_file = {**env, "SPKY_AGENT_CREDENTIAL_FILE": str(tmp_path / "none")}
        out = _refused_once(no_file, cwd, tmp_path, "used")
        assert "event=credential_none" in out and "event=join_refused status=401" in out
        assert "join token was used before" in out
        # Another credential: 401, power off.
        wrong = tmp_path / "wrong"
        wrong.write_text("not-the-credential\n")
        out = _refused_once(
            {**env, "SPKY_AGENT_CREDENTIAL_FILE": str(wrong)}, cwd, tmp_path, "wrong"
        )
        assert "event=rejoin_refused status=401" in out
        # The endpoint itself: 401 for another credential or an unknown machine.
        url = controller.agents_url
        for name in (machine, "render-nosuch"):
            answer = requests.post(
                f"{url}/v1/machines/{name}/rejoin", json={"credential": "x"}, timeout=10
            )
            assert answer.status_code == 401, answer.text
        # None of it touched the machine, which still runs jobs.
        assert store.machines.get(machine).state == "ready"
        job = client.run("renderer", "/render", {"gameId": "c"})
        wait_for(lambda: store.get(job.id).status == "success", timeout=20, what="a job")
    client.close()


class _Remote:
    """The controller as the agent sees it: answers join and rejoin from a script."""

    def __init__(self, *answers: Exception) -> None:
        self.answers = list(answers)
        self.calls: list[str] = []

    def join(self, token: str, agent: str | None = None) -> None:
        self.calls.append("join")
        raise self.answers.pop(0)

    def rejoin(self, credential: str, agent: str | None = None) -> None:
        self.calls.append(f"rejoin {credential}")
        raise self.answers.pop(0)


def test_transient_failures_are_retried_and_only_a_refusal_powers_off(
    tmp_path: Path, capsys: Any
) -> None:
    from agent import main as agent_main
    from agent.errors import ControllerError, Gone, Refused
    from agent.settings import Settings

    marker = tmp_path / "off"
    credential = tmp_path / "credential"
    settings = Settings(
        controller_url="http://127.0.0.1:9",
        machine="m1",
        join_token="t",
        poweroff=("sh", "-c", f"echo off >> {marker}"),
        credential_file=str(credential),
    )
    transient = (
        ControllerError("cannot reach the controller"),
        ControllerError("503: not the leader", 503),
        ControllerError("502: bad gateway", 502),
    )
    for final, how, status in (
        (Refused("401: used before", 401), "join", 401),
        (Gone("410: machine m1 is destroyed", 410), "rejoin", 410),
    ):
        if how == "rejoin":
            credential.write_text("the-credential\n")
        agent = agent_main.Agent(settings)
        agent.remote = _Remote(*transient, final)  # type: ignore[assignment]
        assert agent.run() == agent_main.REFUSED
        expected = "join" if how == "join" else "rejoin the-credential"
        assert agent.remote.calls == [expected] * 4  # type: ignore[attr-defined]
        out = capsys.readouterr().out
        assert out.count(f"event={how}_retry") == 3
        assert f"event={how}_refused status={status}" in out and "the-credential" not in out
        assert marker.read_text().count("off") == (1 if how == "join" else 2)

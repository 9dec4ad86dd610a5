"""The agent's upgrade to the archive its controller serves, on a fake clock: never while a
job runs (it stops taking work and waits, at most a lease), at once when idle; an archive that
is not the one named, or does not unpack, keeps the old agent, tried again after a backoff."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import tarfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agent import main as agent_main
from agent import upgrade
from agent.errors import ControllerError
from agent.jobs import JobRun
from agent.protocol import AgentSettings
from agent.settings import Settings
from sp00ky_infra.client import Client
from sp00ky_infra.shared.cloud_init import agent_archive
from tests.agent import test_agent_bootstrap as bootstrap
from tests.agent import test_agent_rejoin as rejoin
from tests.agent.test_agent_bootstrap import Hop
from tests.controllers import backend_events, live_machines, running_controller, wait_for
from tests.images.test_images import Logged

LEASE = 30.0


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def now(self) -> float:
        return self.t

    def wait(self, event: threading.Event, seconds: float) -> bool:
        self.t += seconds
        return event.is_set()


def _last(lines: Logged, event: str) -> dict[str, Any]:
    return [fields for name, fields in lines.events if name == event][-1]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def another_archive(marker: str = "another") -> bytes:
    """The agent archive with one file more: a real agent, with another sha256."""
    buffer = io.BytesIO()
    with (
        tarfile.open(fileobj=io.BytesIO(agent_archive()), mode="r:bz2") as source,
        tarfile.open(fileobj=buffer, mode="w:bz2") as tar,
    ):
        for member in source.getmembers():
            tar.addfile(member, source.extractfile(member))
        data = f"RELEASE = {marker!r}\n".encode()
        info = tarfile.TarInfo("agent/_release.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _upgrade(
    home: Path | None, own: str | None = "a" * 64
) -> tuple[upgrade.Upgrade, Clock, Logged]:
    clock, lines = Clock(), Logged()
    return upgrade.Upgrade(home, own, lines, clock), clock, lines


def test_no_upgrade_while_a_job_runs_and_at_once_when_none_does(tmp_path: Path) -> None:
    plan, clock, lines = _upgrade(tmp_path)
    assert plan.step(1, LEASE) == "claim"  # nothing due
    served = sha256(agent_archive())
    plan.served(served)
    assert _last(lines, "upgrade_due") == {"served": served, "running": "a" * 64}
    # a job runs: no new work, no upgrade, for as long as it runs within a lease
    for _ in range(29):
        assert plan.step(1, LEASE) == "hold"
        clock.t += 1.0
    assert lines.names().count("upgrade_waiting") == 1
    assert plan.step(0, LEASE) == "go"  # it ended (its result acknowledged): now
    for left in ("a" * 64, "d" * 64, ".interrupted-unpack"):  # this one's, an older one
        (tmp_path / "releases" / left).mkdir(parents=True)
    release = plan.attempt(agent_archive)
    assert release == tmp_path / "releases" / served
    assert (release / "agent" / "__init__.py").is_file()
    assert (release / "install-agent.sh").is_file()
    assert os.readlink(tmp_path / "current") == f"releases/{served}"
    assert lines.names()[-3:] == ["upgrade_fetched", "upgrade_unpacked", "upgrade_switched"]
    assert sorted(p.name for p in (tmp_path / "releases").iterdir()) == sorted(["a" * 64, served])


def test_a_job_longer_than_a_lease_defers_the_upgrade_and_the_agent_works_on(
    tmp_path: Path,
) -> None:
    plan, clock, lines = _upgrade(tmp_path)
    plan.served(sha256(agent_archive()))
    assert plan.step(1, LEASE) == "hold"
    clock.t += LEASE
    assert plan.step(1, LEASE) == "claim"  # it takes work again
    wait = plan.retry_at - clock.t
    assert _last(lines, "upgrade_deferred")["retry_in"] == f"{wait:.1f}s"
    assert upgrade.RETRY_FIRST_SECONDS / 2 <= wait <= upgrade.RETRY_FIRST_SECONDS
    clock.t += wait - 0.1
    assert plan.step(0, LEASE) == "claim"  # not before its retry time, even idle
    clock.t += 0.1
    assert plan.step(0, LEASE) == "go"
    assert not (tmp_path / "current").exists()


def test_an_archive_not_the_one_named_keeps_the_old_agent_and_backs_off(tmp_path: Path) -> None:
    plan, clock, lines = _upgrade(tmp_path)
    named = sha256(agent_archive())
    plan.served(named)
    old = tmp_path / "releases" / ("a" * 64)
    old.mkdir(parents=True)
    os.symlink(f"releases/{'a' * 64}", tmp_path / "current")
    waits = []
    for attempt in range(4):
        assert plan.step(0, LEASE) == "go"
        assert plan.attempt(lambda: another_archive()) is None
        failed = _last(lines, "upgrade_failed")
        assert f"the controller named {named}" in failed["reason"]
        waits.append(plan.retry_at - clock.t)
        assert failed["retry_in"] == f"{waits[-1]:.1f}s"
        base = upgrade.RETRY_FIRST_SECONDS * 2**attempt
        assert base / 2 <= waits[-1] <= base  # doubling: never a tight loop
        # the old agent serves meanwhile: it takes work until the retry time
        clock.t += waits[-1] - 0.5
        assert plan.step(0, LEASE) == "claim"
        clock.t += 0.5
    assert os.readlink(tmp_path / "current") == f"releases/{'a' * 64}"
    assert sorted(p.name for p in (tmp_path / "releases").iterdir()) == ["a" * 64]  # nothing left
    # the controller unreachable is a failure like the others
    assert plan.step(0, LEASE) == "go"

    def unreachable() -> bytes:
        raise ControllerError("cannot reach the controller: refused")

    assert plan.attempt(unreachable) is None
    assert "cannot reach" in _last(lines, "upgrade_failed")["reason"]


def test_an_archive_that_does_not_unpack_keeps_the_old_agent(tmp_path: Path) -> None:
    for broken in (b"not bzip2 at all", _tar_without_agent()):
        plan, _, lines = _upgrade(tmp_path)
        plan.served(sha256(broken))
        assert plan.step(0, LEASE) == "go"
        assert plan.attempt(lambda archive=broken: archive) is None  # type: ignore[misc]
        assert "upgrade_failed" in lines.names()
        assert not (tmp_path / "current").exists()
        assert list((tmp_path / "releases").iterdir()) == []  # no partial release left


def _tar_without_agent() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:bz2") as tar:
        info = tarfile.TarInfo("README")
        tar.addfile(info, io.BytesIO(b""))
    return buffer.getvalue()


def test_the_first_join_names_the_agent_installed_first_and_no_upgrade_follows(
    tmp_path: Path,
) -> None:
    served = sha256(agent_archive())
    plan, _, lines = _upgrade(tmp_path, own=None)
    plan.served(served, first_join=True)
    assert plan.own == served and plan.step(0, LEASE) == "claim"
    assert (tmp_path / "installed").read_text().strip() == served
    assert upgrade.own_sha256(tmp_path, tmp_path / "agent") == served  # after a restart
    assert "upgrade_due" not in lines.names()
    # served another, then its own again (a controller rolled back): nothing left to do
    plan.served("c" * 64)
    assert plan.step(0, LEASE) == "go"
    plan.served(served)
    assert plan.step(0, LEASE) == "claim" and lines.names()[-1] == "upgrade_cancelled"
    # without a home the agent never upgrades: said once, and it takes work
    homeless, _, lines = _upgrade(None)
    for _ in range(3):
        homeless.served(served)
    assert lines.names() == ["upgrade_skipped"] and homeless.step(0, LEASE) == "claim"


def test_a_release_names_itself_and_its_home(tmp_path: Path) -> None:
    sha = "b" * 64
    package = tmp_path / "releases" / sha / "agent"
    assert upgrade.release_of(package) == sha
    assert upgrade.home_of("", package) == tmp_path
    assert upgrade.home_of("/elsewhere", package) == Path("/elsewhere")
    assert upgrade.release_of(tmp_path / "agent") is None
    assert upgrade.home_of("", tmp_path / "agent") is None  # a checkout: no home
    (tmp_path / "install-agent.sh").write_text("")
    assert upgrade.home_of("", tmp_path / "agent") == tmp_path  # installed from an archive


def test_an_agent_started_from_the_one_installed_first_runs_current_instead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[dict[str, str]] = []
    lines = Logged()
    upgrade.relaunch(str(tmp_path), lines, lambda env: ran.append(dict(env)))
    assert ran == []  # never upgraded
    sha = sha256(agent_archive())
    upgrade.install(tmp_path, agent_archive(), sha, lines)
    monkeypatch.setenv("PYTHONPATH", f"/opt/sp00ky{os.pathsep}{tmp_path / 'current'}")
    monkeypatch.delenv(upgrade.RELAUNCHED, raising=False)
    upgrade.relaunch(str(tmp_path), lines, lambda env: ran.append(dict(env)))
    (env,) = ran
    assert env["PYTHONPATH"] == f"{tmp_path / 'current'}{os.pathsep}/opt/sp00ky"
    assert env[upgrade.RELAUNCHED] == sha and _last(lines, "relaunch") == {"release": sha}
    # started by that relaunch and still not running it: never again (no exec loop)
    monkeypatch.setenv(upgrade.RELAUNCHED, sha)
    upgrade.relaunch(str(tmp_path), lines, lambda env: ran.append(dict(env)))
    assert len(ran) == 1


# --- the loop: no work taken while the upgrade waits, the process replaced when idle --------


class _Backend:
    runtime = object()
    port = 0

    def __init__(self) -> None:
        self.stopped = 0

    def alive(self) -> bool:
        return True

    def stop(self) -> None:
        self.stopped += 1


class _Remote:
    def __init__(self, archive: bytes) -> None:
        self.archive = archive
        self.fetches = 0

    def agent_archive(self, timeout: float) -> bytes:
        self.fetches += 1
        return self.archive


def _looping(
    tmp_path: Path, archive: bytes
) -> tuple[agent_main.Agent, Clock, list[dict[str, str]]]:
    credential = tmp_path / "credential"
    credential.write_text("the-credential\n")
    settings = Settings(
        controller_url="http://127.0.0.1:9",
        machine="m1",
        join_token="t",
        credential_file=str(credential),
        agent_home=str(tmp_path / "home"),
    )
    agent = agent_main.Agent(settings)
    clock = Clock()
    agent.upgrade.clock = clock
    agent.upgrade.own = "a" * 64
    agent.config = AgentSettings(
        slots=2, lease=LEASE, poll_wait=10.0, recycle="never", boot_timeout=60, max_offline=90
    )
    agent.backend = _Backend()  # type: ignore[assignment]
    agent.remote = _Remote(archive)  # type: ignore[assignment]
    restarts: list[dict[str, str]] = []
    agent.execute = restarts.append  # type: ignore[assignment]
    return agent, clock, restarts


def test_the_agent_takes_no_work_until_its_job_ends_then_restarts_into_the_upgrade(
    tmp_path: Path,
) -> None:
    archive = agent_archive()
    agent, clock, restarts = _looping(tmp_path, archive)
    run = JobRun("j1", "1", "/render", {}, None, 0.0, 2.0)
    agent.work.runs = {"j1": run}
    agent.upgrade.served(sha256(archive))
    agent.upgrading()
    assert not agent.taking and agent.outgoing().request.free_slots == 0
    assert agent.remote.fetches == 0 and restarts == []  # type: ignore[attr-defined]
    clock.t += LEASE / 2
    agent.upgrading()
    assert agent.remote.fetches == 0 and restarts == []  # type: ignore[attr-defined]
    agent.work.forget(run)  # its result acknowledged
    agent.upgrading()
    (env,) = restarts
    home = tmp_path / "home"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(home / "current")
    assert env[upgrade.RELAUNCHED] == sha256(archive)
    assert agent.backend.stopped == 1  # type: ignore[attr-defined]
    assert (home / "current" / "agent" / "main.py").is_file()


def test_a_mismatch_leaves_the_agent_taking_work_with_its_old_self(tmp_path: Path) -> None:
    agent, clock, restarts = _looping(tmp_path, another_archive())
    agent.upgrade.served(sha256(agent_archive()))
    agent.upgrading()
    assert agent.remote.fetches == 1 and restarts == []  # type: ignore[attr-defined]
    assert agent.taking and agent.outgoing().request.free_slots == 2
    assert agent.backend.stopped == 0  # type: ignore[attr-defined]
    agent.upgrading()  # within the backoff: not fetched again
    assert agent.remote.fetches == 1  # type: ignore[attr-defined]
    clock.t += upgrade.RETRY_FIRST_SECONDS
    agent.upgrading()
    assert agent.remote.fetches == 2  # type: ignore[attr-defined]


# --- a real agent process against a real controller ------------------------------------------


def _flipped(corrupt: threading.Event) -> Callable[[bytes], bytes]:
    """The agent archive with its last byte changed while ``corrupt`` is set (what a broken
    disk or link would do), else as served."""
    return lambda archive: archive[:-1] + bytes([archive[-1] ^ 1]) if corrupt.is_set() else archive


def _after(log: Path, first: str, then: str) -> bool:
    text = log.read_text()
    return first in text and then in text[text.index(first) :]


def test_an_agent_on_another_archive_upgrades_between_jobs_and_rejoins_as_the_same_machine(
    tmp_path: Path,
) -> None:
    """The machine's agent runs another archive than its controller serves (the controller
    was upgraded under it). A corrupted fetch is refused and the old agent serves a job; the
    next fetch waits for that job, checks, restarts (the same process) and rejoins as the
    same machine, which runs the next job: each job once."""
    config, store_url, client = rejoin._setup(tmp_path)
    store = client.store
    served = sha256(agent_archive())
    home = tmp_path / "home"
    old = another_archive("the agent before")
    upgrade.install(home, old, sha256(old), Logged())
    with running_controller(
        tmp_path, config, store_url, SPKY_POOL_TIMINGS=rejoin.TIMINGS
    ) as controller:
        (machine,) = wait_for(lambda: live_machines(store, "render", "ready"), what="ready")
        assert store.machines.get(machine).agent == served
        pid = int(store.machines.get(machine).provider_id or 0)
        env, cwd = rejoin._agent_env(pid)
        rejoin._kill_session(pid)
        corrupt = threading.Event()
        corrupt.set()
        log = tmp_path / "agent.log"
        with bootstrap._hop(Hop(controller.agents_url, alter=_flipped(corrupt))) as url:
            env = {
                **upgrade.restart_env(env, home, sha256(old)),
                "SPKY_AGENT_HOME": str(home),
                "SPKY_AGENT_CONTROLLER_URL": url,
            }
            with rejoin._agent(env, cwd, log) as agent:
                _upgrades(log, corrupt, client, machine, served, sha256(old))
                assert agent.poll() is None  # one process throughout: replaced, never exited
        events = backend_events(tmp_path / "backend.jsonl")
        started = [each["gameId"] for each in events if each["event"] == "start"]
        assert sorted(started) == ["after", "before"]  # each job ran once
    client.close()


def _upgrades(
    log: Path, corrupt: threading.Event, client: Client, machine: str, served: str, old: str
) -> None:
    store = client.store
    wait_for(lambda: "event=upgrade_failed" in log.read_text(), what="the corrupted fetch")
    assert f"the controller named {served}" in log.read_text()
    assert store.machines.get(machine).agent == old  # its rejoin said which it runs
    # longer than the first retry's backoff (at most RETRY_FIRST_SECONDS), well within a lease
    before = client.run("renderer", "/render", {"gameId": "before", "seconds": 7})
    wait_for(lambda: store.get(before.id).status == "processing", what="the job before")
    corrupt.clear()
    wait_for(lambda: _after(log, "event=upgrade_restart", "event=ready"), timeout=60, what="up")
    text = log.read_text()
    restart = text.index("event=upgrade_restart")
    assert f"event=result job={before.id}" in text[:restart]  # never while a job runs
    assert "event=upgrade_waiting" in text[:restart]
    assert f"event=rejoined pool=render backend=renderer slots=1 agent={served}" in text[restart:]
    assert "event=join " not in text
    after = client.run("renderer", "/render", {"gameId": "after"})
    done = wait_for(
        lambda: store.get(after.id).status == "success" and store.get(after.id),
        timeout=30,
        what="the job after",
    )
    assert done.machine == machine and store.machines.get(machine).agent == served
    for job in (before, after):
        assert store.get(job.id).status == "success" and store.get(job.id).attempt_number == 1
    assert [m.name for m in store.machines.live("render")] == [machine]  # no new machine


def test_the_restart_keeps_the_machine_credential_or_does_not_happen(tmp_path: Path) -> None:
    archive = agent_archive()
    agent, _, restarts = _looping(tmp_path, archive)
    Path(agent.settings.credential_file).unlink()  # never saved (a full disk at the join)
    agent.credential = "the-credential"
    agent.upgrade.served(sha256(archive))
    agent.upgrading()
    assert restarts == [] and agent.remote.fetches == 0  # type: ignore[attr-defined]
    assert agent.taking and agent.backend.stopped == 0  # type: ignore[attr-defined]
    # no credential file setting (a machine container): kept beside the releases for the
    # new agent, which is told where
    agent.settings = dataclasses.replace(agent.settings, credential_file="")
    agent.upgrade.retry_at = 0.0
    agent.upgrading()
    (env,) = restarts
    kept = tmp_path / "home" / "credential"
    assert env["SPKY_AGENT_CREDENTIAL_FILE"] == str(kept)
    assert kept.read_text() == "the-credential\n" and kept.stat().st_mode & 0o777 == 0o600

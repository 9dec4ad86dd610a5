"""A `pulumi up` killed with SIGKILL at each point of an update (its whole session: the CLI,
its language host and provider host, as a killed controller's update dies), held at that point
by the fake Hetzner API; then a fresh controller on the same store and stack converges. Each
case checks the cloud's own list of servers afterwards, and that the stack updates again.

The points, and how each is held: tests/infra/held_updates.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from sp00ky_infra.controller.provisioners.base import MachineSpec
from sp00ky_infra.controller.provisioners.local import _signal, session_members
from sp00ky_infra.controller.provisioners.pulumi import (
    PulumiProvisioner,
    automation_stack,
    stale_locks,
)
from sp00ky_infra.policy.machines import Reason
from sp00ky_infra.rehearse.cloud import FakeHetzner
from sp00ky_infra.store import SqlStore, open_store
from tests.controllers import wait_for
from tests.infra.held_updates import (
    hold_after_the_create,
    hold_before_the_create,
    hold_the_delete,
    lock_files,
    started_up,
)
from tests.infra.stack_controller import (
    converge,
    engine_env,
    firewalled_stack,
    fresh_controller,
)
from tests.infra.test_pulumi_engine import _servers
from tests.pulumi_engine import StackProject


def _killed_up(project: StackProject, held: Callable[[], object]) -> None:
    """`pulumi up` in a session of its own, killed (every process of it, at once) with
    SIGKILL once ``held`` says the update is held at its point."""
    up = started_up(project)
    try:
        wait_for(held, timeout=120, what="the update held at its point")
    finally:
        _signal(session_members(up.pid), signal.SIGKILL)  # all at once: none outlives it
        up.wait(timeout=10)


def _gone(store: SqlStore, name: str) -> None:
    """The machine's row ended (it failed to boot and was destroyed): no longer wanted."""
    store.machines.move(name, Reason.BOOT_FAILED, time.time())
    store.machines.move(name, Reason.DESTROYED, time.time())


@contextmanager
def _rows_on_the_stack(
    tmp_path: Path, pulumi_bin: str, names: list[str]
) -> Iterator[tuple[FakeHetzner, StackProject, SqlStore, str]]:
    """The fake cloud, the stack asked for ``names`` (not yet updated) and the store with
    their rows, as a controller leaves them before its update; and the pool's revision."""
    with FakeHetzner() as cloud:
        project, revision = firewalled_stack(tmp_path, pulumi_bin, cloud)
        store = open_store(f"sqlite:///{tmp_path}/state.db")
        try:
            for name in names:
                store.machines.add(name, "render", "pulumi", revision, 1, time.time())
            project.machines({"render": dict.fromkeys(names, revision)})
            yield cloud, project, store, revision
        finally:
            store.close()


def _converged(tmp_path: Path, project: StackProject, store: SqlStore, machines: int) -> None:
    """A fresh controller on the store and the stack, its pool wanting ``machines``, has
    brought the stack to what the store wants."""
    with fresh_controller(tmp_path, project, store, machines) as (controller, provisioner):
        converge(controller, provisioner)


def test_killed_before_the_create(
    tmp_path: Path, pulumi_bin: str, caplog: pytest.LogCaptureFixture
) -> None:
    with _rows_on_the_stack(tmp_path, pulumi_bin, ["render-a"]) as (cloud, project, store, _):
        _killed_up(project, hold_before_the_create(cloud))
        assert cloud.servers == {} and lock_files(tmp_path / "state")
        _converged(tmp_path, project, store, 1)
        (server,) = cloud.servers.values()
        assert server["name"] == "render-a"
        assert store.machines.get("render-a").provider_id == str(server["id"])
        assert not lock_files(tmp_path / "state")
        assert "event=stack_lock_taken_over" in caplog.text
        assert "event=pending_operations" in caplog.text and "creating:render-a" in caplog.text
        assert project.up() == {"same": 4}  # the stack updates, and has what the cloud has


def test_killed_after_the_server_was_made_it_is_adopted(tmp_path: Path, pulumi_bin: str) -> None:
    with _rows_on_the_stack(tmp_path, pulumi_bin, ["render-a"]) as (cloud, project, store, _):
        _killed_up(project, hold_after_the_create(cloud))
        cloud.create_then_stall = None
        (made,) = cloud.servers.values()
        _converged(tmp_path, project, store, 1)
        assert list(_servers(cloud)) == ["render-a"]
        assert _servers(cloud)["render-a"]["id"] == made["id"]  # the same server, not a second
        assert store.machines.get("render-a").provider_id == str(made["id"])
        assert project.up() == {"same": 4}


def test_killed_after_the_server_was_made_for_a_row_since_gone(
    tmp_path: Path, pulumi_bin: str, caplog: pytest.LogCaptureFixture
) -> None:
    with _rows_on_the_stack(tmp_path, pulumi_bin, ["render-a"]) as (cloud, project, store, _):
        _killed_up(project, hold_after_the_create(cloud))
        cloud.create_then_stall = None
        _gone(store, "render-a")
        _converged(tmp_path, project, store, 0)
        assert cloud.servers == {}  # looked up by name and deleted
        assert "event=server_deleted machine=render-a" in caplog.text
        assert project.up() == {"same": 3}


def test_killed_during_a_delete(tmp_path: Path, pulumi_bin: str) -> None:
    names = ["render-a", "render-b"]
    with _rows_on_the_stack(tmp_path, pulumi_bin, names) as (cloud, project, store, revision):
        project.up()
        _gone(store, "render-b")
        project.machines({"render": {"render-a": revision}})
        _killed_up(project, hold_the_delete(cloud))
        assert sorted(_servers(cloud)) == ["render-a", "render-b"]
        _converged(tmp_path, project, store, 1)
        assert sorted(_servers(cloud)) == ["render-a"]
        assert project.up() == {"same": 4}


def test_only_a_lock_whose_holder_is_gone_from_this_host_is_stale(tmp_path: Path) -> None:
    locks = tmp_path / ".pulumi" / "locks" / "organization" / "shop" / "prod"
    locks.mkdir(parents=True)
    gone = subprocess.Popen(["true"])
    gone.wait()
    held = {
        "dead-here": {"pid": gone.pid, "hostname": "this-host"},
        "alive-here": {"pid": os.getpid(), "hostname": "this-host"},
        "dead-elsewhere": {"pid": gone.pid, "hostname": "another-host"},
    }
    for name, holder in held.items():
        (locks / f"{name}.json").write_text(json.dumps({**holder, "username": "root"}))
    other = tmp_path / ".pulumi" / "locks" / "organization" / "other" / "prod"
    other.mkdir(parents=True)  # another project's stack of the same name
    (other / "dead.json").write_text(json.dumps({"pid": gone.pid, "hostname": "this-host"}))
    found = stale_locks(f"file://{tmp_path}", "shop", "prod", "this-host")
    assert [path.name for path in found] == ["dead-here.json"]
    assert stale_locks("https://api.pulumi.com", "shop", "prod", "this-host") == []


def test_an_update_that_finds_a_dead_holders_lock_takes_it_over_at_once(
    tmp_path: Path, pulumi_bin: str, caplog: pytest.LogCaptureFixture
) -> None:
    """No restart in between (nothing adopted): the provisioner's own update meets the lock
    of a killed `pulumi up`, removes it and goes on without waiting."""
    with _rows_on_the_stack(tmp_path, pulumi_bin, ["render-a"]) as (cloud, project, _, rev):
        _killed_up(project, hold_after_the_create(cloud))
        cloud.create_then_stall = None
        (made,) = cloud.servers.values()
        with engine_env(project):
            provisioner = PulumiProvisioner(
                lambda: automation_stack("prod", str(project.dir)), lock_retry=600.0
            )  # a lock waited for would outlast the test
            try:
                provisioner.create(
                    MachineSpec("render-a", "render", "renderer", rev, "https://pool.shop.example")
                )
                wait_for(provisioner.idle, timeout=240, what="the update")
                assert [(o.machine, o.kind, o.detail) for o in provisioner.outcomes()] == [
                    ("render-a", "created", str(made["id"]))
                ]
            finally:
                provisioner.close()
        assert "event=stack_lock_taken_over" in caplog.text
        assert provisioner.locked_since is None
        assert list(_servers(cloud)) == ["render-a"]

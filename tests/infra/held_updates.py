"""An update of the prod stack held at one point of its work by the fake Hetzner API's fault
switches (sp00ky_infra/rehearse/cloud.py), and what kills the processes running it there.

The points: before the create (the API answered 429 and the provider waits out Retry-After),
after POST /servers made the server but before its answer came back (so before the state has
it), and during a delete (the API answered 503 and the provider waits to try again). Each
``hold_*`` arms its switch and returns the check that the update is held there.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

from sp00ky_infra.controller.provisioners.local import _signal, _wait_gone
from sp00ky_infra.rehearse.cloud import FakeHetzner
from tests.pulumi_engine import StackProject

HELD_SECONDS = 300.0  # far past every test's own bound: the point holds until a kill


def hold_before_the_create(cloud: FakeHetzner) -> Callable[[], bool]:
    cloud.fail_next = [(429, "rate_limit_exceeded", HELD_SECONDS)]
    return lambda: ("POST", "/v1/servers") in cloud.requests and not cloud.fail_next


def hold_after_the_create(cloud: FakeHetzner) -> Callable[[], bool]:
    """The server is made and its answer held (a provider that lives on gives up at its
    client's timeout, then looks the server up by name)."""
    had = set(cloud.servers)
    cloud.create_then_stall = HELD_SECONDS
    return lambda: bool(set(cloud.servers) - had)


def hold_the_delete(cloud: FakeHetzner) -> Callable[[], bool]:
    cloud.fail_next = [(503, "unavailable", HELD_SECONDS)]
    return lambda: any(r[0] == "DELETE" for r in cloud.requests) and not cloud.fail_next


def started_up(project: StackProject) -> subprocess.Popen[bytes]:
    """`pulumi up` on the stack, as by hand, in a session of its own."""
    return subprocess.Popen(
        ["pulumi", "up", "--yes", "--skip-preview", "--stack", project.stack, "--non-interactive"],
        cwd=project.dir, env=project.env, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def lock_files(state: Path) -> list[Path]:
    """The stack locks in the ``file://`` backend at ``state``."""
    return list((state / ".pulumi" / "locks").rglob("*.json"))


def descendants(pid: int) -> list[int]:
    """The processes ``pid`` started, and theirs, as /proc has them now."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(pid: int) -> list[int]:
    """SIGKILL ``pid`` and every process under it at once, as a container's or a cgroup's
    kill does: each is stopped first, so none starts another or outlives the rest; the
    processes killed, once gone."""
    stopped: set[int] = set()
    while fresh := {pid, *descendants(pid)} - stopped:
        _signal(sorted(fresh), signal.SIGSTOP)
        stopped |= fresh
    _signal(sorted(stopped), signal.SIGKILL)
    _wait_gone(sorted(stopped), 10)
    return sorted(stopped)

"""The guardian's pass against the fake Hetzner API, and its command."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from sp00ky_infra.guardian.errors import Incomplete
from sp00ky_infra.guardian.passes import destroy_project, run_pass
from sp00ky_infra.hetzner import HetznerAPI
from sp00ky_infra.hetzner.heartbeat import heartbeats, stamp_heartbeat
from sp00ky_infra.policy.guardian import Why
from sp00ky_infra.rehearse.cloud import TOKEN, FakeHetzner
from tests.helpers import cli_process

NOW = datetime.now(UTC)


@pytest.fixture
def fake() -> Iterator[FakeHetzner]:
    with FakeHetzner() as api:
        yield api


def _api(fake: FakeHetzner) -> HetznerAPI:
    return HetznerAPI(TOKEN, fake.url, wait=lambda attempt, after: 0.0, sleep=lambda _: None)


def _server(fake: FakeHetzner, name: str, project: str = "shop", pool: str = "render",
            hours: float = 1.0, limit: str = "2") -> int:  # fmt: skip
    labels = {"sp00ky/project": project, "sp00ky/pool": pool, "sp00ky/machine": name,
              "sp00ky/limit": limit}  # fmt: skip
    return int(fake.add_server(name, labels, NOW - timedelta(hours=hours))["id"])


def _beat(fake: FakeHetzner, project: str = "shop", minutes_ago: float = 1) -> None:
    stamp_heartbeat(_api(fake), project, (NOW - timedelta(minutes=minutes_ago)).timestamp())


def test_each_rule_alone(fake: FakeHetzner) -> None:
    _beat(fake)
    _beat(fake, "quiet", minutes_ago=45)
    old = _server(fake, "old", hours=73)
    quiet = _server(fake, "q1", project="quiet")
    crowd = [_server(fake, f"c{n}", pool="crowd", hours=10 - n, limit="1") for n in range(5)]
    fine = _server(fake, "fine")
    report = run_pass(_api(fake), NOW.timestamp())
    whys = {v.machine.id: v.why for v in report.verdicts}
    assert whys == {
        old: Why.TOO_OLD,
        quiet: Why.SILENT_SCHEDULER,
        crowd[4]: Why.OVER_CAP,
        crowd[3]: Why.OVER_CAP,
    }
    assert set(fake.servers) == {fine, *crowd[:3]}
    assert sorted(report.destroyed) == sorted(whys)


def test_a_live_schedulers_machines_at_the_cap_are_untouched_and_a_pass_is_idempotent(
    fake: FakeHetzner,
) -> None:
    _beat(fake)
    ids = {_server(fake, f"m{n}") for n in range(5)}  # limit 2: cap 5
    assert run_pass(_api(fake), NOW.timestamp()).verdicts == []
    _server(fake, "m5")
    first = run_pass(_api(fake), NOW.timestamp())
    assert len(first.destroyed) == 1 and set(fake.servers) == ids
    assert run_pass(_api(fake), NOW.timestamp()).verdicts == []


def test_dry_run_changes_nothing(fake: FakeHetzner) -> None:
    _server(fake, "old", hours=80)
    report = run_pass(_api(fake), NOW.timestamp(), dry_run=True)
    assert len(report.verdicts) == 1 and report.destroyed == [] and len(fake.servers) == 1


def test_hundreds_of_servers_across_pages(fake: FakeHetzner) -> None:
    _beat(fake)
    for n in range(260):
        _server(fake, f"s{n}", pool=f"pool{n % 10}", limit="10", hours=1 + n / 100)
    for n in range(40):
        fake.add_server(f"unrelated{n}", {"team": "web"})  # not sp00ky's: never looked at
    report = run_pass(_api(fake), NOW.timestamp())
    assert report.servers == 260  # every page was read, and only sp00ky's servers
    # 26 machines in each pool, capped at 2 x 10 + 1 = 21: the newest five of each go
    assert len(report.destroyed) == 50 and len(fake.servers) == 210 + 40


def test_a_listing_error_destroys_nothing(fake: FakeHetzner) -> None:
    _server(fake, "old", hours=80)
    fake.fail_next = [(500, "service_error", None)] * 10
    with pytest.raises(Incomplete, match="destroyed nothing"):
        run_pass(_api(fake), NOW.timestamp())
    assert len(fake.servers) == 1


def test_a_failed_destroy_does_not_stop_the_others(fake: FakeHetzner) -> None:
    a = _server(fake, "a", hours=80)
    b = _server(fake, "b", hours=81)
    api = _api(fake)
    machines_listed = len(fake.requests)
    real_delete = api.delete_server

    def flaky(server_id: int | str) -> bool:
        if int(server_id) == a:
            fake.fail_next.append((409, "locked", None))
        return real_delete(server_id)

    api.delete_server = flaky  # type: ignore[method-assign]
    report = run_pass(api, NOW.timestamp())
    assert report.destroyed == [b] and [i for i, _ in report.failed] == [a]
    assert "locked" in report.failed[0][1] and machines_listed < len(fake.requests)


def test_destroy_project_takes_machines_first_then_firewalls(fake: FakeHetzner) -> None:
    api = _api(fake)
    _beat(fake)
    _server(fake, "m1")
    keep = _server(fake, "other", project="elsewhere")
    api.request(
        "POST",
        "/firewalls",
        json={"name": "sp00ky-shop-render", "labels": {"sp00ky/project": "shop"}},
    )
    report = destroy_project(api, "shop")
    assert len(report.destroyed) == 1 and set(fake.servers) == {keep}
    assert fake.firewalls == {}
    deletes = [path for method, path in fake.requests if method == "DELETE"]
    assert deletes[0].startswith("/v1/servers/") and all(
        p.startswith("/v1/firewalls/") for p in deletes[1:]
    )


def test_the_command_and_its_exit_codes(fake: FakeHetzner) -> None:
    env = {"HCLOUD_TOKEN": TOKEN, "HCLOUD_ENDPOINT": fake.url}
    old = _server(fake, "old", hours=80)
    planned = cli_process("guardian", "--dry-run", "--json", env=env)
    assert planned.returncode == 0
    plan = json.loads(planned.stdout)
    assert (
        plan["dry_run"] and plan["plan"][0]["id"] == old and plan["plan"][0]["reason"] == "too_old"
    )
    assert old in fake.servers
    done = cli_process("guardian", env=env)
    assert (
        done.returncode == 0 and f"destroy server {old} old (shop/render): too_old" in done.stdout
    )
    assert "reason=too_old" in done.stderr and fake.servers == {}
    assert cli_process("guardian", env={"HCLOUD_TOKEN": ""}).returncode == 2
    fake.fail_next = [(503, "service_error", None)] * 10
    incomplete = cli_process("guardian", env=env)
    assert incomplete.returncode == 3 and "destroyed nothing" in incomplete.stderr


def test_the_controller_stamps_the_heartbeat_the_guardian_reads(
    fake: FakeHetzner, tmp_path: Path
) -> None:
    from tests.controllers import backend_app, project, running_controller, wait_for

    app = backend_app("render", "render_job", tmp_path / "log")
    config = project(
        tmp_path, {"render": {"min": 0, "autoscale": True, "max": 1}}, {"renderer": app}
    )
    env = {"HCLOUD_TOKEN": TOKEN, "HCLOUD_ENDPOINT": fake.url, "SPKY_PROJECT": "shop",
           "SPKY_HEARTBEAT": "500ms"}  # fmt: skip
    started = time.time()
    with running_controller(tmp_path, config, f"sqlite:///{tmp_path}/s.db", **env):
        first = wait_for(lambda: heartbeats(_api(fake)).get("shop"), timeout=20, what="a heartbeat")
        later = wait_for(lambda: (heartbeats(_api(fake)).get("shop") or 0) > first, timeout=20)
        assert later and len(fake.firewalls) == 1  # one heartbeat firewall, re-stamped
    assert started - 1 <= first <= time.time()  # a stamp of the time it was made


def test_a_pass_over_50_machines_is_two_requests_and_says_what_is_left(
    fake: FakeHetzner,
) -> None:
    fake.clock = lambda: 0.0  # no refill meanwhile: the budget left is exact
    _beat(fake)  # a listing and a POST
    for n in range(50):
        _server(fake, f"m{n}", limit="50")
    fake.requests.clear()
    report = run_pass(_api(fake), NOW.timestamp())
    assert fake.counted() == {"GET /servers": 1, "GET /firewalls": 1}
    assert report.as_json()["api"] == {"requests": 2, "remaining": 3600 - 4, "limit": 3600}

"""A table's concurrency retuned live (the Jobs docs: "retune live, no redeploy"): `jobs
policy` changes what the next tick admits, the standby that takes over admits by it, and a
deploy keeps it unless the file's line changed (real controllers, on SQLite and PostgreSQL)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from sp00ky_infra.client import Client
from tests.controllers import backend_app, deploys, two_controllers, wait_for
from tests.helpers import cli


def _peak(client: Client, ids: list[str], timeout: float = 60) -> int:
    """The most of ``ids`` seen processing at once, watched until every one succeeded."""
    peak, deadline = 0, time.monotonic() + timeout
    while time.monotonic() < deadline:
        statuses = [client.store.get(job_id).status for job_id in ids]
        peak = max(peak, statuses.count("processing"))
        if all(status == "success" for status in statuses):
            return peak
        time.sleep(0.05)
    raise AssertionError(f"jobs not done in {timeout}s: {statuses}")


def test_a_retune_holds_from_the_next_tick_and_after_a_failover(
    tmp_path: Path, store_url: str
) -> None:
    app = backend_app("render", "render_job", tmp_path / "backend.jsonl")
    app["method"]["concurrency"] = 1
    with two_controllers(tmp_path, store_url, app) as (first, second, client):
        wait_for(first.leader, what="A leading")
        ids = [client.run("renderer", "/render", {"gameId": f"a{i}", "seconds": 1.5}).id
               for i in range(2)]  # fmt: skip
        assert _peak(client, ids) == 1  # two machines, one job at a time
        retuned = cli("jobs", "policy", "render_job", "--concurrency", "2",
                      "--config", str(first.config), "--store", store_url)  # fmt: skip
        assert retuned.returncode == 0, retuned.stderr
        assert "render_job: concurrency 2" in retuned.stdout
        assert "set by jobs policy" in retuned.stdout

        first.stop(signal.SIGKILL)
        wait_for(second.leader, timeout=10, what="B taking over")
        ids = [client.run("renderer", "/render", {"gameId": f"b{i}", "seconds": 6.0}).id
               for i in range(2)]  # fmt: skip
        assert _peak(client, ids) == 2  # B admits by the retuned policy
        [policy] = second.admin("GET", "/jobs/policies").json()
        assert policy["concurrency"] == 2 and policy["updated_by"] == "jobs policy"


def test_a_deploy_keeps_a_live_retune_unless_the_file_s_line_changed(
    tmp_path: Path, store_url: str
) -> None:
    app = backend_app("render", "render_job", tmp_path / "backend.jsonl")
    app["method"]["concurrency"] = 1
    pools = {"render": {"min": 0, "autoscale": True, "max": 1}}
    with deploys(tmp_path, store_url) as deploy:
        first = deploy.start(pools, {"renderer": app})
        wait_for(first.leader, what="leadership")
        answer = first.admin("PATCH", "/jobs/policies/render_job", json={"concurrency": 3})
        assert answer.status_code == 200, answer.text
        assert answer.json()["concurrency"] == 3
        refused = first.admin("PATCH", "/jobs/policies/render_job", json={"concurrency": 0})
        assert refused.status_code == 422
        missing = first.admin("PATCH", "/jobs/policies/nope", json={"concurrency": 2})
        assert missing.status_code == 404 and "nope" in missing.json()["error"]

        same = deploy.start(pools, {"renderer": app})  # a deploy that leaves the line alone
        wait_for(same.leader, what="the redeployed controller leading")
        [kept] = same.admin("GET", "/jobs/policies").json()
        assert (kept["concurrency"], kept["updated_by"]) == (3, "admin API")

        app["method"]["concurrency"] = 2
        changed = deploy.start(pools, {"renderer": app})
        wait_for(changed.leader, what="the changed controller leading")
        [written] = changed.admin("GET", "/jobs/policies").json()
        assert (written["concurrency"], written["updated_by"]) == (2, "sp00ky.yml")

"""`sp00ky-infra rehearse` as a user types it: the production path of a sp00ky.yml end to end
on this machine (the real Pulumi engine, the fake Hetzner cloud in boot mode, the controller,
the guardian), a failure the way a user would meet it, and image paths side by side."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import docker
import pytest

from sp00ky_infra.rehearse.boot import ROLE
from sp00ky_infra.rehearse.phases import FLEETING_LOG, PHASES, TOTAL
from tests.pulumi_engine import example_config


@pytest.fixture
def needs(pulumi_bin: str, rehearsal_image: str) -> str:
    return pulumi_bin


def _rehearse(pulumi_bin: str, config: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = f"{pulumi_bin}{os.pathsep}{env.get('PATH', '')}"
    done = subprocess.run(
        [sys.executable, "-m", "sp00ky_infra", "rehearse", str(config), "--json",
         "--workdir", str(config.parent / "work"), *args],
        capture_output=True, text=True, env=env, timeout=900,
    )  # fmt: skip
    try:
        report: dict[str, Any] = json.loads(done.stdout)
    except ValueError:
        raise AssertionError(f"exit {done.returncode}\n{done.stdout}\n{done.stderr}") from None
    return done.returncode, report, done.stderr


def _leftovers() -> list[str]:
    client = docker.from_env()
    try:
        found = client.containers.list(
            all=True, filters={"label": f"{ROLE}=server"}, ignore_removed=True
        )
        return [str(c.name) for c in found]
    finally:
        client.close()


def test_a_rehearsal_runs_jobs_on_servers_that_boot_their_user_data(
    tmp_path: Path, needs: str
) -> None:
    config = example_config(tmp_path)
    code, report, log = _rehearse(
        needs, config, "--jobs", "5", "--timings", "idleTimeout=5s,bootTimeout=300s"
    )
    assert code == 0, (report, log[-3000:])
    assert report["ok"] and report["failed"] == []
    assert report["jobs"] == {"success": 5}
    machines = report["machines"]
    assert 1 <= len(machines) <= 2  # the pool's max
    for machine in machines:
        assert machine["outcome"] == "ready"
        # every phase seen, from the controller, the cloud and the agent's journal
        assert all(isinstance(machine["phases"][p], float) for p in machine["phases"]), machine
        assert machine["created_to_ready"] > 0
    assert [g["destroyed"] for g in report["guardian"]] == [[], []]  # while running, and after
    assert report["guardian"][0]["servers"] >= 1  # the pass saw the live servers and kept them
    assert any("back to zero" in line for line in report["worked"])
    assert report["estimate"]["total"] > 0
    assert any("image docker-ce has Docker" in line for line in report["cloud"])  # the default
    assert "pulumi up took" in (tmp_path / "work" / "controller.log").read_text()
    assert _leftovers() == []


def test_a_backend_that_never_answers_its_healthcheck_is_named_as_the_cause(
    tmp_path: Path, needs: str
) -> None:
    config = example_config(tmp_path, healthcheck="/never", max=3)
    code, report, log = _rehearse(
        needs, config, "--jobs", "3", "--timings", "idleTimeout=5s,bootTimeout=60s",
        "--timeout", "600",
    )  # fmt: skip
    assert code == 1, (report, log[-3000:])
    assert report["breaker_open"] == ["render"]
    assert len(report["incidents"]) == 1 and "pool_breaker_open" in report["incidents"][0]
    failed = [m for m in report["machines"] if m["outcome"] != "ready"]
    assert len(failed) >= 3
    for machine in failed:
        assert "never answered its healthcheck (GET /never with a 2xx)" in machine["cause"], machine
    assert any("breaker opened" in line for line in report["failed"])
    assert report["jobs"].get("success", 0) == 0
    assert _leftovers() == []


def test_a_baked_pool_is_baked_first_and_its_machines_fetch_neither_agent_nor_image(
    tmp_path: Path, needs: str
) -> None:
    shape = {"type": "cx33", "locations": ["fsn1", "nbg1"], "image": "baked"}
    config = example_config(tmp_path, machine=shape)
    code, report, log = _rehearse(
        needs, config, "--jobs", "3", "--timings", "idleTimeout=5s,bootTimeout=300s"
    )
    assert code == 0, (report, log[-3000:])
    assert report["ok"] and report["jobs"] == {"success": 3}
    assert report["bake_seconds"] > 0  # the bake's own time, before the burst
    assert report["downloads"] == {
        "agent fetched": 0, "agent present": len(report["machines"]),
        "image fetched": 0, "image cached": len(report["machines"]),
    }, report  # fmt: skip
    assert "rehearse: waiting for the bake of render" in log
    assert any(line.startswith("render: machine.image baked: ") for line in report["cloud"])
    for machine in report["machines"]:
        assert machine["outcome"] == "ready", machine
        events = machine["events"]
        assert "agent_present" in events and "agent_fetched" not in events, events
        assert "image_cached" in events and "image_fetch" not in events, events
    controller_log = (tmp_path / "work" / "controller.log").read_text()
    assert "pool render: baked in " in controller_log
    # its machines and its bake server are gone (another rehearsal on the host may run)
    baker = re.search(r"creating bake server (\S+) ", controller_log)
    assert baker is not None, controller_log[-3000:]
    mine = {f"sp00ky-rehearse-{m['name']}" for m in report["machines"]}
    assert set(_leftovers()) & {*mine, f"sp00ky-rehearse-{baker[1]}"} == set()


def test_two_image_paths_are_rehearsed_in_turn_and_set_side_by_side(
    tmp_path: Path, needs: str, rehearsal_image_without_docker: str
) -> None:
    config = example_config(tmp_path)
    code, found, log = _rehearse(
        needs, config, "--paths", "default,fallback", "--jobs", "2",
        "--timings", "idleTimeout=5s,bootTimeout=300s",
    )  # fmt: skip
    assert code == 0, (found, log[-3000:])
    assert found["ok"] and list(found["paths"]) == ["default", "fallback"]
    assert "path fallback (2 of 2): machine.image debian-12" in log  # progress as it runs
    for path, report in found["paths"].items():
        assert report["path"] == path and report["jobs"] == {"success": 2}, report
        ready = [m for m in report["machines"] if m["outcome"] == "ready"]
        assert ready and report["bake_seconds"] is None
        # nothing on these images: each machine fetched the agent and the image
        assert report["downloads"] == {
            "agent fetched": len(ready), "agent present": 0,
            "image fetched": len(ready), "image cached": 0,
        }, report  # fmt: skip
        assert FLEETING_LOG in report["estimate_sources"]["create"]
    fallback = found["paths"]["fallback"]
    assert any(
        "measured here on the rehearsal image without Docker" in n for n in fallback["cloud"]
    )
    table = found["side_by_side"]
    assert set(table) == {*PHASES, TOTAL}
    assert all(cells["default"] and cells["fallback"] for cells in table.values()), table
    # the fallback installs docker.io at boot, the default finds it there
    install = table["agent install"]
    assert install["fallback"]["median"] > install["default"]["median"] + 5, install
    assert not list(tmp_path.glob(".sp00ky.rehearse-*"))  # each path's config is gone
    # its servers are gone (another rehearsal on the host may run)
    mine = {f"sp00ky-rehearse-{m['name']}" for r in found["paths"].values() for m in r["machines"]}
    assert set(_leftovers()) & mine == set()

"""docs/production.md's balancer snippets hold against real controllers: the health check each
makes (its path, and what it matches in the body) passes on the leader only, and passes on the
standby once it has taken over."""

from __future__ import annotations

import re
from functools import partial
from pathlib import Path

import requests

from tests.controllers import backend_app, two_controllers, wait_for
from tests.helpers import ROOT

PAGE = (ROOT / "docs" / "production.md").read_text()


def _checks() -> dict[str, tuple[str, str]]:
    """Each balancer's health check as the page writes it: (path, what the body must hold)."""
    haproxy = re.search(r"option httpchk GET (\S+)\n\s+http-check expect string '([^']+)'", PAGE)
    caddy = re.search(r"health_uri\s+(\S+)\n\s+health_body\s+`([^`]+)`", PAGE)
    assert haproxy is not None and caddy is not None, "the HAProxy and Caddy snippets"
    return {"haproxy": (haproxy[1], haproxy[2]), "caddy": (caddy[1], caddy[2])}


def _passes(agents_url: str, path: str, expected: str) -> bool:
    answer = requests.get(f"{agents_url}{path}", timeout=5)
    return answer.status_code == 200 and expected in answer.text


def test_the_balancers_send_the_agents_to_the_leader_alone(tmp_path: Path) -> None:
    checks = _checks()
    app = backend_app("render", "render_job", tmp_path / "backend.jsonl")
    store_url = f"sqlite:///{tmp_path}/state.db"
    with two_controllers(tmp_path, store_url, app) as (leader, standby, _):
        for balancer, (path, expected) in checks.items():
            assert _passes(leader.agents_url, path, expected), balancer
            assert not _passes(standby.agents_url, path, expected), balancer
        leader.stop()
        for balancer, (path, expected) in checks.items():
            wait_for(
                partial(_passes, standby.agents_url, path, expected),
                timeout=30,
                what=f"{balancer}'s check passing on the controller that took over",
            )

"""docs/production.md's balancer snippets hold against real controllers: the health check each
makes (its path, and what it matches in the body) passes on the leader only, and passes on the
standby once it has taken over; and a real HAProxy and a real Caddy, configured with the
snippets as written (only their addresses moved to this machine's loopback), send a request
to whichever controller leads, before and after a takeover."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import pytest
import requests

from tests.conftest import need_service
from tests.controllers import ControllerProcess, backend_app, two_controllers, wait_for
from tests.engines import _stop as stop_process
from tests.helpers import ROOT
from tests.prometheus import free_port

PAGE = (ROOT / "docs" / "production.md").read_text()
SNIPPET = {  # the block after each balancer's name in the page
    "haproxy": re.compile(r"^HAProxy[^\n]*:\n\n```\n(.*?)```", re.S | re.M),
    "caddy": re.compile(r"^Caddy:\n\n```\n(.*?)```", re.S | re.M),
}
ADDRESSES = ("10.0.0.11:9669", "10.0.0.12:9669")  # the controllers, as the snippets name them


def _checks() -> dict[str, tuple[str, str]]:
    """Each balancer's health check as the page writes it: (path, what the body must hold)."""
    haproxy = re.search(r"option httpchk GET (\S+)\n\s+http-check expect string '([^']+)'", PAGE)
    caddy = re.search(r"health_uri\s+(\S+)\n\s+health_body\s+`([^`]+)`", PAGE)
    assert haproxy is not None and caddy is not None, "the HAProxy and Caddy snippets"
    return {"haproxy": (haproxy[1], haproxy[2]), "caddy": (caddy[1], caddy[2])}


def _passes(url: str, path: str, expected: str) -> bool:
    try:
        answer = requests.get(f"{url}{path}", timeout=5)
    except requests.RequestException:
        return False
    return answer.status_code == 200 and expected in answer.text


def _settled(url: str, path: str, expected: str) -> bool:
    """Twenty requests in a row answered by a leader: none sent to a standby among them."""
    return all(_passes(url, path, expected) for _ in range(20))


def _app(folder: Path) -> dict[str, object]:
    return backend_app("render", "render_job", folder / "backend.jsonl")


def test_the_health_checks_pass_on_the_leader_alone(tmp_path: Path) -> None:
    checks = _checks()
    store_url = f"sqlite:///{tmp_path}/state.db"
    with two_controllers(tmp_path, store_url, _app(tmp_path)) as (leader, standby, _):
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


def _config(balancer: str, controllers: tuple[ControllerProcess, ...], port: int) -> str:
    """The page's snippet, listening on ``port`` and sending to ``controllers`` here."""
    found = SNIPPET[balancer].search(PAGE)
    assert found is not None, balancer
    text = found.group(1)
    for address, controller in zip(ADDRESSES, controllers, strict=True):
        assert address in text, (balancer, address)
        text = text.replace(address, controller.agents_url.removeprefix("http://"))
    if balancer == "haproxy":
        return re.sub(r"bind .*", f"bind 127.0.0.1:{port}", text, count=1)
    # Caddy: plain HTTP on loopback, no admin endpoint (several may run at once)
    site = re.sub(r"^\S+ \{", f"http://127.0.0.1:{port} {{", text, count=1)
    return "{\n    admin off\n}\n" + site


@contextmanager
def _balancer(balancer: str, config: str, folder: Path) -> Iterator[None]:
    binary = shutil.which(balancer)
    if binary is None:
        need_service(balancer, f"apt-get install {balancer}")
    path = folder / f"{balancer}.cfg"
    path.write_text(config)
    command = {
        "haproxy": [str(binary), "-db", "-f", str(path)],
        "caddy": [str(binary), "run", "--config", str(path), "--adapter", "caddyfile"],
    }[balancer]
    log = open(folder / f"{balancer}.log", "w")  # noqa: SIM115  # closed below
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield
    finally:
        stop_process(process)
        log.close()


@pytest.mark.parametrize("balancer", ["haproxy", "caddy"])
def test_the_balancer_sends_the_agents_to_whichever_controller_leads(
    tmp_path: Path, balancer: str
) -> None:
    path, expected = _checks()[balancer]
    store_url = f"sqlite:///{tmp_path}/state.db"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with two_controllers(tmp_path, store_url, _app(tmp_path)) as (leader, standby, _):
        config = _config(balancer, (leader, standby), port)
        with _balancer(balancer, config, tmp_path):
            # once its first checks are made, every request goes to the leader
            wait_for(partial(_settled, url, path, expected), timeout=30, what="the leader")
            leader.stop()
            wait_for(partial(_settled, url, path, expected), timeout=60, what="the new leader")
            assert standby.leader()

"""/metrics scraped by a real Prometheus while `dev` runs a burst, read back through
Prometheus' HTTP API; and every panel of the Grafana dashboard queried the same way."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import need_service
from tests.controllers import ADMIN_TOKEN, kill_machines, wait_for
from tests.helpers import ROOT
from tests.prometheus import Prometheus, prometheus

JOBS = 4
ADMIN = re.compile(r"admin API (http://[\d.]+:(\d+))")


class Dev:
    def __init__(self, folder: Path, proc: subprocess.Popen[str]) -> None:
        self.folder, self.proc = folder, proc
        self.lines: list[str] = []
        self.admin_url = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Prometheus, Dev]]:
    """`dev` running a burst of JOBS jobs on the example project, scraped every second."""
    if shutil.which("prometheus") is None:
        need_service("Prometheus", "apt-get install prometheus (Debian's package)")
    base = tmp_path_factory.mktemp("metrics")
    folder = base / "project"
    shutil.copytree(ROOT / "examples", folder, ignore=shutil.ignore_patterns(".sp00ky"))
    env = {
        **os.environ,
        "SPKY_POOL_PORT": "0",
        "SPKY_ADMIN_PORT": "0",
        "SPKY_ADMIN_TOKEN": ADMIN_TOKEN,
        "SPKY_TICK": "200ms",
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("SPKY_STORE", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "sp00ky_infra", "dev", "sp00ky.yml", "--machines", "local",
         "--burst", str(JOBS),
         "--path", "/render", "--payload", '{"gameId": "g", "seconds": 0.3}',
         "--timings", "idleTimeout=1s", "--plain"],
        cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    dev = Dev(folder, proc)
    try:
        found = wait_for(lambda: ADMIN.search(dev.output), timeout=60, what="dev's admin API")
        dev.admin_url = found.group(1)
        with prometheus(base / "prometheus", f"127.0.0.1:{found.group(2)}", ADMIN_TOKEN) as prom:
            wait_for(prom.targets_up, timeout=30, what="Prometheus scraping dev")
            yield prom, dev
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        kill_machines(f"sqlite:///{folder}/.sp00ky/state.db")


def _settled(prom: Prometheus) -> bool:
    return (
        prom.value("sum(sp00ky_jobs_finished_total)") == JOBS
        and prom.value("sum(sp00ky_machines)") == 0
        # queue counts are read off the scrape's path, at most QUEUE_READ_SECONDS old
        and prom.value('sum(sp00ky_jobs{status=~"pending.*|processing"})') == 0
    )


def test_prometheus_sees_the_burst_finish_and_the_pool_return_to_zero(
    scraped: tuple[Prometheus, Dev],
) -> None:
    prom, dev = scraped
    wait_for(lambda: _settled(prom), timeout=90, interval=0.5, what="the burst in Prometheus")
    assert prom.value('sum(sp00ky_jobs_finished_total{outcome="success"})') == JOBS
    assert prom.value("sum(sp00ky_dispatch_seconds_count)") == JOBS
    assert prom.value("sum(sp00ky_job_duration_seconds_count)") == JOBS
    assert prom.value('sum(sp00ky_jobs{status=~"pending.*|processing"})') == 0
    assert prom.value("sp00ky_oldest_pending_seconds") == 0
    assert prom.value("sp00ky_leader") == 1
    assert prom.value("sp00ky_breaker_open") == 0
    assert prom.value("sp00ky_pool_desired_machines") == 0
    booted = prom.value('sum(sp00ky_boot_seconds_count{pool="render",provider="local"})')
    assert booted is not None and booted >= 1
    assert (prom.value("sp00ky_pool_machine_seconds_total") or 0) > 0
    # The example pool is cx33: every machine is billed one started hour at least.
    euros = prom.value('sp00ky_pool_cost_euros_total{pool="render"}')
    assert euros is not None and euros >= booted * 0.0104 - 1e-9
    assert (prom.value("sum(sp00ky_tick_seconds_count)") or 0) > 0
    assert dev.proc.poll() is None, dev.output


def _dashboard_queries() -> list[tuple[str, str]]:
    board = json.loads((ROOT / "docs" / "grafana" / "sp00ky.json").read_text())
    return [
        (panel["title"], target["expr"])
        for panel in board["panels"]
        for target in panel.get("targets", [])
    ]


@pytest.mark.parametrize("title, expr", _dashboard_queries())
def test_dashboard_panel_returns_data(
    scraped: tuple[Prometheus, Dev], title: str, expr: str
) -> None:
    prom, _ = scraped
    query = expr.replace("$__rate_interval", "5m").replace("$__range", "1h")
    wait_for(lambda: prom.query(query), timeout=60, interval=0.5, what=f"panel {title!r}: {query}")

"""A real Prometheus (Debian's ``prometheus``) on 127.0.0.1 for tests: its own config and data
directory in a temp folder, scraping one target every second, stopped at the end."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import requests
import yaml


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query through the HTTP API: its result vector."""
        answer = requests.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        body = answer.json()
        assert body.get("status") == "success", f"{expr}: {body}"
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def value(self, expr: str) -> float | None:
        """The query's single value (None while it has no data)."""
        result = self.query(expr)
        return float(result[0]["value"][1]) if len(result) == 1 else None

    def targets_up(self) -> bool:
        answer = requests.get(f"{self.url}/api/v1/targets", timeout=10).json()
        active = answer["data"]["activeTargets"]
        return bool(active) and all(target["health"] == "up" for target in active)


@contextmanager
def prometheus(folder: Path, target: str, token: str) -> Iterator[Prometheus]:
    """Prometheus scraping ``target`` (host:port) at /metrics with the admin token."""
    binary = shutil.which("prometheus")
    assert binary is not None
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "token").write_text(token)
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "sp00ky",
                "metrics_path": "/metrics",
                "authorization": {"credentials_file": str(folder / "token")},
                "static_configs": [{"targets": [target]}],
            }
        ],
    }
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = open(folder / "prometheus.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [binary, f"--config.file={folder / 'prometheus.yml'}",
         f"--storage.tsdb.path={folder / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, (folder / "prometheus.log").read_text()
            try:
                if requests.get(f"{url}/-/ready", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            assert time.monotonic() < deadline, (folder / "prometheus.log").read_text()
            time.sleep(0.2)
        yield Prometheus(url)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()

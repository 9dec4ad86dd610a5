"""Schedules benchmark: what the schedules' step adds to a leader's tick.

    .venv/bin/python bench/schedules.py               # SQLite, and PostgreSQL if a URL is set
    .venv/bin/python bench/schedules.py --postgres postgresql://user:pw@127.0.0.1/db

A controller with SCHEDULES schedules (every 1m, policy skip, half of them with a run still
pending) runs ``controller.schedules.fire_schedules`` at a virtual ``now``: once in a minute
where nothing is due (the step every tick pays: the runs' sync and the cursors' read), and
once at a minute boundary where every schedule fires (each fire its own transaction).
Target: the idle step well under the tick (2 s): at most 20 ms with 100 schedules.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import yaml
from record import record

from sp00ky_infra.config.loader import load_config
from sp00ky_infra.controller.core import Controller
from sp00ky_infra.controller.provisioners.local import LocalProvisioner
from sp00ky_infra.controller.schedules import fire_schedules
from sp00ky_infra.controller.settings import ControllerSettings
from sp00ky_infra.store import open_store
from sp00ky_infra.store.postgres import scratch_schema

SCHEDULES = 100
ROUNDS = 20
T0 = 1_800_000_000.0  # a minute boundary


@contextmanager
def store_url(kind: str, postgres: str | None, folder: Path) -> Iterator[str]:
    """SQLite in ``folder``, or a PostgreSQL schema of its own, dropped afterwards."""
    if kind == "sqlite":
        yield f"sqlite:///{folder}/state.db"
        return
    assert postgres
    with scratch_schema(postgres, "bench") as url:
        yield url


def project(folder: Path, count: int) -> Path:
    schedule = {"every": "1m", "backend": "worker", "route": "/work", "payload": {"n": 1}}
    config = {
        "mode": "cluster",
        "pools": {"bench": {"min": 0, "max": 10, "autoscale": True}},
        "apps": {
            "worker": {
                "type": "backend",
                "runOn": {"pool": "bench"},
                "method": {"type": "outbox", "table": "bench_job"},
                "deploy": {"image": "registry.example/worker:1", "port": 8080, "command": ["true"]},
            }
        },
        "schedules": {f"s{n:03d}": schedule for n in range(count)},
    }
    path = folder / "sp00ky.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def measure(url: str, folder: Path) -> tuple[float, float, float]:
    store = open_store(url)
    config = load_config(project(folder, SCHEDULES))
    settings = ControllerSettings(secret="bench-secret", state_dir=str(folder / ".sp00ky"))
    now = [T0 + 1]
    controller = Controller(
        settings, config, store, LocalProvisioner(folder / "machines"), clock=lambda: now[0]
    )
    try:
        fire_schedules(controller, T0 + 1)  # first seen
        fires: list[float] = []
        idle: list[float] = []
        for round_ in range(1, ROUNDS + 1):
            boundary = T0 + 60 * round_ + 0.5
            started = time.perf_counter()
            errors = fire_schedules(controller, boundary)
            fires.append((time.perf_counter() - started) * 1000)
            assert errors == [], errors
            started = time.perf_counter()
            fire_schedules(controller, boundary + 2)
            idle.append((time.perf_counter() - started) * 1000)
        jobs = store.counts(table="bench_job")["pending"]
        assert jobs == SCHEDULES, jobs  # policy skip: the first fire's job is still pending
        return statistics.median(idle), max(idle), statistics.median(fires)
    finally:
        controller.leader_lock.release()
        store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--postgres", default=os.environ.get("SPKY_BENCH_POSTGRES_URL")
                        or os.environ.get("SPKY_TEST_POSTGRES_URL"))  # fmt: skip
    args = parser.parse_args()
    kinds = ["sqlite"] + (["postgresql"] if args.postgres else [])
    print(f"the schedules' step of one tick, {SCHEDULES} schedules, median of {ROUNDS}")
    figures: dict[str, float] = {}
    for kind in kinds:
        with tempfile.TemporaryDirectory() as tmp, store_url(kind, args.postgres, Path(tmp)) as url:
            idle, worst, firing = measure(url, Path(tmp))
            verdict = "ok" if idle <= 20 else "OVER TARGET"
            print(
                f"  {kind:<10} nothing due: {idle:6.1f} ms (worst {worst:.1f})   "
                f"all {SCHEDULES} due: {firing:7.1f} ms   {verdict}"
            )
            figures[f"{kind}_nothing_due_ms"] = idle
            figures[f"{kind}_nothing_due_worst_ms"] = worst
            figures[f"{kind}_all_{SCHEDULES}_due_ms"] = firing
    record("schedules", figures)


if __name__ == "__main__":
    main()

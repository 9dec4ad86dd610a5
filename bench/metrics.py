"""/metrics benchmark: one scrape's time with 1,000 and 100,000 jobs waiting.

    .venv/bin/python bench/metrics.py                      # SQLite, and PostgreSQL if a URL is set
    .venv/bin/python bench/metrics.py --postgres postgresql://user:pw@127.0.0.1/db

Target: a scrape with 100,000 pending jobs takes at most 20 ms. The scrape is the
admin API's own exposition, on a controller with one pool whose queue holds the jobs (half
due, half delayed), 200 machine rows in its history and a few live ones; what is timed is
``metrics.exposition`` (the HTTP round trip on loopback adds about a millisecond). On
PostgreSQL the table is vacuumed first, as autovacuum would after such a burst.

The queue counts, whose cost grows with the backlog, are read off the scrape's path by a
thread every QUEUE_READ_SECONDS (``metrics.QueueReadings``); the first scrape reads them
itself. Printed: a scrape's median and worst, the first scrape, and one reading of the queue
(what the thread pays every few seconds, not any scrape).
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
from sp00ky_infra.controller.metrics import exposition
from sp00ky_infra.controller.provisioners.local import LocalProvisioner
from sp00ky_infra.controller.settings import ControllerSettings
from sp00ky_infra.policy.machines import Reason
from sp00ky_infra.store import NewJob, SqlStore, open_store
from sp00ky_infra.store.postgres import scratch_schema

TABLE = "bench_job"
SCRAPES = 50


def project(folder: Path) -> Path:
    config = {
        "mode": "cluster",
        "pools": {"bench": {"min": 0, "max": 10, "autoscale": True}},
        "apps": {
            "worker": {
                "type": "backend",
                "runOn": {"pool": "bench"},
                "method": {"type": "outbox", "table": TABLE},
                "deploy": {"image": "registry.example/worker:1", "port": 8080, "command": ["true"]},
            }
        },
    }
    path = folder / "sp00ky.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def fill(store: SqlStore, count: int, now: float) -> None:
    for start in range(0, count, 5000):
        store.enqueue_many(
            [
                NewJob(
                    "worker", TABLE, "/work", {"n": n}, pool="bench", delay_ms=(n % 2) * 3_600_000
                )
                for n in range(start, min(count, start + 5000))
            ],
            now,
        )


def machines(store: SqlStore, now: float) -> None:
    for n in range(200):
        name = f"bench-m{n}"
        store.machines.add(name, "bench", "local", "r1", 1, now - 7200 + n)
        if n < 195:
            store.machines.move(name, Reason.REFUSED, now - 7000 + n)
            store.machines.move(name, Reason.DESTROYED, now - 3600 + n)


def scrape_ms(url: str, folder: Path, pending: int) -> tuple[float, float, int, float, float]:
    store = open_store(url)
    now = time.time()
    fill(store, pending, now)
    machines(store, now)
    if url.startswith("postgresql"):
        vacuum(url)
    settings = ControllerSettings.from_env(
        {},
        config_path=str(project(folder)),
        store_url=url,
        state_dir=str(folder / ".sp00ky"),
        admin_token="bench",
        secret="bench-secret-0123456789abcdef0123",
    )
    controller = Controller(
        settings.with_secrets(), load_config(folder / "sp00ky.yml"), store,
        LocalProvisioner(folder / "machines"),
    )  # fmt: skip
    try:
        started = time.perf_counter()
        body = exposition(controller)  # the first: it reads the queue counts itself
        first = (time.perf_counter() - started) * 1000
        started = time.perf_counter()
        controller.store.queue_stats(controller.table_of("bench"), time.time())
        reading = (time.perf_counter() - started) * 1000
        times = []
        for _ in range(SCRAPES):
            started = time.perf_counter()
            body = exposition(controller)
            times.append((time.perf_counter() - started) * 1000)
        due = f'sp00ky_jobs{{pool="bench",status="pending_due"}} {pending - pending // 2}.0'
        assert due.encode() in body, body.decode()
        return statistics.median(times), max(times), len(body), first, reading
    finally:
        controller.leader_lock.release()
        store.close()


def vacuum(url: str) -> None:
    """What autovacuum does after a burst of inserts (its insert threshold, PostgreSQL 13+):
    until then an index-only scan still visits the rows (about twice the time)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE jobs")


@contextmanager
def store_url(kind: str, postgres: str | None, folder: Path) -> Iterator[str]:
    if kind == "sqlite":
        yield f"sqlite:///{folder}/state.db"
    else:
        assert postgres
        with scratch_schema(postgres, "bench") as url:
            yield url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--postgres", default=os.environ.get("SPKY_BENCH_POSTGRES_URL")
                        or os.environ.get("SPKY_TEST_POSTGRES_URL"))  # fmt: skip
    args = parser.parse_args()
    kinds = ["sqlite"] + (["postgresql"] if args.postgres else [])
    print(f"one /metrics scrape, median and worst of {SCRAPES} (target: <= 20 ms at 100,000)")
    figures: dict[str, float] = {}
    for kind in kinds:
        for pending in (1_000, 100_000):
            with (
                tempfile.TemporaryDirectory() as tmp,
                store_url(kind, args.postgres, Path(tmp)) as url,
            ):
                median, worst, size, first, reading = scrape_ms(url, Path(tmp), pending)
                verdict = "ok" if pending < 100_000 or median <= 20 else "OVER TARGET"
                print(
                    f"{kind:<10} {pending:>7,} pending: median {median:6.2f} ms, "
                    f"worst {worst:6.2f} ms ({size:,} bytes) {verdict}; first scrape "
                    f"{first:6.2f} ms; one queue reading (off the scrape's path) {reading:6.2f} ms"
                )
                case = f"{kind}_{pending}_pending"
                figures[f"{case}_scrape_median_ms"] = median
                figures[f"{case}_scrape_worst_ms"] = worst
                figures[f"{case}_first_scrape_ms"] = first
                figures[f"{case}_queue_reading_ms"] = reading
    record("metrics", figures)


if __name__ == "__main__":
    main()

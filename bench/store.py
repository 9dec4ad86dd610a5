"""Job store benchmark: claim-and-complete throughput, and memory with many pending rows.

    .venv/bin/python bench/store.py                        # SQLite, and PostgreSQL if a URL is set
    .venv/bin/python bench/store.py --postgres postgresql://user:pw@127.0.0.1/db

Targets on the 2-core machine: at least 2,000 jobs/s on SQLite and 1,000 jobs/s on
PostgreSQL, and a process whose memory does not grow with the number of pending rows.
PostgreSQL comes from --postgres, $SPKY_BENCH_POSTGRES_URL or $SPKY_TEST_POSTGRES_URL; the
benchmark works in a schema of its own and drops it afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from record import record

from sp00ky_infra.store import NewJob, SqlStore, open_store
from sp00ky_infra.store.model import Started
from sp00ky_infra.store.postgres import scratch_schema

TABLE = "bench_job"


def _job(n: int) -> NewJob:
    return NewJob("bench", TABLE, "/work", {"n": n, "pad": "x" * 64}, pool="bench")


def fill(store: SqlStore, count: int, now: float) -> float:
    """Write ``count`` pending rows in chunks; returns rows per second."""
    started = time.perf_counter()
    for start in range(0, count, 5000):
        store.enqueue_many([_job(n) for n in range(start, min(count, start + 5000))], now)
    return count / (time.perf_counter() - started)


def claim_and_complete(store: SqlStore, batch: int, together: bool = False) -> tuple[int, float]:
    """Drain the queue claiming ``batch`` at a time and completing each job (one at a time
    with ``complete``, a batch with ``complete_many``); (jobs, jobs/s). ``together``: as an
    agent's poll does, one transaction completes the last batch and claims the next."""
    done = 0
    started = time.perf_counter()
    jobs: list[Started] = []
    while True:
        now = time.time()
        with store.transaction() if together else nullcontext():
            if batch == 1:  # a result posted alone
                for job in jobs:
                    store.complete(job.id, job.attempt or "", {"ok": True}, now)
            else:  # results a poll carries
                results = [(job.id, job.attempt or "", {"ok": True}) for job in jobs]
                store.complete_many(results, now)
            done += len(jobs)
            # read after the COMMIT it travels with (together), as the poll's claim is
            claimed = store.send_start(TABLE, batch, "bench", now, lease=90, machine="m1")
        jobs = claimed.result()
        if not jobs:
            break
    return done, done / (time.perf_counter() - started)


@contextmanager
def store_url(kind: str, postgres: str | None) -> Iterator[str]:
    if kind == "sqlite":
        with tempfile.TemporaryDirectory() as folder:
            yield f"sqlite:///{folder}/bench.db"
    else:
        assert postgres is not None
        with scratch_schema(postgres, "bench") as url:
            yield url


def throughput(kind: str, postgres: str | None, jobs: int) -> dict[str, float]:
    figures: dict[str, float] = {}
    for batch, together in ((1, False), (16, False), (16, True)):
        with store_url(kind, postgres) as url:
            store = open_store(url)
            try:
                figures["enqueue_per_s"] = fill(store, jobs, time.time())
                count, rate = claim_and_complete(store, batch, together)
                assert count == jobs, (count, jobs)
                assert store.counts(table=TABLE)["success"] == jobs
                name = f"claim_complete_per_s_batch_{batch}" + ("_one_tx" if together else "")
                figures[name] = rate
            finally:
                store.close()
    return figures


def probe(url: str) -> None:
    """In a child process: the store's everyday calls against whatever is pending, then the
    process's peak resident memory (KiB) on stdout."""
    store = open_store(url, migrate=False)
    now = time.time()
    for _ in range(5):
        store.counts()
        store.queue(TABLE, now, limit=100)
        store.list_jobs(limit=100)
        store.sweep(now)
    claim_and_drain = 0
    while claim_and_drain < 1000:
        jobs = store.claim(TABLE, 16, "probe", now, lease=90, machine="m1")
        for job in jobs:
            assert job.attempt is not None
            store.complete(job.id, job.attempt, {}, now)
        claim_and_drain += len(jobs)
    store.prune(now + 10**6, 60, 60)
    store.close()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def memory(kind: str, postgres: str | None, pending: int) -> dict[str, float]:
    figures: dict[str, float] = {}
    for count in (2_000, pending):
        with store_url(kind, postgres) as url:
            store = open_store(url)
            fill(store, count, time.time() - 1)
            store.close()
            out = subprocess.run(
                [sys.executable, __file__, "--probe", url],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            figures[f"peak_rss_mib_with_{count}_pending"] = int(out.strip()) / 1024
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--pending", type=int, default=100_000)
    parser.add_argument(
        "--postgres",
        default=os.environ.get("SPKY_BENCH_POSTGRES_URL")
        or os.environ.get("SPKY_TEST_POSTGRES_URL"),
    )
    parser.add_argument("--json", action="store_true", help="Print the figures as JSON.")
    parser.add_argument("--probe", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        probe(args.probe)
        return
    kinds = ["sqlite"] + (["postgres"] if args.postgres else [])
    if not args.postgres:
        print(
            "PostgreSQL: skipped (no --postgres, $SPKY_BENCH_POSTGRES_URL "
            "or $SPKY_TEST_POSTGRES_URL)"
        )
    results = {}
    for kind in kinds:
        print(
            f"{kind}: {args.jobs} jobs claimed and completed; memory with {args.pending} pending",
            flush=True,
        )
        results[kind] = {
            **throughput(kind, args.postgres, args.jobs),
            **memory(kind, args.postgres, args.pending),
        }
    record("store", {f"{kind}_{k}": v for kind, got in results.items() for k, v in got.items()})
    if args.json:
        print(json.dumps(results, indent=2))
        return
    targets = {"sqlite": 2000, "postgres": 1000}
    for kind, figures in results.items():
        print(f"\n{kind}")
        for name, value in figures.items():
            print(f"  {name:<42} {value:>10.1f}")
        best = max(
            figures["claim_complete_per_s_batch_1"],
            figures["claim_complete_per_s_batch_16"],
            figures["claim_complete_per_s_batch_16_one_tx"],
        )
        grow = (
            figures[f"peak_rss_mib_with_{args.pending}_pending"]
            - figures["peak_rss_mib_with_2000_pending"]
        )
        print(
            f"  target {targets[kind]} jobs/s: {'met' if best >= targets[kind] else 'MISSED'} "
            f"({best:.0f}); memory growth from 2,000 to {args.pending:,} pending: {grow:+.1f} MiB"
        )


if __name__ == "__main__":
    main()

"""The job store against the Python queues people would pick instead, in one run.

    .venv/bin/pip install -e '.[bench]'      # huey, pgqueuer, procrastinate (never runtime)
    .venv/bin/python bench/peers.py          # PostgreSQL from --postgres or $SPKY_TEST_POSTGRES_URL

The same --jobs no-op jobs (10,000) are enqueued, then claimed and completed by one worker and
by four (processes; procrastinate: one worker process with that concurrency, its own model),
through:

- this store as the controller's poll uses it (one transaction completes the last batch with
  ``complete_many`` and claims the next, the claim read after the COMMIT it travels with) on
  SQLite (claims of 16 at a time) and huey's SqliteHuey (one at a time, as its consumer takes
  them), both with ``synchronous=NORMAL`` in WAL mode: equal durability;
- this store on PostgreSQL (claims of 1 and of 16), pgqueuer (batched dequeue of 16, completions
  logged in one statement a batch, as its QueueManager does) and procrastinate.

It prints jobs/s for each and the ratio of this store to each peer. A peer that is not
installed, or fails, is reported as such: never a made-up figure. Targets: SQLite at least
0.75 x huey, PostgreSQL at least 1.0 x pgqueuer batched.

A run of 10,000 jobs takes one to two seconds, and on a shared machine a single pair's ratio
moves widely from one minute to the next. So the two pairs with a target (this store against
huey, and this store's claims of 16 against pgqueuer) run --repeat times (5), each pair back
to back and the order swapped every time (drift between the two halves cancels), and are
judged on the median of the pairs' ratios; every pair's figures are printed. Claims of 1 and
procrastinate (no target; procrastinate alone takes about a minute) run once.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from record import record

from sp00ky_infra.store import NewJob, open_store
from sp00ky_infra.store.model import Started
from sp00ky_infra.store.postgres import scratch_schema

TABLE = "bench_job"


class Unavailable(Exception):
    """A peer could not run here (not installed, or it failed): said, not faked."""


def _peer(module: str) -> Any:
    """A peer's module, untyped (the bench group is optional), or Unavailable."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise Unavailable(f"{module} is not installed ({exc}): pip install -e '.[bench]'") from exc


def _parallel(workers: int, target: Callable[..., int], *args: Any) -> float:
    """Run ``target(*args)`` in ``workers`` processes from one start; jobs/s of them all."""
    context = multiprocessing.get_context("fork")
    with context.Pool(workers) as pool:
        start = time.time() + 0.3
        counts = pool.starmap(target, [(*args, start)] * workers)
        elapsed = time.time() - start
    return sum(counts) / elapsed


def _wait(start: float) -> None:
    while time.time() < start:
        time.sleep(0.001)


# --- this store ------------------------------------------------------------------------------


def _ours_worker(url: str, batch: int, start: float) -> int:
    """As the controller's poll does: the last batch's results and the next claim commit in
    one transaction."""
    store = open_store(url, migrate=False)
    _wait(start)
    done, jobs = 0, list[Started]()
    while True:
        now = time.time()
        with store.transaction():
            finished = store.complete_many([(job.id, job.attempt or "", None) for job in jobs], now)
            done += sum(each.status == "success" for each in finished)
            # read after the COMMIT it travels with, as the poll's claim is
            claimed = store.send_start(TABLE, batch, f"w{os.getpid()}", now, lease=90, machine="m1")
        jobs = claimed.result()
        if not jobs:
            break
    store.close()
    return done


def ours(url: str, jobs: int, workers: int, batch: int) -> float:
    store = open_store(url)
    for first in range(0, jobs, 5000):
        news = [
            NewJob("bench", TABLE, "/noop", {"n": n}, pool="bench")
            for n in range(first, min(jobs, first + 5000))
        ]
        store.enqueue_many(news, time.time() - 1)
    store.close()
    rate = _parallel(workers, _ours_worker, url, batch)
    store = open_store(url, migrate=False)
    finished = store.counts(table=TABLE).get("success", 0)
    store.close()
    if finished != jobs:
        raise AssertionError(f"this store finished {finished} of {jobs}")
    return rate


# --- huey ------------------------------------------------------------------------------------


def _huey(path: str) -> Any:
    SqliteHuey = _peer("huey").SqliteHuey
    SqliteStorage = _peer("huey.storage").SqliteStorage

    class NormalStorage(SqliteStorage):  # type: ignore[misc,valid-type]
        def _create_connection(self) -> Any:
            conn = super()._create_connection()
            conn.execute("pragma synchronous=1")  # NORMAL, as this store's SQLite
            return conn

    huey = SqliteHuey("bench", filename=path, storage_class=NormalStorage, results=True)

    @huey.task()  # type: ignore[untyped-decorator]
    def noop(n: int) -> None:
        return None

    return huey, noop


def _huey_worker(path: str, start: float) -> int:
    huey, _ = _huey(path)
    _wait(start)
    done = 0
    while True:
        task = huey.dequeue()
        if task is None:
            break
        huey.execute(task)
        done += 1
    return done


def huey(folder: str, jobs: int, workers: int) -> float:
    path = f"{folder}/huey-{workers}.db"
    queue, noop = _huey(path)
    for n in range(jobs):
        noop(n)
    rate = _parallel(workers, _huey_worker, path)
    if len(queue) != 0:
        raise AssertionError(f"huey left {len(queue)} of {jobs}")
    return rate


# --- pgqueuer --------------------------------------------------------------------------------


async def _pgqueuer_connect(url: str) -> Any:
    import psycopg

    Queries = _peer("pgqueuer.adapters.persistence.queries").Queries
    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    return conn, Queries.from_psycopg_connection(conn)


def _pgqueuer_worker(url: str, batch: int, start: float) -> int:
    async def work() -> int:
        EntrypointExecutionParameter = _peer(
            "pgqueuer.ports.repository"
        ).EntrypointExecutionParameter
        conn, queries = await _pgqueuer_connect(url)
        entrypoints = {"noop": EntrypointExecutionParameter(concurrency_limit=0)}
        manager = uuid.uuid4()
        _wait(start)
        done = 0
        while True:
            picked = await queries.dequeue(batch, entrypoints, manager, None, timedelta(seconds=90))
            if not picked:
                break
            await queries.log_jobs([(job, "successful", None) for job in picked])
            done += len(picked)
        await conn.close()
        return done

    return asyncio.run(work())


def pgqueuer(url: str, jobs: int, workers: int, batch: int) -> float:
    async def fill() -> None:
        conn, queries = await _pgqueuer_connect(url)
        await queries.install()
        for first in range(0, jobs, 5000):
            count = min(jobs, first + 5000) - first
            await queries.enqueue(["noop"] * count, [b"{}"] * count, [0] * count)
        await conn.close()

    asyncio.run(fill())
    return _parallel(workers, _pgqueuer_worker, url, batch)


# --- procrastinate ---------------------------------------------------------------------------


def procrastinate(url: str, jobs: int, workers: int) -> float:
    pc = _peer("procrastinate")
    logging.getLogger("procrastinate").setLevel(logging.ERROR)  # its advice on app placement
    app = pc.App(connector=pc.SyncPsycopgConnector(conninfo=url))

    @app.task(name="noop")  # type: ignore[untyped-decorator]
    def noop(n: int) -> None:
        return None

    with app.open():
        app.schema_manager.apply_schema()
        for first in range(0, jobs, 5000):
            noop.batch_defer(*({"n": n} for n in range(first, min(jobs, first + 5000))))
    async_app = pc.App(connector=pc.PsycopgConnector(conninfo=url))
    async_app.tasks = app.tasks
    started = time.perf_counter()

    async def run() -> None:
        async with async_app.open_async():
            await async_app.run_worker_async(
                wait=False, concurrency=workers, install_signal_handlers=False
            )

    asyncio.run(run())
    return jobs / (time.perf_counter() - started)


# --- the run ---------------------------------------------------------------------------------


def measure(what: str, run: Callable[[], float], figures: dict[str, float | str]) -> None:
    print(f"  {what} ...", end=" ", flush=True)
    try:
        figures[what] = run()
        print(f"{figures[what]:,.0f} jobs/s", flush=True)
    except Unavailable as exc:
        figures[what] = f"not run: {exc}"
        print(figures[what], flush=True)
    except Exception as exc:  # a peer that fails here is reported, not hidden
        figures[what] = f"failed: {type(exc).__name__}: {exc}"
        print(figures[what], flush=True)


Run = Callable[[], float]


def pair(mine: tuple[str, Run], peer: tuple[str, Run], repeat: int) -> list[dict[str, float | str]]:
    """Both, ``repeat`` times back to back, the order swapped each time: each time's figures
    (a peer that is not installed: once, the same answer every time)."""
    runs: list[dict[str, float | str]] = []
    for n in range(repeat):
        figures: dict[str, float | str] = {}
        for what, run in (mine, peer) if n % 2 == 0 else (peer, mine):
            measure(what, run, figures)
        runs.append(figures)
        if str(figures[peer[0]]).startswith("not run"):
            break
    return runs


def _sqlite(run: Callable[[str], float], folder: bool = False) -> Run:
    """``run`` on a fresh SQLite file of its own (given its URL, or with ``folder`` the
    folder it goes in)."""

    def fresh() -> float:
        with tempfile.TemporaryDirectory() as tmp:
            return run(tmp if folder else f"sqlite:///{tmp}/ours.db")

    return fresh


def _postgres(url: str, run: Callable[[str], float]) -> Run:
    """``run(url)`` in a fresh schema of its own."""

    def fresh() -> float:
        with scratch_schema(url, "peers") as pg:
            return run(pg)

    return fresh


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument(
        "--repeat", type=int, default=5, help="pairs run for each target's median (default 5)"
    )
    parser.add_argument("--postgres", default=os.environ.get("SPKY_TEST_POSTGRES_URL", ""))
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error(f"--repeat must be at least 1, not {args.repeat}")
    jobs = args.jobs
    figures: dict[str, float | str] = {}
    pairs: dict[tuple[str, str], list[dict[str, float | str]]] = {}

    def paired(mine: tuple[str, Run], peer: tuple[str, Run]) -> None:
        pairs[mine[0], peer[0]] = pair(mine, peer, args.repeat)

    print(f"load average: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; {jobs} jobs")
    for workers in (1, 4):
        paired(
            (
                f"sqlite ours w{workers}",
                _sqlite(partial(ours, jobs=jobs, workers=workers, batch=16)),
            ),
            (f"sqlite huey w{workers}", _sqlite(partial(huey, jobs=jobs, workers=workers), True)),
        )
        if not args.postgres:
            continue
        url = args.postgres
        measure(
            f"postgres ours b1 w{workers}",
            _postgres(url, partial(ours, jobs=jobs, workers=workers, batch=1)),
            figures,
        )
        paired(
            (
                f"postgres ours b16 w{workers}",
                _postgres(url, partial(ours, jobs=jobs, workers=workers, batch=16)),
            ),
            (
                f"postgres pgqueuer b16 w{workers}",
                _postgres(url, partial(pgqueuer, jobs=jobs, workers=workers, batch=16)),
            ),
        )
        measure(
            f"postgres procrastinate w{workers}",
            _postgres(url, partial(procrastinate, jobs=jobs, workers=workers)),
            figures,
        )
    if not args.postgres:
        print("PostgreSQL: skipped (no --postgres or $SPKY_TEST_POSTGRES_URL)")
    print(f"load average: {os.getloadavg()[0]:.2f}")
    print(
        "ratios (this store / peer; targets: >= 0.75 x huey, >= 1.0 x pgqueuer batched; "
        f"the median of {args.repeat} pairs, then each pair's):"
    )
    rates: dict[str, list[float]] = {}
    ratios: dict[str, float] = {}
    for (mine, peer), runs in pairs.items():
        for run in runs:
            for what in (mine, peer):
                if isinstance(figure := run[what], float):
                    rates.setdefault(what, []).append(figure)
        each = [
            a / b
            for a, b in ((run[mine], run[peer]) for run in runs)
            if isinstance(a, float) and isinstance(b, float)
        ]
        if each:
            listed = ", ".join(f"{r:.2f}" for r in each)
            print(f"  {mine} / {peer}: {statistics.median(each):.2f} ({listed})")
            ratios[f"{mine} / {peer}"] = statistics.median(each)
        else:  # no run had both sides: why, from the last run's failed side(s)
            why = "; ".join(
                f"{what}: {runs[-1][what]}"
                for what in (mine, peer)
                if isinstance(runs[-1][what], str)
            )
            print(f"  {mine} / {peer}: no ratio ({why})")
    print("medians of the pairs' runs (jobs/s):")
    for what, got in rates.items():
        print(f"  {what}: {statistics.median(got):,.0f} ({min(got):,.0f}-{max(got):,.0f})")
    for workers in (1, 4):
        mine, peer = f"postgres ours b16 w{workers}", f"postgres procrastinate w{workers}"
        a, b = rates.get(mine), figures.get(peer)
        if a and isinstance(b, float):
            print(f"  {mine} (median) / {peer} (one run): {statistics.median(a) / b:.2f}")
        elif b is not None:
            print(f"  {mine} / {peer}: no ratio ({peer}: {b})")
    medians = {f"{what} jobs/s": statistics.median(got) for what, got in rates.items()}
    once = {f"{what} jobs/s": v for what, v in figures.items() if isinstance(v, float)}
    record("peers", {**ratios, **medians, **once})


if __name__ == "__main__":
    main()

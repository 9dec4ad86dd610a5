"""Dispatch benchmark: how fast a job reaches a machine, how many flow, how long a tick takes.

    .venv/bin/python bench/dispatch.py

1. latency from `run` (the row written) to the backend receiving the POST, on a warm machine
   (a real controller process, a real agent and the example backend on loopback);
   targets: p50 at most 1.5 ms, p99 at most 5 ms;
2. throughput of no-op jobs through 4 machines x 4 slots, on SQLite and (with
   --postgres URL, or SPKY_TEST_POSTGRES_URL) on PostgreSQL, from the commit that makes the
   --throughput-jobs jobs visible to the last success (``throughput_jobs_per_s``; with the
   write of the rows as well: ``throughput_with_enqueue_jobs_per_s``); targets at least 1,000
   jobs/s on SQLite, 800 on PostgreSQL; with the CPU milliseconds per job the controller, the
   agents, the backends and the database server spent meanwhile (from /proc);
   with 1 and 2, the share of all the machine's CPU time that was busy, and that the
   hypervisor gave to other guests (``*_machine_busy_percent``, ``*_machine_steal_percent``,
   from /proc/stat): steal is time the host took; a host can also slow the cores in a way
   steal does not count (then every group spends more CPU a job at once);
3. the loopback floor in the same run: keep-alive POSTs straight to the example backend, from
   1 and 16 clients (processes): what the machine could do with no controller at all;
4. the controller's tick with --pools pools, 10 machines each and --pending pending jobs (in
   process, against a SQLite store, machines created by a provisioner that only records them);
   target at most 2 ms at 1,000,000 pending over 50 pools and 1,000 machines
   (`--pools 50 --machines 20 --pending 1000000`, which takes minutes to fill);
5. the controller's memory, on a real controller process (SQLite, SPKY_TICK=1s): its VmRSS after
   10 s with 2 real machines of 2 slots polling and running jobs and the admin API read, with
   1,000 and with --memory-pending (1,000,000) jobs pending; target within 10%. About 1.5
   minutes; `--controller-memory` runs it alone, `--skip-memory` leaves it out.
"""

from __future__ import annotations

import argparse
import functools
import http.client
import json
import multiprocessing
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from record import record

from agent.runtime import answers
from sp00ky_infra.client import Client
from sp00ky_infra.config.loader import load_config
from sp00ky_infra.controller.core import Controller
from sp00ky_infra.controller.provisioners import MachineSpec, Provisioned
from sp00ky_infra.controller.provisioners.local import session_members
from sp00ky_infra.controller.reconcile import tick
from sp00ky_infra.controller.settings import ControllerSettings
from sp00ky_infra.controller.state import Deployment
from sp00ky_infra.policy.machines import Reason
from sp00ky_infra.store import NewJob, open_store
from sp00ky_infra.store.postgres import scratch_schema
from sp00ky_infra.store.rows import INSERT_JOB, insert_row
from sp00ky_infra.store.transitions import new_job_id
from tests.controllers import (
    SERVER,
    backend_app,
    live_machines,
    project,
    running_controller,
    wait_for,
)

TICKS = os.sysconf("SC_CLK_TCK")


def succeeded(client: Client, job_id: str) -> bool:
    return client.store.get(job_id).status == "success"


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def _next_start(log: Path, offset: int) -> tuple[int, float] | None:
    """The time of the first whole "start" line of the backend's log past ``offset``, and the
    offset past it; None before there is one. A stat while the log has not grown: the bench's
    own wait must not take the CPU the controller, the agent and the backend need (a read
    and parse of the whole log every half millisecond did), and a line the backend is still
    writing is not read."""
    try:
        if log.stat().st_size <= offset:
            return None
        with log.open("rb") as out:
            out.seek(offset)
            text = out.read()
    except FileNotFoundError:
        return None
    for line in text.splitlines(keepends=True):
        if not line.endswith(b"\n"):
            return None
        offset += len(line)
        if b'"start"' in line:
            return offset, float(json.loads(line)["t"])
    return None


def latency(folder: Path, count: int) -> dict[str, float]:
    log = folder / "backend.jsonl"
    app = backend_app("render", "render_job", log)
    config = project(folder, {"render": {"min": 1, "recycle": "never"}}, {"renderer": app})
    store_url = f"sqlite:///{folder}/state.db"
    client = Client(store_url, config)
    samples = []
    with running_controller(folder, config, store_url, SPKY_TICK="2s"):
        wait_for(
            lambda: [m.state for m in client.store.machines.live("render")] == ["ready"], timeout=30
        )
        read = 0  # bytes of the backend's log read so far
        machine = machine_cpu()
        for n in range(count + 5):
            sent = time.time()
            job = client.run("renderer", "/render", {"gameId": f"g{n}", "seconds": 0})
            start = _next_start(log, read)
            while start is None:  # the backend's own log line says when the POST arrived
                time.sleep(0.0005)
                start = _next_start(log, read)
            read, started_at = start
            if n >= 5:  # the first few warm the connection pool and the caches
                samples.append((started_at - sent) * 1000)
            wait_for(functools.partial(succeeded, client, job.id), timeout=10, interval=0.001)
        shares = machine_shares(machine, "latency")
    client.close()
    return {
        "latency_p50_ms": statistics.median(samples),
        "latency_p99_ms": percentile(samples, 0.99),
        "latency_max_ms": max(samples),
        **shares,
    }


def cpu_seconds(pid: int) -> float:
    """User + system CPU of one process so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS


def machine_cpu() -> tuple[int, int, int]:
    """The machine's CPU time so far, in clock ticks over all cores (/proc/stat's first
    line): all of it, the busy part (neither idle nor waiting for I/O), and the part the
    hypervisor gave to other guests (steal)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle, iowait, steal = fields[3], fields[4], fields[7]
    total = sum(fields[:8])  # guest time is already counted in user and nice
    return total, total - idle - iowait - steal, steal


def machine_shares(before: tuple[int, int, int], prefix: str) -> dict[str, float]:
    """The machine's busy and stolen CPU since ``before``, in percent of all its cores'
    time."""
    after = machine_cpu()
    total = max(after[0] - before[0], 1)
    return {
        f"{prefix}_machine_busy_percent": 100 * (after[1] - before[1]) / total,
        f"{prefix}_machine_steal_percent": 100 * (after[2] - before[2]) / total,
    }


def server_processes() -> list[int]:
    """The PostgreSQL server's processes (the postmaster's and its backends'): the store's
    side of a job, on the same two cores."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == "postgres":
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def machine_processes(store: Any) -> tuple[list[int], list[int]]:
    """The agents' pids and their backends' (every other member of each machine's session)."""
    agents = [int(m.provider_id) for m in store.machines.live("render") if m.provider_id]
    backends = [pid for agent in agents for pid in session_members(agent) if pid != agent]
    return agents, backends


def drained(store: Any, table: str, count: int) -> bool:
    """Whether ``table``'s ``count`` jobs all succeeded. Looked at every few milliseconds while
    the jobs flow, so through two small indexes (nothing pending, nothing running), not by
    counting every row (a GROUP BY of the whole table: 1.5 ms of the database's CPU each
    time on PostgreSQL, taken from what is measured); the full count once at the end."""
    if store.queued(table, time.time(), 1) or store.busy_slots(table):
        return False
    return bool(store.counts(table=table)["success"] == count)


def throughput(folder: Path, count: int, store_url: str) -> dict[str, float]:
    app = backend_app("render", "render_job", folder / "unused.jsonl")
    del app["env"]["BACKEND_LOG"]
    pools = {"render": {"min": 4, "slots": 4, "recycle": "never"}}
    config = project(folder, pools, {"renderer": app})
    store = open_store(store_url)
    with running_controller(folder, config, store_url, SPKY_TICK="2s") as controller:
        wait_for(
            lambda: len([m for m in store.machines.live("render") if m.state == "ready"]) == 4,
            timeout=60,
        )
        news = [
            NewJob(
                "renderer",
                "render_job",
                "/render",
                {"gameId": f"t{n}", "seconds": 0},
                pool="render",
            )
            for n in range(count)
        ]
        assert controller.proc is not None
        agents, backends = machine_processes(store)
        groups = {"controller": [controller.proc.pid], "agents": agents, "backends": backends}
        if not store_url.startswith("sqlite"):
            groups["database"] = server_processes()
        before = {name: sum(map(cpu_seconds, pids)) for name, pids in groups.items()}
        machine = machine_cpu()
        started = time.perf_counter()
        store.enqueue_many(news, time.time())
        visible = time.perf_counter()  # committed: from here the jobs flow
        wait_for(functools.partial(drained, store, "render_job", count), timeout=600, interval=0.01)
        ended = time.perf_counter()
        if "database" in groups:  # and the server processes it started meanwhile
            groups["database"] = sorted(set(groups["database"]) | set(server_processes()))
        after = {name: sum(map(cpu_seconds, pids)) for name, pids in groups.items()}
        shares = machine_shares(machine, "throughput")
    store.close()
    # The rate through the slots: from the commit that makes the jobs visible to the last
    # success (as bench/peers.py times its workers only); with the producer's write of the
    # rows too, as a second figure. The CPU is counted over both (the write included).
    figures = {
        "throughput_jobs_per_s": count / (ended - visible),
        "throughput_with_enqueue_jobs_per_s": count / (ended - started),
        "throughput_jobs": count,
        "throughput_enqueue_ms": (visible - started) * 1000,
        **shares,
    }
    for name in groups:
        figures[f"cpu_ms_per_job_{name}"] = (after[name] - before[name]) * 1000 / count
    return figures


def _client(port: int, seconds: float, start: float) -> int:
    """One keep-alive client: POSTs a no-op job to the backend until ``seconds`` are up."""
    conn = http.client.HTTPConnection("127.0.0.1", port)
    conn.connect()
    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    body = json.dumps({"gameId": "floor", "seconds": 0}).encode()
    headers = {"Content-Type": "application/json"}
    while time.time() < start:
        time.sleep(0.001)
    done, end = 0, start + seconds
    while time.time() < end:
        conn.request("POST", "/render", body=body, headers=headers)
        conn.getresponse().read()
        done += 1
    conn.close()
    return done


def loopback_floor(seconds: float = 3.0) -> dict[str, float]:
    """Keep-alive POSTs straight to the example backend: the most this machine could move."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "PORT": str(port)}
    env.pop("BACKEND_LOG", None)
    backend = subprocess.Popen(
        [sys.executable, str(SERVER)],
        env=env,
        stdout=subprocess.DEVNULL,  # it prints a line a request
        stderr=subprocess.DEVNULL,
    )
    figures: dict[str, float] = {}
    try:
        wait_for(functools.partial(answers, port, "/health"), timeout=30, what="the backend")
        for clients in (1, 16):
            start = time.time() + 0.5
            with multiprocessing.Pool(clients) as pool:
                counts = pool.starmap(_client, [(port, seconds, start)] * clients)
            figures[f"floor_{clients}_clients_posts_per_s"] = sum(counts) / seconds
    finally:
        backend.terminate()
        backend.wait(timeout=10)
    return figures


class RecordingProvisioner:
    """Creates nothing: the tick benchmark measures the controller, not machines."""

    name = "bench"
    delivers_join_token = False

    def create(self, spec: MachineSpec) -> Provisioned:
        return Provisioned(provider_id=spec.name)

    def destroy(self, name: str, provider_id: str | None, provider_state: str | None) -> None:
        pass

    def close(self) -> None:
        pass


def tick_config(folder: Path, pools: int, machines_per_pool: int) -> Path:
    names = [f"p{n:02d}" for n in range(pools)]
    log = folder / "unused.jsonl"
    return project(
        folder,
        {name: {"min": 0, "autoscale": True, "max": machines_per_pool} for name in names},
        {f"{name}-app": backend_app(name, f"{name}_job", log) for name in names},
    )


def write_pending(
    store: Any, per_pool: dict[str, int], now: float, payload: dict[str, Any] | None = None
) -> None:
    """``per_pool[name]`` pending jobs of each pool's app, in one transaction (rows made as
    ``enqueue_many`` makes them, streamed: a million rows take tens of seconds, not minutes)."""

    def rows() -> Iterator[tuple[Any, ...]]:
        for name, count in per_pool.items():
            for i in range(count):
                body = {"n": i} if payload is None else {**payload, "gameId": f"g{i}"}
                new = NewJob(f"{name}-app", f"{name}_job", "/render", body, pool=name)
                yield insert_row(new, new_job_id(new.table), now)

    with store.transaction() as cur:
        cur.executemany(INSERT_JOB, rows())


def fill_tick_store(
    store_url: str, config_path: Path, pending: int, machines_per_pool: int, now: float
) -> None:
    """The pools' machines (ready, seen at ``now``, each running one job: a backlog keeps
    them busy) and ``pending`` jobs waiting, spread evenly over the pools. The jobs are
    written in one transaction (``write_pending``)."""
    config = load_config(config_path)
    settings = ControllerSettings(config_path=str(config_path), secret="bench")
    revisions = Deployment.of(config, settings.pool).revisions
    store = open_store(store_url)
    with store.transaction():
        for name in config.pools:
            for n in range(machines_per_pool):
                machine = f"{name}-m{n}"
                store.machines.add(machine, name, "bench", revisions[name], 1, now)
                store.machines.move(machine, Reason.PROVISIONED, now)
                store.machines.join(machine, f"session-of-{machine}", now)  # seen now
                store.machines.move(machine, Reason.READY, now)
    per_pool = pending // len(config.pools) + machines_per_pool  # the machines take one each
    write_pending(store, dict.fromkeys(config.pools, per_pool), now)
    with store.transaction():
        for name, pool in config.pools.items():
            for n in range(machines_per_pool):
                machine = f"{name}-m{n}"
                store.claim(f"{name}_job", 1, "bench", now, pool.lease, machine=machine)
                store.machines.busy(machine, now)
    if store_url.startswith("postgres"):
        with store.read() as cur:
            cur.execute("ANALYZE jobs")
            cur.execute("ANALYZE machines")
    store.close()


def rss_kib(pid: int | str = "self") -> dict[str, int]:
    """A process's resident memory now and at its peak in KiB, and its threads (VmRSS, VmHWM
    and Threads of /proc/PID/status)."""
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "Threads"):
            found[key] = int(value.split()[0])
    return found


def tick_child(spec: dict[str, Any]) -> dict[str, float]:
    """One round, in a fresh process: a controller on the filled store (in process, its
    provisioner recording only), ticked ``ticks`` times; the tick's times and the process's
    memory once it ticked (and served a /metrics scrape, which reads the queues too)."""
    from sp00ky_infra.controller.metrics import exposition

    config_path = Path(spec["config"])
    config = load_config(config_path)
    store = open_store(spec["store"])
    settings = ControllerSettings(
        config_path=str(config_path), secret="bench", state_dir=str(config_path.parent)
    )
    with store.transaction():  # their agents polled just now: none is silent, no lease ran out
        for machine in store.machines.live():
            store.machines.seen(machine.name, time.time())
            held = [(job.id, job.attempt or "") for job in store.running_on(machine.name)]
            store.renew(held, time.time(), config.pools[machine.pool].lease)
    controller = Controller(settings, config, store, RecordingProvisioner())
    controller.prune.due(time.time() + 3600)  # retention is not what this measures
    report = tick(controller)  # leadership, idle clocks: once
    assert report.leader, "another controller leads this store"
    exposition(controller)
    times = []
    for _ in range(spec["ticks"]):
        started = time.perf_counter()
        report = tick(controller)
        times.append((time.perf_counter() - started) * 1000)
        assert report.leader and not any(plan.create or plan.drain for plan in report.plans)
        assert not report.errors, report.errors
    exposition(controller)
    memory = rss_kib()
    controller.leader_lock.release()
    store.close()
    return {
        "tick_p50_ms": statistics.median(times),
        "tick_max_ms": max(times),
        "rss_mib": memory["VmRSS"] / 1024,
        "peak_rss_mib": memory["VmHWM"] / 1024,
    }


def tick_rounds(
    folder: Path,
    store_url: str,
    pending: int,
    pools: int,
    machines_per_pool: int,
    rounds: int,
    ticks: int,
) -> list[dict[str, float]]:
    """Fill the store once, then each round a fresh process ticks a controller on it."""
    config_path = tick_config(folder, pools, machines_per_pool)
    started = time.perf_counter()
    fill_tick_store(store_url, config_path, pending, machines_per_pool, time.time())
    print(f"    filled {pending:,} pending in {time.perf_counter() - started:.0f}s", flush=True)
    spec = json.dumps({"config": str(config_path), "store": store_url, "ticks": ticks})
    found = []
    for _ in range(rounds):
        done = subprocess.run(
            [sys.executable, __file__, "--tick-child", spec],
            check=True,
            capture_output=True,
            text=True,
        )
        figures = json.loads(done.stdout.splitlines()[-1])
        figures["load_average"] = os.getloadavg()[0]
        print(
            "    round: tick p50 {tick_p50_ms:.2f} ms, max {tick_max_ms:.2f} ms, RSS "
            "{rss_mib:.1f} MiB (peak {peak_rss_mib:.1f}), load average {load_average:.2f}".format(
                **figures
            ),
            flush=True,
        )
        found.append(figures)
    return found


BIG_POOL = "p00"  # the real machines' pool, whose queue holds every pending job


def memory_config(folder: Path, pools: int, machines_per_pool: int, machines: int) -> Path:
    """The tick's pools, but the first one has ``machines`` real machines of 2 slots (the local
    provisioner, recycle never); the others autoscale from 0 on empty queues."""
    names = [f"p{n:02d}" for n in range(pools)]
    log = folder / "unused.jsonl"
    shapes: dict[str, dict[str, Any]] = {
        name: {"min": 0, "autoscale": True, "max": machines_per_pool} for name in names
    }
    shapes[BIG_POOL] = {"min": machines, "slots": 2, "recycle": "never"}
    apps = {f"{name}-app": backend_app(name, f"{name}_job", log) for name in names}
    del apps[f"{BIG_POOL}-app"]["env"]["BACKEND_LOG"]  # a line a job: noise on the disk
    return project(folder, shapes, apps)


def controller_memory_run(
    folder: Path, template: Path, config: Path, machines: int, seconds: float, reads: int
) -> dict[str, float]:
    """A real controller process (SPKY_TICK=1s) on a copy of ``template``: once its machines
    are ready it runs ``seconds`` while they poll, claim and report jobs of 0.25 s, and the
    admin API is read ``reads`` times (GET /pools, /pools/p00, /metrics); then its VmRSS and
    VmHWM (/proc/PID/status)."""
    folder.mkdir(parents=True, exist_ok=True)
    database = folder / "state.db"
    shutil.copyfile(template, database)
    url = f"sqlite:///{database}"
    store = open_store(url)
    try:
        with running_controller(folder, config, url, SPKY_TICK="1s") as controller:
            assert controller.proc is not None
            ready = functools.partial(live_machines, store, BIG_POOL, "ready")
            wait_for(lambda: len(ready()) == machines, timeout=120, what="the machines ready")
            done_before = store.counts()["success"]
            started = time.monotonic()
            reading = []
            for n in range(reads):
                time.sleep(max(0.0, started + seconds * (n + 0.5) / reads - time.monotonic()))
                begun = time.monotonic()
                for path in ("/pools", f"/pools/{BIG_POOL}", "/metrics"):
                    answer = controller.admin("GET", path)
                    assert answer.status_code == 200, (path, answer.text)
                reading.append(time.monotonic() - begun)
            time.sleep(max(0.0, started + seconds - time.monotonic()))
            memory = rss_kib(controller.proc.pid)
            ran = time.monotonic() - started  # longer than ``seconds`` if the reads were slow
            done = store.counts()["success"] - done_before
    finally:
        store.close()
    assert done > 0, "the machines ran no job: they did not poll"
    return {
        "rss_mib": memory["VmRSS"] / 1024,
        "peak_rss_mib": memory["VmHWM"] / 1024,
        "threads": memory["Threads"],
        "jobs_done": done,
        "seconds": ran,
        "admin_reads_max_ms": max(reading) * 1000,
        "load_average": os.getloadavg()[0],
    }


def controller_memory(folder: Path, args: argparse.Namespace) -> tuple[dict[str, float], bool]:
    """The memory target on a real controller process: its RSS with --memory-pending
    jobs pending within 10% of its RSS with 1,000 (SQLite; each run on a fresh copy of a store
    filled once per size; the figures and whether the target is met)."""
    machines = 2
    config = memory_config(folder, args.pools, args.machines, machines)
    print(
        f"controller memory (sqlite): a controller process, {args.pools} pools, {machines} "
        f"real machines x 2 slots on {BIG_POOL} (whose queue holds every pending job), "
        f"SPKY_TICK=1s, {args.memory_seconds:.0f}s a run, the admin API read "
        f"{args.memory_reads} times ...",
        flush=True,
    )
    figures: dict[str, float] = {}
    for pending in (1_000, args.memory_pending):
        template = folder / f"memory-{pending}.db"
        started = time.perf_counter()
        store = open_store(f"sqlite:///{template}")
        write_pending(store, {BIG_POOL: pending}, time.time(), payload={"seconds": 0.25})
        store.close()
        print(f"  {pending:,} pending: filled in {time.perf_counter() - started:.0f}s", flush=True)
        runs = []
        for round_ in range(args.memory_rounds):
            found = controller_memory_run(
                folder / f"memory-{pending}-{round_}",
                template,
                config,
                machines,
                args.memory_seconds,
                args.memory_reads,
            )
            line = (
                "    run: RSS {rss_mib:.1f} MiB (peak {peak_rss_mib:.1f}), {threads:.0f} threads, "
                "{jobs_done:.0f} jobs run in {seconds:.1f}s, the 3 admin reads took at most "
                "{admin_reads_max_ms:.0f} ms, load average {load_average:.2f}"
            )
            print(line.format(**found), flush=True)
            runs.append(found)
        template.unlink()
        for key in ("rss_mib", "peak_rss_mib"):
            figures[f"controller_{key}_{pending}_pending"] = statistics.median(
                run[key] for run in runs
            )
    big = args.memory_pending
    small_mib = figures["controller_rss_mib_1000_pending"]
    ratio = figures[f"controller_rss_mib_{big}_pending"] / small_mib
    figures[f"controller_rss_ratio_{big}_to_1000"] = ratio
    return figures, ratio <= 1.10


def tick_section(
    folder: Path, args: argparse.Namespace, store_url: str | None, dialect: str
) -> tuple[dict[str, float], list[tuple[str, bool]]]:
    """The tick at 1,000 and at --pending pending jobs, --rounds rounds each; the median
    round's figures, and the targets: tick p50 at most 2 ms at --pending, and the
    controller's RSS at --pending within 10% of its RSS at 1,000."""
    figures: dict[str, float] = {}
    machines = args.pools * args.machines
    print(
        f"tick ({dialect}): {args.pools} pools, {machines} machines; a fresh process a round "
        "ticks a controller in process (memory: that process's RSS) ...",
        flush=True,
    )
    for pending in (1_000, args.pending):
        print(f"  {pending:,} pending:", flush=True)
        sub = folder / f"tick-{dialect}-{pending}"
        if store_url is None:
            url = f"sqlite:///{sub}/state.db"
            rounds = tick_rounds(
                sub, url, pending, args.pools, args.machines, args.rounds, args.ticks
            )
        else:
            with scratch_schema(store_url, "bench_tick") as url:
                rounds = tick_rounds(
                    sub, url, pending, args.pools, args.machines, args.rounds, args.ticks
                )
        for key in ("tick_p50_ms", "tick_max_ms", "rss_mib"):
            figures[f"{dialect}_{key}_{pending}_pending"] = statistics.median(
                each[key] for each in rounds
            )
    big = args.pending
    tick_ms = figures[f"{dialect}_tick_p50_ms_{big}_pending"]
    grown = figures[f"{dialect}_rss_mib_{big}_pending"] / figures[f"{dialect}_rss_mib_1000_pending"]
    figures[f"{dialect}_rss_ratio_{big}_to_1000"] = grown
    checks = [
        (f"tick <= 2 ms with {big:,} pending, {machines} machines ({dialect})", tick_ms <= 2),
        (f"memory at {big:,} pending within 10% of 1,000 ({dialect})", grown <= 1.10),
    ]
    return figures, checks


def ticks(args: argparse.Namespace) -> None:
    """--tick-only: the tick section alone, on SQLite (and PostgreSQL with --tick-postgres)."""
    figures: dict[str, float] = {}
    checks: list[tuple[str, bool]] = []
    print(f"load average: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", flush=True)
    with tempfile.TemporaryDirectory() as folder:
        found, checked = tick_section(Path(folder), args, None, "sqlite")
        figures.update(found)
        checks += checked
        if args.tick_postgres and args.postgres:
            found, checked = tick_section(Path(folder), args, args.postgres, "postgres")
            figures.update(found)
            checks += checked
    print(f"load average: {os.getloadavg()[0]:.2f}", flush=True)
    record("dispatch", figures)
    for name, value in figures.items():
        print(f"  {name:<44} {value:>10.2f}")
    for what, ok in checks:
        print(f"  target {what}: {'met' if ok else 'MISSED'}")


def print_memory(figures: dict[str, float], met: bool, pending: int) -> None:
    for name, value in figures.items():
        print(f"  {name:<44} {value:>10.2f}")
    print(
        f"  target controller memory at {pending:,} pending within 10% of 1,000: "
        f"{'met' if met else 'MISSED'}"
    )


def memory_only(args: argparse.Namespace) -> None:
    """--controller-memory: the controller process's memory alone."""
    print(f"load average: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", flush=True)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        figures, met = controller_memory(Path(folder), args)
    print(
        f"load average: {os.getloadavg()[0]:.2f}; took {time.perf_counter() - started:.0f}s",
        flush=True,
    )
    record("dispatch", figures)
    print_memory(figures, met, args.memory_pending)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--latency-jobs", type=int, default=200)
    parser.add_argument("--throughput-jobs", type=int, default=3000)
    parser.add_argument("--pending", type=int, default=100_000)
    parser.add_argument("--pools", type=int, default=20)
    parser.add_argument("--machines", type=int, default=10, help="per pool, for the tick")
    parser.add_argument("--postgres", default=os.environ.get("SPKY_TEST_POSTGRES_URL", ""))
    parser.add_argument("--skip-tick", action="store_true")
    parser.add_argument("--tick-only", action="store_true", help="only the tick section")
    parser.add_argument("--tick-postgres", action="store_true", help="the tick on --postgres too")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the tick, each size")
    parser.add_argument("--ticks", type=int, default=30, help="ticks timed a round")
    parser.add_argument(
        "--controller-memory",
        action="store_true",
        help="only the controller's memory: a real controller process at 1,000 and\n"
        "--memory-pending pending (SQLite), with 2 real machines polling",
    )
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--memory-pending", type=int, default=1_000_000)
    parser.add_argument("--memory-seconds", type=float, default=10, help="a run, machines ready")
    parser.add_argument("--memory-reads", type=int, default=3, help="admin API reads a run")
    parser.add_argument("--memory-rounds", type=int, default=1, help="runs of each size")
    parser.add_argument("--tick-child", help=argparse.SUPPRESS)  # one round, in its own process
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.tick_child:
        print(json.dumps(tick_child(json.loads(args.tick_child))))
        return
    if args.tick_only:
        ticks(args)
        return
    if args.controller_memory:
        memory_only(args)
        return
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as folder:
        print(f"load average: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", flush=True)
        print("loopback floor: keep-alive POSTs to the backend, 1 and 16 clients ...", flush=True)
        figures.update(loopback_floor())
        print("latency: one warm machine, jobs one after another ...", flush=True)
        figures.update(latency(Path(folder) / "latency", args.latency_jobs))
        print("throughput: 4 machines x 4 slots, no-op jobs, SQLite ...", flush=True)
        sqlite_url = f"sqlite:///{folder}/throughput/state.db"
        found = throughput(Path(folder) / "throughput", args.throughput_jobs, sqlite_url)
        figures.update({f"sqlite_{k}": v for k, v in found.items()})
        if args.postgres:
            print("throughput: 4 machines x 4 slots, no-op jobs, PostgreSQL ...", flush=True)
            with scratch_schema(args.postgres, "bench") as url:
                found = throughput(Path(folder) / "throughput-pg", args.throughput_jobs, url)
            figures.update({f"postgres_{k}": v for k, v in found.items()})
        tick_checks: list[tuple[str, bool]] = []
        if not args.skip_tick:
            found, tick_checks = tick_section(Path(folder), args, None, "sqlite")
            figures.update(found)
        if not args.skip_memory:  # about 1.5 minutes at 1,000,000 pending, most of it the fill
            found, met = controller_memory(Path(folder) / "memory", args)
            figures.update(found)
            what = f"controller memory at {args.memory_pending:,} pending within 10% of 1,000"
            tick_checks.append((what, met))
        print(f"load average: {os.getloadavg()[0]:.2f}", flush=True)
    record("dispatch", figures)
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    for name, value in figures.items():
        print(f"  {name:<44} {value:>10.2f}")
    checks = [
        ("latency p50 <= 1.5 ms", figures["latency_p50_ms"] <= 1.5),
        ("latency p99 <= 5 ms", figures["latency_p99_ms"] <= 5),
        ("throughput >= 1,000 jobs/s (SQLite)", figures["sqlite_throughput_jobs_per_s"] >= 1000),
    ]
    if "postgres_throughput_jobs_per_s" in figures:
        checks.append(
            (
                "throughput >= 800 jobs/s (PostgreSQL)",
                figures["postgres_throughput_jobs_per_s"] >= 800,
            )
        )
    checks += tick_checks
    for what, ok in checks:
        print(f"  target {what}: {'met' if ok else 'MISSED'}")


if __name__ == "__main__":
    main()

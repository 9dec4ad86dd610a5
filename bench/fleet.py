"""Fleet benchmark: one controller and a fleet of virtual machines on loopback.

    .venv/bin/python bench/fleet.py [--sizes 100,500,2000] [--postgres URL] [--profile]
    .venv/bin/python bench/fleet.py --quick

For each store (SQLite; PostgreSQL with --postgres URL or $SPKY_TEST_POSTGRES_URL) and size:
a real controller process (``controller.server.Runtime``) whose provisioner is the bench's: it
answers "created" and writes the machine's name and join token to a file, and the bench starts
a virtual agent for it once its row says it was made. The virtual agents live in this process,
one asyncio task each on its own HTTP/1.1 keep-alive connection (the standard library's
asyncio streams): each joins, says it is ready and long-polls as the agent does (the slots and
poll wait its join gave it), and answers every job at once (its result rides the next poll).
One pool, min = max = the size, 2 slots a machine; joins 32 at a time.

Per store and size it prints:
- how long the fleet took to join, and a join and ready's p50 and max;
- tick p50/p99 (ms): the controller's ticks once every machine has polled (timed in the
  controller's process, around ``reconcile.tick``);
- dispatch p50/p99 (ms): from `run` returning (the real client, in a process of its own,
  --rate jobs a second) to the virtual agent reading the poll answer that carries the job;
- the controller's CPU over that window a poll (every poll: those with a job, and the held
  ones that ran out) and a job, its CPU while idle (held polls, ticks) and its RSS; with more
  than one size, its RSS growth a machine (between the smallest and the largest);
- the reconnect storm: the controller stopped (SIGTERM: it answers the held polls and leaves
  the machines running) and started again on the same store and port; seconds from its start
  until every machine's poll has reached it (the store's last sighting of each, written by a
  poll's first pass), with no machine failed or replaced.

Targets (reported, not asserted): dispatch p50 at the largest size at most 3x its p50 at the
smallest; tick p50 under 5 ms; the storm settled in under 10 s. ``--profile``: the controller
under cProfile, its top entries by own time (the event loop's thread: polls, the hub; the tick
runs in another). ``--quick``: 100 machines (or --sizes), SQLite, 60 jobs, nothing recorded.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import io
import json
import os
import pstats
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dispatch import cpu_seconds
from record import record

from agent.controller import backoff
from agent.runtime import free_port
from sp00ky_infra.controller.agents import SEEN_RESOLUTION_SECONDS
from sp00ky_infra.controller.provisioners import MachineSpec, Provisioned
from sp00ky_infra.store import open_store
from tests.controllers import backend_app, project

POOL, APP, TABLE = "fleet", "fleet-app", "fleet_job"
SLOTS = 2
JOINING = 32  # joins (and readies) in flight at once
HTTP_SLACK = 10.0  # beyond a poll's wait, before it counts as lost (as the agent's)
JOIN_TIMEOUT = 120.0  # a join token is good once: its answer is awaited, however slow


# --- the controller's side: its process, with the bench's provisioner ------------------------


class FleetProvisioner:
    """Creates nothing: each machine asked for is a line of ``path`` (name, join token) that
    the bench reads to start its virtual agent. Machines are kept across a restart."""

    name = "fleet"
    delivers_join_token = True

    def __init__(self, path: Path) -> None:
        self.out = path.open("a", encoding="utf-8")

    def create(self, spec: MachineSpec) -> Provisioned:
        self.out.write(json.dumps({"name": spec.name, "token": spec.join_token}) + "\n")
        self.out.flush()
        return Provisioned(provider_id=spec.name)

    def destroy(self, name: str, provider_id: str | None, provider_state: str | None) -> None:
        pass

    def adopt(self, machines: Any) -> None:
        pass  # the machines of the store are the fleet's: they poll again

    def close(self) -> None:
        self.out.close()


class TickTimes:
    """Stands for the controller's tick histogram: each tick's seconds to the histogram and,
    with the time it ended, as a line of ``path``."""

    def __init__(self, histogram: Any, path: Path) -> None:
        self.histogram = histogram
        self.out = path.open("a", encoding="utf-8")

    def observe(self, seconds: float) -> None:
        self.histogram.observe(seconds)
        self.out.write(f"{time.monotonic():.6f} {seconds:.6f}\n")
        self.out.flush()


def controller_child(folder: Path) -> None:
    """The controller's process (``--controller FOLDER``): settings from the environment,
    the bench's provisioner; SIGTERM stops it, leaving its machines."""
    from sp00ky_infra.controller import reconcile, server
    from sp00ky_infra.controller.server import Runtime
    from sp00ky_infra.controller.settings import ControllerSettings

    runtime = Runtime(
        ControllerSettings.from_env(), provisioner=FleetProvisioner(folder / "created.jsonl")
    )
    measures = runtime.controller.measures
    measures.tick = TickTimes(measures.tick, folder / "ticks.log")  # type: ignore[assignment]
    signal.signal(signal.SIGTERM, lambda *_: runtime.stop())
    print("listening", flush=True)
    profile = cProfile.Profile() if os.environ.get("FLEET_PROFILE") else None
    if profile is not None:
        ticks = cProfile.Profile()  # the ticks run in a thread of their own: a profile apart

        def profiled(controller: Any) -> Any:
            return ticks.runcall(reconcile.tick, controller)

        server.tick = profiled  # type: ignore[attr-defined]
        profile.enable()
    try:
        runtime.run()
    finally:
        if profile is not None:
            profile.disable()
            profile.dump_stats(folder / f"controller-{os.getpid()}.prof")
            ticks.dump_stats(folder / f"controller-{os.getpid()}-ticks.prof")
        runtime.close()


def profile_top(folder: Path, count: int = 15) -> None:
    """The controller processes' profiles (``--profile``): the event loop's thread, and the
    ticks (``-ticks``), each by own time."""
    for path in sorted(folder.glob("controller-*.prof")):
        print(f"    profile of {path.name}, top {count} by own time:", flush=True)
        out = io.StringIO()
        pstats.Stats(str(path), stream=out).sort_stats("tottime").print_stats(count)
        lines = out.getvalue().splitlines()
        start = next(i for i, line in enumerate(lines) if "ncalls" in line)
        for line in lines[start : start + count + 1]:
            print(f"      {line}", flush=True)


def submit_child(spec: dict[str, Any]) -> None:
    """The jobs' process (``--submit SPEC``): ``count`` jobs through the real client, one every
    1/``rate`` s; prints each job's id and when `run` returned (monotonic, as the fleet's)."""
    from sp00ky_infra.client import Client

    client = Client(spec["store"], Path(spec["config"]))
    sent = []
    start = time.monotonic()
    for n in range(spec["count"]):
        time.sleep(max(0.0, start + n / spec["rate"] - time.monotonic()))
        job = client.run(APP, "/render", {"gameId": f"g{n}"})
        sent.append((job.id, time.monotonic()))
    client.close()
    print(json.dumps(sent), flush=True)


# --- the virtual agents ----------------------------------------------------------------------


class Link:
    """One keep-alive HTTP/1.1 connection to the agents' endpoint, opened when needed."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: Any, token: str, timeout: float) -> tuple[int, Any]:
        data = json.dumps(body).encode()
        head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n"
        )
        if token:
            head += f"Authorization: Bearer {token}\r\n"
        try:
            if self.writer is None:
                self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
            self.writer.write(head.encode() + b"\r\n" + data)
            return await asyncio.wait_for(self._answer(), timeout)
        except BaseException:
            self.close()
            raise

    async def _answer(self) -> tuple[int, Any]:
        assert self.reader is not None
        first = await self.reader.readline()
        if not first:
            raise ConnectionError("the controller closed the connection")
        status, length, closing = int(first.split()[1]), 0, False
        while True:
            line = (await self.reader.readline()).decode("latin-1")
            if line.strip() == "":
                break
            key, _, value = line.partition(":")
            key, value = key.strip().lower(), value.strip().lower()
            if key == "content-length":
                length = int(value)
            elif key == "connection":
                closing = value == "close"
            elif key == "transfer-encoding":
                raise ConnectionError("a chunked answer: the bench reads sized ones only")
        raw = await self.reader.readexactly(length)
        if closing:
            self.close()
        return status, json.loads(raw) if raw else None

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


@dataclass
class Fleet:
    """The virtual agents and what they saw: polls answered, and when each job arrived."""

    port: int
    polls: int = 0
    failures: int = 0
    ready: set[str] = field(default_factory=set)
    received: dict[str, float] = field(default_factory=dict)  # job id: monotonic
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    refused = ""  # the first join or ready refused, for an error
    joins: list[float] = field(default_factory=list)  # seconds each join and ready took
    joining: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(JOINING))

    def start(self, name: str, token: str) -> None:
        self.tasks.append(asyncio.create_task(self.agent(name, token)))

    async def agent(self, name: str, token: str) -> None:
        link = Link(self.port)
        async with self.joining:
            began = time.monotonic()
            session, settings = await self.join(link, name, token)
            self.joins.append(time.monotonic() - began)
        self.ready.add(name)
        results: list[dict[str, Any]] = []
        failed = 0
        while True:
            body = {"free_slots": settings["slots"], "wait": settings["poll_wait"]}
            body["results"] = results
            try:
                path = f"/v1/machines/{name}/poll"
                status, reply = await link.post(path, body, session, body["wait"] + HTTP_SLACK)
            except (OSError, ConnectionError, TimeoutError, asyncio.IncompleteReadError):
                status, reply = 0, None
            if status != 200:  # stopped, or a controller not leading: as the agent, back off
                self.failures += 1
                await asyncio.sleep(backoff(failed))
                failed += 1
                continue
            failed = 0
            self.polls += 1
            now = time.monotonic()
            results = []
            for each in reply["assignments"]:
                self.received[each["job"]] = now
                results.append({"job": each["job"], "attempt": each["attempt"]})
                results[-1].update(status="success", result=None, posted=0.0)

    async def join(self, link: Link, name: str, token: str) -> tuple[str, dict[str, Any]]:
        for attempt in range(20):
            try:
                status, reply = await link.post(
                    "/v1/join", {"machine": name, "token": token}, "", JOIN_TIMEOUT
                )
                if status != 200:
                    self.refused = self.refused or f"join {status} {reply}"
                if status == 200:
                    session = reply["session"]
                    path = f"/v1/machines/{name}/ready"
                    status, said = await link.post(path, {"ok": True}, session, HTTP_SLACK)
                    if status != 200:
                        self.refused = self.refused or f"ready {status} {said}"
                    if status == 200:
                        return session, reply["settings"]
            except (OSError, ConnectionError, TimeoutError, asyncio.IncompleteReadError) as exc:
                self.refused = self.refused or repr(exc)
            await asyncio.sleep(backoff(attempt))
        raise RuntimeError(f"machine {name} could not join")

    def state(self) -> str:
        """What the fleet is at, for an error: agents, ready, and the first agent's failure."""
        ended = [task.exception() for task in self.tasks if task.done() and not task.cancelled()]
        failure = next((repr(exc) for exc in ended if exc is not None), "none")
        return (
            f"{len(self.tasks)} agents, {len(self.ready)} ready; first failure: {failure}; "
            f"the last join's answer: {self.refused}"
        )

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


# --- one size on one store -------------------------------------------------------------------


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share / 100 * len(ordered)))] if ordered else 0.0


class Run:
    """One controller process on ``store_url`` with a fleet of ``size`` machines."""

    def __init__(self, folder: Path, store_url: str, size: int, port: int) -> None:
        self.folder, self.store_url, self.size, self.port = folder, store_url, size, port
        pool = {"min": size, "max": size, "autoscale": True, "slots": SLOTS}
        self.config = project(folder, {POOL: pool}, {APP: backend_app(POOL, TABLE, folder / "-")})
        self.fleet = Fleet(port)
        self.process: asyncio.subprocess.Process | None = None
        self.read = 0  # bytes of created.jsonl already read
        self.tokens: dict[str, str] = {}  # machines made, their agents not started yet
        self.store = open_store(store_url)

    async def start_controller(self) -> None:
        env = {
            **os.environ,
            "SPKY_CONFIG": str(self.config),
            "SPKY_STORE": self.store_url,
            "SPKY_POOL_PORT": str(self.port),
            "SPKY_ADMIN_PORT": "0",
            "SPKY_POOL_PROVIDER": "local",  # process machines: no image to build
            "SPKY_POOL_SECRET": "bench",
            "SPKY_TICK": "1s",
        }
        self.process = await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            "--controller",
            str(self.folder),
            cwd=self.folder,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=(self.folder / "controller.err").open("a"),
        )
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), 60)
        if b"listening" not in line:
            tail = (self.folder / "controller.err").read_text().splitlines()[-15:]
            raise RuntimeError("the controller did not start:\n" + "\n".join(tail))

    async def stop_controller(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.process.wait(), 30)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()

    async def take_created(self) -> None:
        """Start a virtual agent for each machine the provisioner made whose row says so
        ("booting": its join token is good from then on)."""
        path = self.folder / "created.jsonl"
        if path.exists():
            with path.open("rb") as created:
                created.seek(self.read)
                for line in created:
                    if not line.endswith(b"\n"):
                        break
                    self.read += len(line)
                    found = json.loads(line)
                    self.tokens[found["name"]] = found["token"]
        if not self.tokens:
            return
        live = await asyncio.to_thread(self.store.machines.live, POOL)
        for machine in live:
            if machine.state != "requested" and machine.name in self.tokens:
                self.fleet.start(machine.name, self.tokens.pop(machine.name))

    async def until(self, done: Any, timeout: float, what: str) -> float:
        """Poll ``done()`` (starting agents meanwhile) until true; the seconds it took."""
        start = time.monotonic()
        while not done():
            if time.monotonic() - start > timeout:
                raise RuntimeError(f"{what}: not within {timeout:.0f}s ({self.fleet.state()})")
            await self.take_created()
            await asyncio.sleep(0.1)
        return time.monotonic() - start

    async def submit(self, count: int, rate: float) -> list[tuple[str, float]]:
        spec = {"store": self.store_url, "config": str(self.config), "count": count, "rate": rate}
        child = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--submit", json.dumps(spec), stdout=asyncio.subprocess.PIPE
        )
        out, _ = await child.communicate()
        if child.returncode != 0:
            raise RuntimeError("the jobs' process failed")
        return [(job, float(at)) for job, at in json.loads(out.splitlines()[-1])]

    def ticks(self, since: float) -> list[float]:
        """The controller's ticks that ended after ``since`` (monotonic), in ms."""
        found = []
        for line in (self.folder / "ticks.log").read_text().splitlines():
            ended, seconds = line.split()
            if float(ended) >= since:
                found.append(float(seconds) * 1000)
        return found

    async def measure(self, jobs: int, rate: float, idle: float) -> dict[str, float]:
        """Every machine polling: the controller idle for ``idle`` s, then ``jobs`` jobs."""
        assert self.process is not None
        pid = self.process.pid
        took = await self.until(
            lambda: len(self.fleet.ready) >= self.size, 60 + self.size / 10, "every machine ready"
        )
        since = time.monotonic()
        cpu = cpu_seconds(pid)
        await asyncio.sleep(idle)
        idle_cpu = (cpu_seconds(pid) - cpu) / (time.monotonic() - since)
        polls, cpu = self.fleet.polls, cpu_seconds(pid)
        sent = await self.submit(jobs, rate)
        await self.until(
            lambda: all(job in self.fleet.received for job, _ in sent), 60, "every job taken"
        )
        cpu, polls = cpu_seconds(pid) - cpu, self.fleet.polls - polls
        dispatch = [(self.fleet.received[job] - at) * 1000 for job, at in sent]
        ticks = self.ticks(since)
        return {
            "ready_s": took,
            "join_p50_ms": 1000 * statistics.median(self.fleet.joins),
            "join_max_ms": 1000 * max(self.fleet.joins),
            "tick_p50_ms": statistics.median(ticks),
            "tick_p99_ms": percentile(ticks, 99),
            "dispatch_p50_ms": statistics.median(dispatch),
            "dispatch_p99_ms": percentile(dispatch, 99),
            "cpu_ms_per_poll": 1000 * cpu / max(polls, 1),
            "cpu_ms_per_job": 1000 * cpu / len(sent),
            "idle_cpu_percent": 100 * idle_cpu,
            "rss_mib": rss_mib(pid),
        }

    async def storm(self) -> dict[str, float]:
        """Stop the controller, start it again, and time until every machine polled it."""
        store = self.store
        before = {machine.name for machine in store.machines.live()}
        await self.stop_controller()
        await asyncio.sleep(SEEN_RESOLUTION_SECONDS)  # each next poll writes its sighting
        stopped, start, made = time.time(), time.monotonic(), self.read
        await self.start_controller()
        listening = time.monotonic() - start
        while True:
            live = await asyncio.to_thread(store.machines.live)
            if sum((m.last_seen_at or 0.0) >= stopped for m in live) >= self.size:
                break
            if time.monotonic() - start > 120:
                raise RuntimeError("the machines did not all poll again within 120s")
            await asyncio.sleep(0.1)
        settled = time.monotonic() - start
        replaced = {m.name for m in live} != before or self.read != made
        failed = sum(m.state != "ready" for m in live)
        if replaced or failed:
            raise RuntimeError(f"after the restart: {failed} machine(s) not ready, or replaced")
        return {"restart_listening_s": listening, "reconnect_s": settled}


async def one_size(
    folder: Path, store_url: str, size: int, args: argparse.Namespace
) -> dict[str, float]:
    run = Run(folder, store_url, size, free_port())
    try:
        await run.start_controller()
        figures = await run.measure(args.jobs, args.rate, args.idle)
        figures.update(await run.storm())
        figures["poll_failures"] = run.fleet.failures
        return figures
    finally:
        await run.fleet.stop()
        await run.stop_controller()
        run.store.close()


# --- the run ---------------------------------------------------------------------------------


def stores(args: argparse.Namespace, folder: Path) -> Iterator[tuple[str, Any]]:
    """(dialect, a function of the size giving a context manager of a fresh store's URL)."""
    from sp00ky_infra.store.postgres import scratch_schema

    @contextlib.contextmanager
    def sqlite(size: int) -> Iterator[str]:
        yield f"sqlite:///{folder}/sqlite-{size}/state.db"

    yield "sqlite", sqlite
    if args.postgres:
        yield "postgres", lambda size: scratch_schema(args.postgres, f"bench_fleet_{size}")


def print_size(dialect: str, size: int, found: dict[str, float]) -> None:
    print(
        f"  {dialect} {size} machines: ready in {found['ready_s']:.1f}s (a join and ready p50 "
        f"{found['join_p50_ms']:.0f} ms, max {found['join_max_ms']:.0f}); tick p50 "
        f"{found['tick_p50_ms']:.2f} p99 {found['tick_p99_ms']:.2f} ms; dispatch p50 "
        f"{found['dispatch_p50_ms']:.2f} p99 {found['dispatch_p99_ms']:.2f} ms; controller "
        f"{found['cpu_ms_per_poll']:.2f} CPU ms a poll, {found['cpu_ms_per_job']:.2f} a job, "
        f"{found['idle_cpu_percent']:.1f}% idle, RSS {found['rss_mib']:.1f} MiB; storm "
        f"{found['reconnect_s']:.2f}s (listening after {found['restart_listening_s']:.2f}s)",
        flush=True,
    )


def targets(figures: dict[str, float], dialects: list[str], sizes: list[int]) -> list[str]:
    lines = []
    small, large = min(sizes), max(sizes)
    for dialect in dialects:
        if large > small:
            ratio = (
                figures[f"{dialect}_{large}_dispatch_p50_ms"]
                / figures[f"{dialect}_{small}_dispatch_p50_ms"]
            )
            figures[f"{dialect}_dispatch_p50_ratio"] = ratio
            lines.append(f"{dialect}: dispatch p50 at {large} <= 3x at {small}: {ratio:.2f}x")
            grown = figures[f"{dialect}_{large}_rss_mib"] - figures[f"{dialect}_{small}_rss_mib"]
            figures[f"{dialect}_rss_kib_per_machine"] = 1024 * grown / (large - small)
            lines.append(
                f"{dialect}: RSS growth {figures[f'{dialect}_rss_kib_per_machine']:.1f} KiB a "
                "machine (not a target)"
            )
        for size in sizes:
            tick = figures[f"{dialect}_{size}_tick_p50_ms"]
            storm = figures[f"{dialect}_{size}_reconnect_s"]
            lines.append(
                f"{dialect} {size}: tick p50 < 5 ms: {tick:.2f}; storm < 10 s: {storm:.2f}"
            )
    return lines


async def bench(args: argparse.Namespace) -> dict[str, float]:
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="sp00ky-fleet-") as tmp:
        for dialect, fresh in stores(args, Path(tmp)):
            for size in args.sizes:
                folder = Path(tmp) / f"{dialect}-{size}"
                folder.mkdir()
                with fresh(size) as store_url:
                    found = await one_size(folder, store_url, size, args)
                if args.profile:
                    profile_top(folder)
                print_size(dialect, size, found)
                figures.update({f"{dialect}_{size}_{key}": v for key, v in found.items()})
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", help="machines, comma-separated (100,500,2000)")
    parser.add_argument("--postgres", default=os.environ.get("SPKY_TEST_POSTGRES_URL"))
    parser.add_argument("--jobs", type=int, default=300, help="jobs a size")
    parser.add_argument("--rate", type=float, default=30.0, help="jobs a second")
    parser.add_argument("--idle", type=float, default=5.0, help="seconds idle, measured")
    parser.add_argument(
        "--quick", action="store_true", help="100 machines (or --sizes), SQLite, 60 jobs"
    )
    parser.add_argument(
        "--profile", action="store_true", help="the controller under cProfile: its top entries"
    )
    parser.add_argument("--controller", help=argparse.SUPPRESS)
    parser.add_argument("--submit", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.profile:
        os.environ["FLEET_PROFILE"] = "1"  # the controller processes' environment
    if args.controller:
        return controller_child(Path(args.controller))
    if args.submit:
        return submit_child(json.loads(args.submit))
    if args.quick:  # the sizes given stand (a smoke test's tiny fleet)
        args.sizes, args.postgres, args.jobs, args.idle = args.sizes or "100", None, 60, 2.0
    args.sizes = [int(each) for each in (args.sizes or "100,500,2000").split(",")]
    if not args.postgres:
        why = "--quick" if args.quick else "no --postgres URL, no $SPKY_TEST_POSTGRES_URL"
        print(f"PostgreSQL: skipped ({why})", flush=True)
    print(f"load average: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", flush=True)
    figures = asyncio.run(bench(args))
    dialects = ["sqlite", "postgres"] if args.postgres else ["sqlite"]
    checks = targets(figures, dialects, args.sizes)
    print(f"load average: {os.getloadavg()[0]:.2f}", flush=True)
    for line in checks:
        print(f"  target {line}", flush=True)
    if not args.quick:
        record("fleet", figures)


if __name__ == "__main__":
    main()

"""``sp00ky-infra controller`` (the service) and ``sp00ky-infra dev`` (the embedded default)."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.console import Console, Group
from rich.live import Live

from sp00ky_infra import engine
from sp00ky_infra.cli.dashboard import Column, fitted
from sp00ky_infra.cli.dev_events import EventPrinter, Recent, breaker_lines, clock
from sp00ky_infra.cli.jobs import refusals
from sp00ky_infra.cli.progress import image_progress
from sp00ky_infra.client import Client, payload_from_text
from sp00ky_infra.config.loader import load_config
from sp00ky_infra.config.model import DEFAULT_CONFIG_FILE
from sp00ky_infra.controller import admin, preflight
from sp00ky_infra.controller.costs import lifetimes_cost
from sp00ky_infra.controller.images import ImagesError
from sp00ky_infra.controller.leadership import leader_url
from sp00ky_infra.controller.provisioners import ProvisionerError
from sp00ky_infra.controller.reconcile import TickReport
from sp00ky_infra.controller.server import Runtime
from sp00ky_infra.controller.settings import ControllerSettings, SettingsError
from sp00ky_infra.store.machines import Machine
from sp00ky_infra.store.model import TERMINAL
from sp00ky_infra.store.postgres import redact

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
BUILD_TAIL_LINES = 12  # of a failed image build's output, in the refusal
MACHINE_KINDS = {"docker": "Docker containers", "local": "local processes"}
RUN_ON = {"docker": "docker", "local": "local processes"}  # a pool's start-up line under dev


def _start(settings: ControllerSettings, fresh: bool = False) -> Runtime:
    pools = load_config(settings.config_path).pools  # a ConfigError: refusals() says it
    found = preflight.problems(settings, os.environ, pools)
    if found:
        click.echo(
            "error: cannot start: a pool's provider is not served here; fix first:", err=True
        )
        for problem in found:
            click.echo(f"  - {problem.line()}", err=True)
        sys.exit(2)
    try:
        return Runtime(settings, fresh=fresh)
    except KeyboardInterrupt:  # Ctrl-C while images build: no machine exists yet
        click.echo("interrupted while starting; no machine was created", err=True)
        sys.exit(130)
    except (SettingsError, ImagesError, ProvisionerError) as exc:
        click.echo(f"error: {exc}", err=True)
        tail = build_tail(exc)
        if tail:
            click.echo("the build's last lines:", err=True)
            for line in tail:
                click.echo(f"  {line}", err=True)
        sys.exit(2)


def build_tail(exc: BaseException, lines: int = BUILD_TAIL_LINES) -> list[str]:
    """The last lines of a failed image build's output, when ``exc`` came from one."""
    from docker.errors import BuildError

    seen: BaseException | None = exc
    while seen is not None and not isinstance(seen, BuildError):
        seen = seen.__cause__ or seen.__context__
    if seen is None:
        return []
    output: list[str] = []
    for chunk in seen.build_log:
        if not isinstance(chunk, dict):
            continue
        text = chunk.get("stream") or chunk.get("error") or ""
        output += [line.rstrip() for line in str(text).splitlines() if line.strip()]
    return output[-lines:]


# Ctrl-C, a service stop, a closed terminal
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _signals(runtime: Runtime, drains: bool = False) -> dict[str, int]:
    """The first SIGINT, SIGTERM or SIGHUP stops (``drains``: running jobs finish first); a
    second one aborts the drain (``dev``: machines are still destroyed, their jobs go back
    to the queue) or, for the controller, which leaves its machines running, exits at once."""
    received = {"count": 0}

    def handle(signum: int, _: object) -> None:
        received["count"] += 1
        if received["count"] == 1:
            runtime.drain() if drains else runtime.stop()
        elif drains:
            runtime.abort()
        else:
            os._exit(130)

    for signum in STOP_SIGNALS:
        signal.signal(signum, handle)
    return received


@click.command()
@click.option(
    "--config", "config_file", envvar="SPKY_CONFIG", default=DEFAULT_CONFIG_FILE, show_default=True
)
@click.option("--store", "store_url", envvar="SPKY_STORE", help="Store URL (default: $SPKY_STORE).")
def controller(config_file: str, store_url: str | None) -> None:
    """Run the controller: pools sized every tick, the agents' endpoint and the admin API.

    Settings come from the environment (SPKY_POOL_PORT, SPKY_POOL_PUBLIC_URL, SPKY_POOL_SECRET,
    SPKY_ADMIN_PORT, SPKY_ADMIN_TOKEN, SPKY_TICK, ...; see docs/configuration.md). SIGTERM
    stops it and leaves the machines running: they reconnect to the next controller.
    """
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT, stream=sys.stderr)
    with refusals():
        settings = _settings(config_path=config_file, store_url=store_url)
        with image_progress() as bars, engine.reporting(bars):
            runtime = _start(settings)
    # Before the line that says it runs: a signal sent as soon as it is read must stop it
    # (Python's own SIGINT and SIGTERM would end it there, without its cleanup).
    _signals(runtime)
    state = runtime.write_state()
    public = runtime.settings.agents_url
    reached = f" (machines reach it at {public})" if public != runtime.listen_url else ""
    print(
        f"controller: agents' endpoint on {runtime.listen_url}{reached}, admin API on "
        f"{runtime.admin_url} (state in {state})",
        flush=True,
    )
    try:
        runtime.run()
    finally:
        runtime.close()
    with contextlib.suppress(OSError):  # its terminal may be gone (SIGHUP)
        print("controller: stopped; machines keep running and reconnect to the next controller")


def _settings(**overrides: Any) -> ControllerSettings:
    try:
        return ControllerSettings.from_env(**overrides)
    except SettingsError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)


# --- dev -----------------------------------------------------------------------------------------


@click.command()
@click.argument("file", default=DEFAULT_CONFIG_FILE, required=False)
@click.option("--store", "store_url", help="Store URL (default: sqlite:///.sp00ky/state.db).")
@click.option(
    "--burst", type=click.IntRange(min=0), default=0, help="Queue this many jobs at start."
)
@click.option("--backend", help="Backend of the burst (default: the first pool's).")
@click.option("--path", "route", default=None, help="Route of the burst's jobs.")
@click.option("--payload", help="Payload of the burst's jobs (JSON).")
@click.option(
    "--timings",
    default="",
    help="Shorter pool durations for a demo, e.g. idleTimeout=5s (never below the docs' rules "
    "in production).",
)
@click.option(
    "--exit-when-idle", is_flag=True, help="Exit once every job ended and pools are at rest."
)
@click.option("--plain", is_flag=True, help="Print events as lines instead of the live view.")
@click.option(
    "--machines",
    type=click.Choice(["docker", "local"]),
    default=None,
    help="What machines are: Docker containers of each backend's image, or local processes "
    "running deploy.command (default: docker when a Docker engine answers, else local).",
)
def dev(
    file: str,
    store_url: str | None,
    burst: int,
    backend: str | None,
    route: str | None,
    payload: str | None,
    timings: str,
    exit_when_idle: bool,
    plain: bool,
    machines: str | None,
) -> None:
    """Run FILE's pools on this host with a SQLite store, in the foreground.

    The controller, the agents' endpoint, the admin API and the machines, whatever the file
    says: Docker containers of each backend's image (built at start; containers an earlier
    run left are removed) when a Docker engine answers, else local processes running
    each backend's deploy.command (--machines chooses). A live view per pool. Ctrl-C drains
    and stops everything, leaving no process behind; a second Ctrl-C aborts.
    """
    settings, kind = _dev_settings(file, store_url, timings, machines)
    with refusals(), image_progress() as bars, engine.reporting(bars):
        runtime = _start(settings, fresh=True)  # a new run: an earlier run's leftovers go
    # Before "Ctrl-C stops everything" is printed: a Ctrl-C as soon as it is read drains (with
    # Python's own SIGINT it would end dev there, its machines not destroyed).
    _signals(runtime, drains=True)
    runtime.write_state()
    ledger = _Ledger(runtime)
    console = Console(soft_wrap=True, highlight=False)  # status lines stay whole, uncoloured
    live_view = not plain and console.is_terminal
    queued: list[str] = []
    if burst:
        with refusals():
            queued = _burst(runtime, burst, backend, route, payload)
    printer = EventPrinter(runtime.controller, console) if not live_view else None
    finished = threading.Event()

    def on_tick(report: TickReport) -> None:
        if printer is not None:
            printer.flush()
        if exit_when_idle and report.leader and _at_rest(runtime, queued):
            finished.set()
            runtime.stop()

    _announce(console, file, kind, runtime, queued)
    started = time.monotonic()

    def on_progress(line: str) -> None:
        _say(console, f"{line} (Ctrl-C again: abort; the jobs go back to the queue)")

    try:
        _run(runtime, console, live_view, on_tick, on_progress)
    finally:
        _end(runtime, console, printer, queued, started, ledger)
    if runtime.aborted or (exit_when_idle and not finished.is_set()):
        sys.exit(130)


def _dev_settings(
    file: str, store_url: str | None, timings: str, machines: str | None
) -> tuple[ControllerSettings, str]:
    """dev's settings from the environment, its machines' kind (said at once) and its log."""
    env = dict(os.environ)
    kind, why = _machines_kind(machines, env)
    click.echo(f"dev: machines are {MACHINE_KINDS[kind]} ({why})")
    if timings:
        env["SPKY_POOL_TIMINGS"] = timings
    env["SPKY_POOL_PROVIDER"] = kind
    env.pop("SPKY_POOL_DOCKER", None)
    if kind == "docker":
        env.setdefault("SPKY_POOL_SECRET", secrets.token_urlsafe(32))  # this run's own
    try:
        settings = ControllerSettings.from_env(
            env, config_path=file, store_url=store_url or env.get("SPKY_STORE") or None
        )
    except SettingsError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    Path(settings.state_dir).mkdir(parents=True, exist_ok=True)
    logging.basicConfig(
        level=logging.INFO,
        format=LOG_FORMAT,
        filename=str(Path(settings.state_dir) / "controller.log"),
    )
    return settings, kind


def _announce(console: Console, file: str, kind: str, runtime: Runtime, queued: list[str]) -> None:
    """What dev runs, where it answers, and how it stops (a standby says it waits)."""
    console.print(
        f"dev: {file} on {MACHINE_KINDS[kind]}; store {redact(runtime.settings.store_url)}; "
        f"agents' endpoint {runtime.settings.agents_url}; admin API {runtime.admin_url}"
        + (f"; {len(queued)} job(s) queued" if queued else "")
        + ". Ctrl-C stops everything."
    )
    for name, pool in runtime.controller.pools.items():
        console.print(
            f"dev: pool {name}: provider {pool.provider} in {file}, run on {RUN_ON[kind]} by dev"
        )
    for line in breaker_lines(runtime.controller, runtime.controller.clock()):
        console.print(line)
    if not runtime.controller.leader:
        console.print("dev: " + _standby(runtime) + "; waiting for leadership")


def _run(
    runtime: Runtime,
    console: Console,
    live_view: bool,
    on_tick: Callable[[TickReport], None],
    on_progress: Callable[[str], None],
) -> None:
    """Serve until stopped, under the live view or printing events as lines."""
    if live_view:
        recent = Recent(runtime.controller)

        def view() -> Group:
            return _view(runtime, console.width, recent)

        with Live(view(), console=console, refresh_per_second=4) as live:
            refresher = _Refresher(lambda: live.update(view()))
            refresher.start()
            try:
                runtime.run(on_tick, on_progress)
            finally:
                refresher.stop()
                with contextlib.suppress(OSError):  # the terminal may be gone (SIGHUP)
                    live.update(view())
    else:
        runtime.run(on_tick, on_progress)


def _end(
    runtime: Runtime,
    console: Console,
    printer: EventPrinter | None,
    queued: list[str],
    started: float,
    ledger: _Ledger,
) -> None:
    """dev's machines destroyed, the events left printed, the runtime closed, a summary said."""
    stopped = _stop_machines(runtime)
    if printer is not None:
        with contextlib.suppress(OSError):
            printer.flush(force=True)
    summary = _summary(runtime, queued, time.monotonic() - started, ledger)
    runtime.close()
    _say(console, f"dev: stopped; {stopped}. {summary}")


def _stop_machines(runtime: Runtime) -> str:
    """dev's machines at the end: every one destroyed (an abort first puts the jobs they ran
    back in the queue, without spending a retry); none for a standby, they are the leader's."""
    if not runtime.owns_machines:
        return "no machine destroyed (" + _standby(runtime) + ")"
    back = runtime.release_attempts() if runtime.aborted else []
    stopped = f"{runtime.destroy_machines()} machine(s) destroyed"
    if runtime.aborted:
        return f"aborted: {stopped}, {len(back)} job(s) back in the queue (no retry spent)"
    return f"{stopped} at the stop"


def _say(console: Console, line: str) -> None:
    """A line for the terminal, which may be gone (closing it sends SIGHUP: the stop goes on)."""
    with contextlib.suppress(OSError):
        console.print(line)


def _machines_kind(choice: str | None, env: dict[str, str]) -> tuple[str, str]:
    """docker or local, and why: --machines, else the environment's provider, else docker
    when a Docker engine answers."""
    if choice:
        return choice, f"--machines {choice}"
    provider = env.get("SPKY_POOL_PROVIDER", "")
    if provider in MACHINE_KINDS:
        return provider, f"SPKY_POOL_PROVIDER={provider}"
    if provider:
        click.echo(
            f"error: dev runs its machines on this host (--machines docker|local); "
            f"SPKY_POOL_PROVIDER={provider} is for `sp00ky-infra controller`",
            err=True,
        )
        sys.exit(2)
    if env.get("SPKY_POOL_DOCKER") == "1":
        return "docker", "SPKY_POOL_DOCKER=1"
    no_engine = preflight.docker_answers()
    if no_engine is None:
        return "docker", "a Docker engine answers; --machines local runs local processes instead"
    return "local", f"no Docker engine answers: {no_engine}; --machines docker once one runs"


def _standby(runtime: Runtime) -> str:
    settings = runtime.settings
    url = leader_url(settings.state_dir, settings.controller_id)
    return "a standby: the leader" + (f" at {url}" if url else "") + " keeps its machines"


def _burst(
    runtime: Runtime, count: int, backend: str | None, route: str | None, payload: str | None
) -> list[str]:
    controller = runtime.controller
    if backend is None:
        if not controller.backends:
            raise click.UsageError("--burst needs a pool backend; this file declares no pools")
        backend = next(iter(controller.backends.values())).name
    if route is None:
        raise click.UsageError("--burst needs --path, the route the jobs call (e.g. /render)")
    body = payload_from_text(payload)
    client = Client(controller.store, controller.config)
    return [client.run(backend, route, body).id for _ in range(count)]


def _at_rest(runtime: Runtime, queued: list[str]) -> bool:
    """Every queued job ended, and every pool is down to what it wants with nothing booting."""
    store = runtime.controller.store
    if any(store.get(job_id).status in ("pending", "processing") for job_id in queued):
        return False
    for name in runtime.controller.pools:
        view = admin.pool_view(runtime.controller, name, machines=False)
        if sum(view["machines"].values()) != view["desired"]:
            return False
    return True


class _Ledger:
    """The machines a dev run answers for: those live in the store when it began to lead
    (an earlier run's, which it reconnected to) and those created since. A standby's
    machines are the leader's; one that takes over answers for what it took over."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.led_since: float | None = None
        self.reconnected: set[str] = set()
        runtime.controller.on_leadership.append(self.leadership)
        if runtime.controller.leader:  # it leads from the start (Runtime took the lock)
            self.leadership(True)

    def leadership(self, leader: bool) -> None:
        if not leader or self.led_since is not None:
            return
        controller = self.runtime.controller
        self.led_since = controller.clock()
        self.reconnected = {
            m.name for m in controller.store.machines.live() if m.created_at < self.led_since
        }

    def machines(self) -> list[Machine]:
        if self.led_since is None:
            return []
        store = self.runtime.controller.store
        return [
            machine
            for pool in self.runtime.controller.pools
            for machine in store.machines.recent(pool, limit=1000)
            if machine.created_at >= self.led_since or machine.name in self.reconnected
        ]


def _summary(runtime: Runtime, queued: list[str], seconds: float, ledger: _Ledger) -> str:
    """What this run did: its jobs, then this run's machines apart from the store's total.
    This run's are the machines it answered for (created by it, or an earlier run's it
    reconnected to: those count from their creation); the store's are every run's."""
    store = runtime.controller.store
    now = runtime.controller.clock()
    spent = "no machine time of its own (a standby)"
    if runtime.owns_machines:  # a standby's machines were the leader's, not its own
        spent = f"{_this_run(runtime, ledger, queued, now)}. {_on_the_store(runtime, now)}"
    if not queued:
        return f"Ran {seconds:.0f}s. {spent}."
    statuses = [store.get(job_id).status for job_id in queued]
    return (
        f"{statuses.count('success')} of {len(queued)} job(s) succeeded, "
        f"{statuses.count('failed')} failed, in {seconds:.0f}s. {spent}."
    )


def _this_run(runtime: Runtime, ledger: _Ledger, queued: list[str], now: float) -> str:
    """This run's machines, their machine time and, per pool, their euros (per job: of the
    jobs it queued that ended)."""
    controller = runtime.controller
    machines = ledger.machines()
    names = {m.name for m in machines}
    machine_seconds = sum((m.destroyed_at or now) - m.created_at for m in machines)
    destroyed = sum(1 for m in machines if m.destroyed_at is not None)
    again = sum(1 for m in machines if m.name in ledger.reconnected)
    ended = [controller.store.get(job_id) for job_id in queued]
    parts = []
    for name in controller.pools:
        lives = [life for life in controller.store.machines.lifetimes(name) if life.name in names]
        jobs = sum(1 for job in ended if job.pool == name and job.status in TERMINAL)
        parts.append(f"pool {name}: " + _euros(lifetimes_cost(
            controller.store, controller.config, name, lives, now, jobs
        )))  # fmt: skip
    return (
        f"This run: {destroyed} machine(s) destroyed, machine time {machine_seconds:.0f}s "
        f"({machine_seconds / 3600:.4f} pool_machine_hours) of {len(machines)} machine(s)"
        + (f", {again} reconnected from an earlier run" if again else "")
        + "".join(f"; {part}" for part in parts)
    )


def _on_the_store(runtime: Runtime, now: float) -> str:
    """Every run's machines on this store, per pool: how many, and their euros."""
    parts = []
    for name in runtime.controller.pools:
        cost = admin.cost_view(runtime.controller, name, now)
        parts.append(f"pool {name}: {cost['machines']} machine(s), " + _euros(cost, per_job=False))
    return "The store in all (every run on it): " + "; ".join(parts)


def _euros(cost: dict[str, Any], per_job: bool = True) -> str:
    """A bill in words: never 0 EUR for a type with no known price; a pool whose provider
    bills nothing says why."""
    price = cost["price"]
    if price is None:
        return f"cost unknown as {cost['server_type']} (no known price)"
    if not price["hourly"] and not price["monthly"]:
        return f"0 EUR ({price['source']})"
    each = cost["euros_per_job"] if per_job else None
    return (
        f"{cost['euros']:.4f} EUR as {cost['server_type']} ({cost['idle_euros']:.4f} idle"
        + (f", {each:.6f} per job" if each is not None else "")
        + ")"
    )


class _Refresher(threading.Thread):
    def __init__(self, refresh: Callable[[], None]) -> None:
        super().__init__(name="live-view", daemon=True)
        self.refresh = refresh
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(0.5):
            try:
                self.refresh()
            except Exception as exc:  # a store hiccup must not end the view
                logging.getLogger("sp00ky.dev").warning("live view: %s", exc)

    def stop(self) -> None:
        self._halt.set()


# The live view's pool table: headers short enough for 80 columns (values are never cut).
POOL_VIEW = (
    Column("pool"),
    *(Column(header, "right") for header in ("want", "boot", "ready", "busy", "drain")),
    *(Column(header, "right") for header in ("queue", "run", "breaker")),
)
EVENT_VIEW = (Column("at"), Column("pool"), Column("kind"), Column("message", wraps=True))


def _view(runtime: Runtime, width: int | None, recent: Recent) -> Group:
    """Each pool's machines, queue and breaker, and what happened last (events, jobs'
    outcomes), fitted to ``width``."""
    controller = runtime.controller
    rows, held = [], []
    for name in controller.pools:
        view = admin.pool_view(controller, name, machines=False)
        machines, breaker = view["machines"], view["breaker"]
        rows.append(
            (
                name + (" (paused)" if view["paused"] else ""),
                str(view["desired"]),
                str(machines.get("requested", 0) + machines.get("booting", 0)),
                str(machines.get("ready", 0)),
                str(view["busy_machines"]),
                str(machines.get("draining", 0)),
                str(view["queue"]["queued"]),
                str(view["queue"]["running"]),
                "open" if breaker["open"] else "closed",
            )
        )
        if breaker["open"]:
            held.append(
                f"{name}: breaker open until {clock(breaker['open_until'])}; "
                f"`sp00ky-infra pools reset {name}` closes it"
            )
    pools = fitted(POOL_VIEW, rows, width, title="pools", caption="\n".join(held) or None)
    lines = [(clock(h.at), h.pool, h.kind, h.message) for h in recent.rows()]
    events = fitted(EVENT_VIEW, lines, width, title="recent events", show_header=False)
    standby = "stopping" if controller.resigned else "waiting for leadership"
    leader = "leader" if controller.leader else standby
    return Group(pools, events, f"[dim]{leader} · Ctrl-C stops everything[/dim]")

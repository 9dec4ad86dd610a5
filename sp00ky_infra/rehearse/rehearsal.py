"""``sp00ky-infra rehearse``: a user's production config run end to end on this machine.

The controller runs as in production (``SPKY_POOL_PROVIDER=pulumi`` on a ``prod`` stack, the
real Pulumi engine, ``file://`` state) against the fake Hetzner Cloud of ``cloud.py`` in boot
mode, so every server ``pulumi up`` creates boots its own user-data (``boot.py``): cloud-init
installs the agent, the agent dials the controller, fetches the backend's image into the
server's own Docker engine, starts the backend and runs jobs. A burst of jobs is queued; the
pools grow, run them and shrink back to zero; the guardian makes a pass over the same cloud
while the machines run and once they are gone. Nothing of the user's own state is touched: the
store, the stack and its secrets live in a working directory of the rehearsal's own.

Each machine's create-to-ready time is split into phases (``phases``). The verdict says what
worked, what failed (with its cause, from those phases and the server's console), and what
would differ in the cloud, with the estimate of the same phases on Hetzner.

An image path (``phases.PATHS``: default, fallback, baked) rehearses the config with every
Hetzner pool's ``machine.image`` set to the path's (``paths.py``; the baked path bakes the
pools' snapshots first); ``rehearse_paths`` runs several in turn, to be set side by side.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sp00ky_infra.client import Client
from sp00ky_infra.config import Config, ConfigError
from sp00ky_infra.config.loader import load_config
from sp00ky_infra.config.machine_images import BAKED, has_docker
from sp00ky_infra.controller.baking import parse_outcome
from sp00ky_infra.guardian.passes import run_pass
from sp00ky_infra.hetzner import HetznerAPI
from sp00ky_infra.rehearse.boot import Booter
from sp00ky_infra.rehearse.cloud import TOKEN, FakeHetzner
from sp00ky_infra.rehearse.errors import RehearseError
from sp00ky_infra.rehearse.image import Recipe, ensure_image, image_exists
from sp00ky_infra.rehearse.paths import path_config
from sp00ky_infra.rehearse.phases import (
    PATH_IMAGES,
    SNAPSHOT_NOTE,
    SNAPSHOT_PATHS,
    Timeline,
    agent_events,
    cause,
    count_downloads,
    downloads,
    estimate,
    estimate_figures,
    image_notes,
    later,
    phases,
)
from sp00ky_infra.shared.cloud_init import USER_DATA_LIMIT, user_data
from sp00ky_infra.shared.shipped import NotShipped, shipped
from sp00ky_infra.store import open_store
from sp00ky_infra.store.machines import Machine

ROOT = Path(__file__).resolve().parent.parent.parent  # a checkout: scripts/pulumi-engine
LISTENING = re.compile(r"agents' endpoint on (http://[^\s,]+).*, admin API on (http://\S+) ")
# What a rehearsal changes of the user's timings: machines go idle fast, so the pool is back
# to zero in seconds, not in the 5 minutes of a production idleTimeout.
DEFAULT_TIMINGS = "idleTimeout=10s"
# Its servers keep their paid hours as in production, on hours of 30 s: an idle one goes in
# the last seconds of its paid 30 s, so the pool is back to zero within a minute.
BILLING_HOUR = "30s"
READ_EVERY_SECONDS = 8.0  # how often a booting server is looked into
# the agent's events, and the bootstrap's (its output is cloud-final's: agent_present, ...)
JOURNAL = ("journalctl", "-u", "sp00ky-agent.service", "-u", "cloud-final.service", "-o", "json",
           "--no-pager")  # fmt: skip
BAKE_WAIT_SECONDS = 1200.0  # a baked pool's bake, at most, before the burst
BOOTSTRAP = ("grep", "-a", "sp00ky-bootstrap event=", "/var/log/cloud-init-output.log")


@dataclass
class Reading:
    """What the fake cloud has seen inside a server, as of its last look (monotonic ``at``)."""

    at: float
    timeline: Timeline = field(default_factory=Timeline)
    events: dict[str, float] = field(default_factory=dict)
    console: str = ""
    bootstrap: tuple[str, ...] = ()  # bootstrap's lines in cloud-init's output log


def read_server(
    booter: Booter, server: int, *, console: bool, last: Reading | None = None
) -> Reading:
    """Look inside a server: its boot timeline, the agent's events and (``console``) its
    console, on top of the ``last`` look. What this look cannot read keeps what the last one
    saw: a failed boot is destroyed in the tick that fails it, so the look that reports it may
    find the server stopping, with no journal to read and only its start time."""
    seen = last or Reading(0.0)
    reading = Reading(
        time.monotonic(), seen.timeline, dict(seen.events), seen.console, seen.bootstrap
    )
    with contextlib.suppress(Exception):
        reading.timeline = later(seen.timeline, booter.timeline(server))
    with contextlib.suppress(Exception):
        events = agent_events(booter.exec(server, *JOURNAL)[1])
        reading.events = {**events, **seen.events}  # each event's first time
    with contextlib.suppress(Exception):
        reading.bootstrap = tuple(booter.exec(server, *BOOTSTRAP)[1].splitlines()) or seen.bootstrap
    if console:
        with contextlib.suppress(Exception):
            reading.console = booter.console(server, lines=30) or seen.console
    return reading


@dataclass
class MachineReport:
    name: str
    pool: str
    server_id: int | None
    outcome: str  # ready | failed | (a state it was left in)
    phases: dict[str, float | None] = field(default_factory=dict)
    created_to_ready: float | None = None
    failed_reason: str | None = None
    cause: str | None = None
    console: str = ""
    events: list[str] = field(default_factory=list)  # the bootstrap's and agent's, in order
    downloads: dict[str, bool] = field(default_factory=dict)  # phases.downloads


@dataclass
class RehearsalReport:
    config: str
    pools: list[str]
    jobs: dict[str, int] = field(default_factory=dict)
    machines: list[MachineReport] = field(default_factory=list)
    guardian: list[dict[str, Any]] = field(default_factory=list)
    incidents: list[str] = field(default_factory=list)
    breaker_open: list[str] = field(default_factory=list)
    worked: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    cloud: list[str] = field(default_factory=list)  # what would differ in the cloud
    estimate: dict[str, float | None] = field(default_factory=dict)
    estimate_sources: dict[str, str] = field(default_factory=dict)  # per phase
    # estimate()'s arguments besides the phases, so rounds can be estimated together
    estimate_basis: dict[str, bool] = field(default_factory=dict)
    elapsed: float = 0.0
    workdir: str = ""
    path: str | None = None  # the image path rehearsed (phases.PATHS); None: the pool's own
    bake_seconds: float | None = None  # the baked path's bake, before the burst
    downloads: dict[str, int] = field(default_factory=dict)  # phases.count_downloads

    @property
    def ok(self) -> bool:
        return not self.failed

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


Progress = Callable[[str], None]


def _say(message: str) -> None:
    print(f"rehearse: {message}", file=sys.stderr, flush=True)


def pulumi_bin() -> str | None:
    """Where the pulumi CLI is: on PATH, or built by scripts/pulumi-engine (asked in a
    checkout; from an installed package, looked for in its cache at the SDK's version)."""
    found = shutil.which("pulumi")
    if found:
        return str(Path(found).parent)
    script = ROOT / "scripts" / "pulumi-engine"
    if script.exists():
        done = subprocess.run([str(script), "--path"], capture_output=True, text=True)
        if done.returncode == 0 and done.stdout.strip():
            return done.stdout.strip()
        return None
    try:
        version = importlib.metadata.version("pulumi")
    except importlib.metadata.PackageNotFoundError:  # the pulumi extra is not installed
        return None
    cached = _engine_cache() / f"v{version}" / "bin"
    return str(cached) if os.access(cached / "pulumi", os.X_OK) else None


def _engine_cache() -> Path:
    """Where scripts/pulumi-engine builds the engine (its SPKY_PULUMI_ENGINE_DIR default)."""
    if os.environ.get("SPKY_PULUMI_ENGINE_DIR"):
        return Path(os.environ["SPKY_PULUMI_ENGINE_DIR"])
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "sp00ky" / "pulumi-engine"


def example_payload(schema: dict[str, Any]) -> Any:
    """The smallest instance of a JSON Schema a rehearsal can send: its example or default,
    else the required properties, each from its own example, default, enum or type."""
    for key in ("example", "default", "const"):
        if key in schema:
            return schema[key]
    if schema.get("examples"):
        return schema["examples"][0]
    if schema.get("enum"):
        return schema["enum"][0]
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        props = schema.get("properties", {})
        return {name: example_payload(props.get(name, {})) for name in schema.get("required", [])}
    if kind == "array":
        return [example_payload(schema.get("items", {})) for _ in range(schema.get("minItems", 0))]
    if kind == "string":
        return "rehearsal".ljust(int(schema.get("minLength", 0)), "x")
    if kind in ("number", "integer"):
        return schema.get("minimum", 0)
    if kind == "boolean":
        return False
    return None


def first_route(spec_path: str) -> tuple[str, dict[str, Any]]:
    """The spec's first POST route and its JSON request body's schema."""
    spec = yaml.safe_load(Path(spec_path).read_text())
    for path, operations in (spec.get("paths") or {}).items():
        post = (operations or {}).get("post")
        if post is None:
            continue
        content = ((post.get("requestBody") or {}).get("content") or {}).get("application/json")
        return path, (content or {}).get("schema") or {}
    raise RehearseError(f"{spec_path} has no POST route: pass --route and --payload")


class Rehearsal:
    def __init__(
        self,
        config_path: str | Path,
        *,
        jobs: int = 5,
        backend: str | None = None,
        route: str | None = None,
        payload: Any = None,
        timings: str = DEFAULT_TIMINGS,
        timeout: float = 900.0,
        workdir: str | Path | None = None,
        progress: Progress = _say,
        path: str | None = None,
    ) -> None:
        self.config_path = Path(config_path).resolve()
        self.path = path  # an image path (phases.PATHS); None: the pools' own images
        self._config_file = self.config_path  # what this run reads: the path's copy, if any
        self._project = f"rehearse-{secrets.token_hex(3)}"
        self.jobs = jobs
        self.backend = backend
        self.route = route
        self.payload = payload
        self.timings = timings
        self.timeout = timeout
        self.workdir = Path(workdir) if workdir else None
        self.say = progress
        self._seen: dict[str, str] = {}
        self._reports: dict[str, MachineReport] = {}
        self._readings: dict[str, Reading] = {}
        self._healthchecks: dict[str, str | None] = {}
        self._unmeasured_install = False  # an image without Docker rehearsed with it
        self._consoles: Path | None = None  # where a failed machine's console is kept

    # --- the whole rehearsal ----------------------------------------------------------------

    def prepare(self) -> tuple[Config, list[str], str]:
        """The config, its Hetzner pools and the pulumi CLI's folder; RehearseError when the
        rehearsal cannot run at all."""
        try:
            config = load_config(self.config_path)
        except ConfigError as exc:
            raise RehearseError(f"{self.config_path}: {exc}") from exc
        pools = [name for name, pool in config.pools.items() if pool.provider == "hetzner"]
        if not pools:
            raise RehearseError(
                f"{self.config_path} has no pool with provider: hetzner; a rehearsal runs the "
                "production path (Hetzner servers made by pulumi up)"
            )
        engine = pulumi_bin()
        if engine is None:
            raise RehearseError(
                "the pulumi CLI is not on PATH: install it (https://www.pulumi.com/docs/install/"
                "), or build it with scripts/pulumi-engine in a checkout of sp00ky-infra"
            )
        return config, pools, engine

    def run(self) -> RehearsalReport:
        started = time.monotonic()
        config, pools, engine = self.prepare()
        image = ensure_image(progress=lambda line: self.say(f"machine image: {line}"))
        work = self.workdir or Path(tempfile.mkdtemp(prefix="sp00ky-rehearse-"))
        work.mkdir(parents=True, exist_ok=True)
        report = RehearsalReport(str(self.config_path), pools, workdir=str(work), path=self.path)
        self._healthchecks = {p: config.backend_for(p).deploy.healthcheck for p in pools}
        self._consoles = work / "consoles"
        report.cloud = self._static_checks(config, pools)
        booter = self._booter(config, pools, image, report)
        self.say(f"working in {work}")
        with FakeHetzner(boot=booter) as cloud:
            try:
                config = self._take_path(config, pools)
                for name in pools:  # a pool's own snapshot, which only its project has
                    if config.pools[name].machine.image != BAKED:  # the controller bakes it
                        cloud.stand_in(config.pools[name].machine.image)
                self._rehearse(config, pools, engine, booter, cloud, work, report)
            finally:
                if self._config_file != self.config_path:
                    self._config_file.unlink(missing_ok=True)
        self._verdict(report)
        report.elapsed = time.monotonic() - started
        return report

    def _images(self, config: Config, pools: list[str]) -> dict[str, str]:
        """Each pool's ``machine.image`` on this run: its path's, else its own."""
        if self.path is None:
            return {name: config.pools[name].machine.image for name in pools}
        return dict.fromkeys(pools, PATH_IMAGES[self.path])

    def _take_path(self, config: Config, pools: list[str]) -> Config:
        """The config this run rehearses: the user's, or its path's copy (a baked path's
        snapshots are the controller's to bake, waited for before the burst)."""
        if self.path is None:
            return config
        self._config_file = path_config(self.config_path, self._images(config, pools))
        try:
            return load_config(self._config_file)
        except ConfigError as exc:
            raise RehearseError(f"path {self.path}: {exc}") from exc

    def _booter(
        self, config: Config, pools: list[str], image: str, report: RehearsalReport
    ) -> Booter:
        """The servers' booter: an image without Docker boots the rehearsal variant without
        it when that is built (``scripts/rehearsal-image --without-docker``), else the
        rehearsal image; the findings say which, and the estimate adds the install then."""
        chosen = self._images(config, pools)  # the path's, when one is rehearsed
        baked = [name for name, image in chosen.items() if image == BAKED]
        report.cloud.extend(
            f"{name}: machine.image baked: its snapshot is baked before the burst and its "
            "machines boot it; here a bake server's container is committed, on Hetzner a "
            f"server's disk is snapshotted, so bake_seconds is this host's. {SNAPSHOT_NOTE}"
            for name in baked
        )
        chosen = {name: image for name, image in chosen.items() if name not in baked}
        bare = sorted({i for i in chosen.values() if has_docker(i) is False})
        variant = Recipe().without_docker().tag
        built = bool(bare) and image_exists(variant)
        report.cloud.extend(image_notes(chosen, installs_here=built))
        self._unmeasured_install = bool(bare) and not built
        return Booter(image, images=dict.fromkeys(bare, variant) if built else {})

    def _rehearse(
        self, config: Config, pools: list[str], engine: str, booter: Booter,
        cloud: FakeHetzner, work: Path, report: RehearsalReport,
    ) -> None:  # fmt: skip
        env = self._pulumi_env(engine, work)
        project = self._stack(work, env)
        store_url = f"sqlite:///{work}/state.db"
        port = _free_port(booter.gateway)
        controller_env = {
            **env,
            "SPKY_CONFIG": str(self._config_file),
            "SPKY_STORE": store_url,
            "SPKY_POOL_PROVIDER": "pulumi",
            "SPKY_PULUMI_STACK": "prod",
            "SPKY_PULUMI_DIR": str(project),
            "SPKY_PROJECT": self._project,
            "SPKY_POOL_HOST": booter.gateway,
            "SPKY_POOL_PORT": str(port),
            "SPKY_POOL_PUBLIC_URL": f"http://{booter.gateway}:{port}",
            "SPKY_POOL_SECRET": secrets.token_hex(32),
            "SPKY_ADMIN_TOKEN": secrets.token_hex(16),
            "SPKY_ADMIN_HOST": "127.0.0.1",
            "SPKY_ADMIN_PORT": "0",
            "SPKY_POOL_TIMINGS": self.timings,
            "SPKY_BILLING_HOUR": BILLING_HOUR,
            "HCLOUD_TOKEN": TOKEN,
            "HCLOUD_ENDPOINT": cloud.url,
            "PYTHONUNBUFFERED": "1",
        }
        self.say(
            f"starting the controller (pulumi provisioner, stack prod, timings {self.timings})"
        )
        log = (work / "controller.log").open("a")
        proc = subprocess.Popen(
            [sys.executable, "-m", "sp00ky_infra", "controller"], cwd=work, env=controller_env,
            stdout=subprocess.PIPE, stderr=log, text=True,
        )  # fmt: skip
        try:
            self._wait_listening(proc, work)
            self._wait_baked(config, pools, work / "controller.log", report)
            self._burst(config, store_url, pools)
            self._watch(config, store_url, pools, booter, cloud, report)
            report.guardian.append(self._guardian(cloud, "after the pool went back to zero"))
        finally:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
            log.close()
        report.machines = list(self._reports.values())

    # --- set-up ---------------------------------------------------------------------------

    def _pulumi_env(self, engine: str, work: Path) -> dict[str, str]:
        (work / "state").mkdir(exist_ok=True)
        (work / "pulumi-home").mkdir(exist_ok=True)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.update(
            {
                "PATH": f"{engine}{os.pathsep}{os.environ.get('PATH', '')}",
                "PULUMI_BACKEND_URL": f"file://{work / 'state'}",
                "PULUMI_CONFIG_PASSPHRASE": secrets.token_hex(16),
                "PULUMI_HOME": str(work / "pulumi-home"),
                "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
                "PULUMI_SKIP_UPDATE_CHECK": "true",
            }
        )
        return env

    def _stack(self, work: Path, env: dict[str, str]) -> Path:
        """This project's Pulumi program in the working directory, run with this Python, and
        a ``prod`` stack of its own: provider hetzner, the user's sp00ky.yml."""
        try:
            program, pulumi_yaml = shipped("__main__.py"), shipped("Pulumi.yaml")
        except NotShipped as exc:
            raise RehearseError(f"the Pulumi program: {exc}") from exc
        project = work / "project"
        (project / "stacks").mkdir(parents=True, exist_ok=True)
        meta = yaml.safe_load(pulumi_yaml.read_text())
        meta["runtime"]["options"]["virtualenv"] = sys.prefix
        (project / "Pulumi.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
        shutil.copy(program, project / "__main__.py")

        def pulumi(*args: str) -> None:
            done = subprocess.run(
                ["pulumi", *args, "--stack", "prod", "--non-interactive"],
                cwd=project, env=env, capture_output=True, text=True,
            )  # fmt: skip
            if done.returncode != 0:
                raise RehearseError(f"pulumi {' '.join(args)} failed: {done.stderr.strip()}")

        self.say("creating the prod stack (file:// state in the working directory)")
        subprocess.run(
            ["pulumi", "stack", "init", "prod", "--non-interactive"], cwd=project, env=env,
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        pulumi("config", "set", "sp00ky:provider", "hetzner")
        pulumi("config", "set", "sp00ky:configFile", str(self._config_file))
        return project

    def _wait_listening(self, proc: subprocess.Popen[str], work: Path) -> None:
        assert proc.stdout is not None
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            if LISTENING.search(line):
                self.say(line.strip())
                return
        tail = (work / "controller.log").read_text()[-3000:]
        raise RehearseError(f"the controller did not start:\n{tail}")

    def _wait_baked(
        self, config: Config, pools: list[str], log: Path, report: RehearsalReport
    ) -> None:
        """Before the burst: each baked pool's bake done (the controller's log says so), so
        that the burst's machines boot its snapshot; its duration kept apart from theirs."""
        baked = [p for p in pools if config.pools[p].machine.image == BAKED]
        if baked:
            self.say(
                f"waiting for the bake of {', '.join(baked)} (at most {BAKE_WAIT_SECONDS:.0f}s)"
            )
        deadline = time.monotonic() + BAKE_WAIT_SECONDS
        while baked and time.monotonic() < deadline:
            for outcome in filter(None, map(parse_outcome, log.read_text().splitlines())):
                if outcome.pool not in baked:
                    continue
                baked.remove(outcome.pool)
                # bakes run side by side: the burst waited for the longest
                report.bake_seconds = max(report.bake_seconds or 0.0, round(outcome.seconds, 1))
                if outcome.snapshot is None:
                    report.failed.append(f"{outcome.pool}: its bake failed at step "
                                         f"{outcome.step}: {outcome.reason}")  # fmt: skip
                self.say(f"{outcome.pool}: " + ("baked" if outcome.snapshot else "bake failed")
                         + f" in {outcome.seconds:.1f}s")  # fmt: skip
            time.sleep(1.0)
        for pool in baked:
            report.failed.append(f"{pool}: its bake did not end within {BAKE_WAIT_SECONDS:.0f}s")

    def _burst(self, config: Config, store_url: str, pools: list[str]) -> None:
        client = Client(store_url, self._config_file)
        try:
            backends = [config.backend_for(pool) for pool in pools]
            if self.backend:
                backends = [b for b in backends if b.name == self.backend]
                if not backends:
                    raise RehearseError(f"--backend {self.backend}: no Hetzner pool runs it")
            for backend in backends:
                route, payload = self.route, self.payload
                if route is None:
                    if not backend.spec:
                        raise RehearseError(
                            f"backend {backend.name} has no spec: pass --route and --payload"
                        )
                    route, schema = first_route(str(Path(config.root, backend.spec)))
                    payload = example_payload(schema) if payload is None else payload
                for _ in range(self.jobs):
                    client.run(backend.name, route, payload if payload is not None else {})
                self.say(f"queued {self.jobs} job(s): {backend.name} POST {route}")
        finally:
            client.close()

    # --- watching -------------------------------------------------------------------------

    def _watch(
        self, config: Config, store_url: str, pools: list[str], booter: Booter,
        cloud: FakeHetzner, report: RehearsalReport,
    ) -> None:  # fmt: skip
        store = open_store(store_url)
        deadline = time.monotonic() + self.timeout
        guarded = False
        try:
            while time.monotonic() < deadline:
                jobs = {k: v for k, v in store.counts().items() if v}
                report.jobs = jobs
                machines = [m for pool in pools for m in store.machines.recent(pool, limit=200)]
                for machine in machines:
                    self._follow(machine, booter, cloud)
                live = [m for m in machines if m.destroyed_at is None and m.state != "failed"]
                ready = [m for m in live if m.state == "ready"]
                servers = len(cloud.servers)
                incidents = [i for i in store.pools.incidents() if i.closed_at is None]
                if ready and not guarded:
                    # the guardian while machines run: a live controller's machines are kept.
                    # Taken while one is ready, busy or not: a burst can end between two looks
                    report.guardian.append(self._guardian(cloud, "while the machines ran"))
                    guarded = True
                pending = jobs.get("pending", 0) + jobs.get("processing", 0)
                if not pending and not live and not servers:
                    self.say("every job finished and the pools are back to zero")
                    break
                if incidents and not live and not servers:
                    report.incidents = [f"{i.pool}: {i.kind}: {i.message}" for i in incidents]
                    self.say(f"incident: {report.incidents[0]}")
                    break
                time.sleep(0.5)
            else:
                report.failed.append(
                    f"the rehearsal did not settle within {self.timeout:.0f}s: jobs {report.jobs}, "
                    f"{len(cloud.servers)} server(s) left"
                )
            now = time.time()
            report.breaker_open = [p for p in pools if store.pools.state(p).breaker.is_open(now)]
            report.incidents = report.incidents or [
                f"{i.pool}: {i.kind}: {i.message}" for i in store.pools.incidents()
            ]
        finally:
            store.close()

    def _follow(self, machine: Machine, booter: Booter, cloud: FakeHetzner) -> None:
        """Say what changed; read a booting machine's server now and then (a failed boot is
        destroyed in the tick that fails it, so its server may be gone by the next look), and
        report each machine once it is ready or has failed, from the freshest reading."""
        state = machine.state
        changed = self._seen.get(machine.name) != state
        if changed:
            self._seen[machine.name] = state
            why = f" ({machine.failed_reason})" if machine.failed_reason else ""
            self.say(f"{machine.name}: {state}{why if state in ('failed', 'destroyed') else ''}")
        if machine.name in self._reports:
            return
        ready = machine.ready_at is not None
        done = ready or machine.failed_reason is not None or machine.destroyed_at is not None
        server = next((s for s in cloud.servers.values() if s["name"] == machine.name), None)
        last = self._readings.get(machine.name)
        due = last is None or changed or time.monotonic() - last.at >= READ_EVERY_SECONDS
        if server is not None and (done or due):
            self._readings[machine.name] = read_server(
                booter, server["id"], console=not ready, last=last
            )
        if not done:
            return
        reading = self._readings.get(machine.name) or Reading(time.monotonic())
        report = MachineReport(
            machine.name, machine.pool, server["id"] if server else None,
            "ready" if ready else "failed", failed_reason=machine.failed_reason,
            console=reading.console,
        )  # fmt: skip
        report.phases = phases(machine, reading.timeline, reading.events)
        report.events = sorted(reading.events, key=reading.events.__getitem__)
        report.downloads = downloads(reading.events, reading.bootstrap)
        if ready:
            assert machine.ready_at is not None
            report.created_to_ready = round(machine.ready_at - machine.created_at, 2)
        else:
            healthcheck = self._healthchecks.get(machine.pool)
            report.cause = cause(machine, reading.timeline, reading.events, healthcheck)
            if reading.console and self._consoles is not None:
                self._consoles.mkdir(exist_ok=True)
                (self._consoles / f"{machine.name}.log").write_text(reading.console)
        self._reports[machine.name] = report

    def _guardian(self, cloud: FakeHetzner, when: str) -> dict[str, Any]:
        result = run_pass(HetznerAPI(TOKEN, cloud.url), time.time())
        self.say(
            f"guardian pass {when}: {result.servers} server(s), destroyed {len(result.destroyed)}"
        )
        return {"when": when, **result.as_json()}

    # --- judging --------------------------------------------------------------------------

    def _static_checks(self, config: Config, pools: list[str]) -> list[str]:
        notes = []
        size = len(user_data("render-abcdef", "https://pool.example.com", "x" * 200).encode())
        notes.append(
            f"user-data is {size} bytes of Hetzner's {USER_DATA_LIMIT}"
            + (" (close to the limit)" if size > USER_DATA_LIMIT * 0.85 else "")
        )
        public = os.environ.get("SPKY_POOL_PUBLIC_URL", "")
        if not public.startswith("https://"):
            notes.append(
                "SPKY_POOL_PUBLIC_URL is "
                + (repr(public) if public else "not set here")
                + ": in the cloud the machines dial the controller at that URL, from the "
                "internet; make it an https:// address Hetzner's servers can reach"
            )
        for name in pools:
            backend = config.backend_for(name)
            if backend.deploy.image:
                notes.append(
                    f"{name}: deploy.image {backend.deploy.image} is pulled by each machine "
                    "with the controller's registry credentials"
                )
        return notes

    def _verdict(self, report: RehearsalReport) -> None:
        ready = [m for m in report.machines if m.outcome == "ready"]
        failed = [m for m in report.machines if m.outcome != "ready"]
        total = sum(report.jobs.values())
        succeeded = report.jobs.get("success", 0)
        if ready:
            report.worked.append(
                f"{len(ready)} machine(s) made by pulumi up booted from their user-data, "
                "joined the controller and started the backend from its image"
            )
        if total and succeeded == total:
            report.worked.append(f"{succeeded} of {total} job(s) succeeded")
        elif total:
            report.failed.append(f"{succeeded} of {total} job(s) succeeded ({report.jobs})")
        for machine in failed:
            report.failed.append(
                f"{machine.name} failed to boot: {machine.cause or machine.failed_reason}"
            )
        if report.breaker_open or report.incidents:
            report.failed.append(
                "the breaker opened after failed boots: "
                + "; ".join(report.incidents or report.breaker_open)
            )
        destroyed = [g for g in report.guardian if g["destroyed"]]
        if report.guardian and not destroyed:
            report.worked.append(
                f"{len(report.guardian)} guardian pass(es) over the same cloud destroyed nothing"
            )
        for each in destroyed:
            report.failed.append(
                f"the guardian destroyed {len(each['destroyed'])} server(s) {each['when']}"
            )
        if ready and not report.failed:
            report.worked.append("the pools went back to zero and their servers were deleted")
        booted = [m.phases for m in ready]
        report.estimate_basis = {
            "unmeasured_install": self._unmeasured_install,
            "snapshot": self.path in SNAPSHOT_PATHS,
        }
        report.estimate = estimate(booted, **report.estimate_basis)
        figures = estimate_figures(booted, **report.estimate_basis)
        report.estimate_sources = {p: f.source for p, f in figures.items()}
        report.downloads = count_downloads([m.downloads for m in report.machines])


def _free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def rehearse_paths(
    config_path: str | Path, paths: Sequence[str], *, workdir: str | Path | None = None,
    progress: Progress = _say, **options: Any,
) -> dict[str, RehearsalReport]:  # fmt: skip
    """Each image path (phases.PATHS) rehearsed in turn, each in a working folder of its own;
    a path that could not run is reported failed with why. What stops every path (the
    config, the pulumi CLI) raises RehearseError before the first."""
    Rehearsal(config_path).prepare()
    root = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="sp00ky-rehearse-"))
    reports: dict[str, RehearsalReport] = {}
    for number, path in enumerate(paths, 1):
        image = PATH_IMAGES[path] or "the pool's snapshot, baked first"
        progress(f"path {path} ({number} of {len(paths)}): machine.image {image}")

        def say(line: str, path: str = path) -> None:
            progress(f"{path}: {line}")

        rehearsal = Rehearsal(config_path, workdir=root / path, path=path, progress=say, **options)
        try:
            reports[path] = rehearsal.run()
        except RehearseError as exc:
            say(f"could not run: {exc}")
            reports[path] = RehearsalReport(
                str(rehearsal.config_path), [], failed=[f"the path could not run: {exc}"],
                workdir=str(root / path), path=path,
            )  # fmt: skip
    return reports

"""Running a controller: the agents' endpoint and the admin API (uvicorn, one event loop), the
tick (every SPKY_TICK seconds, corrected for drift), and the dispatcher, a thread that wakes
waiting long-polls as soon as the store has work or a kill for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from pathlib import Path

import uvicorn
import uvloop

from sp00ky_infra.config import Config
from sp00ky_infra.config.images import parse_image
from sp00ky_infra.config.loader import load_config
from sp00ky_infra.controller.api_admin import admin_app
from sp00ky_infra.controller.api_agents import agents_app
from sp00ky_infra.controller.baking import start_bakes
from sp00ky_infra.controller.core import Controller
from sp00ky_infra.controller.hub import Hub
from sp00ky_infra.controller.images import ImagesError, ImageServer, PoolImage, settle_images
from sp00ky_infra.controller.leadership import LeaderRecord, state_file, write_leader
from sp00ky_infra.controller.limits import ADMIN_RULES, AGENTS_RULES, InputLimits
from sp00ky_infra.controller.provisioners import (
    HasGateway,
    Provisioner,
    Refused,
    members,
)
from sp00ky_infra.controller.provisioners.by_pool import ByPool
from sp00ky_infra.controller.provisioners.local import LocalProvisioner
from sp00ky_infra.controller.reconcile import TickReport, tick
from sp00ky_infra.controller.registry import RegistryError, Resolver, load_auths
from sp00ky_infra.controller.settings import ControllerSettings, SettingsError
from sp00ky_infra.controller.stopping import progress, release
from sp00ky_infra.store import open_store
from sp00ky_infra.store.dialect import Watcher

log = logging.getLogger("sp00ky.controller")
DISPATCH_INTERVAL_SECONDS = 0.2  # due jobs (delays, backoffs) are noticed at least this often
GRACEFUL_SHUTDOWN_SECONDS = 1  # the longest a request in flight may hold a stop up
DRAIN_POLL_SECONDS = 0.2  # how often a draining stop looks at the running jobs


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # the controller handles signals itself (two-stage shutdown)


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say they are
    # TCP; without it every answer written in two parts waits ~40 ms for a delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # inherited by accepted ones
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise SettingsError(f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    sock.listen(512)
    sock.set_inheritable(False)
    return sock


def make_provisioner(settings: ControllerSettings, config: Config) -> Provisioner:
    """SPKY_POOL_PROVIDER's one provisioner for every pool, else one per provider in use,
    routed per pool (each made once; those made already are closed when one fails)."""
    if settings.provider:
        return _provisioner(settings.provider, settings, config)
    made: dict[str, Provisioner] = {}
    try:
        for kind, pools in settings.serving(config.pools).items():
            made[kind] = _provisioner(kind, settings, config, pools)
    except BaseException:
        for provisioner in made.values():
            provisioner.close()
        raise
    return ByPool(
        {name: made[settings.provisioner_for(pool)] for name, pool in config.pools.items()}
    )


def _provisioner(
    kind: str, settings: ControllerSettings, config: Config, pools: list[str] | None = None
) -> Provisioner:
    """The ``kind`` provisioner (local, docker, pulumi), for ``pools`` (None: every pool)."""
    if kind == "local":
        return LocalProvisioner(Path(settings.state_dir) / "machines")
    if kind == "pulumi":
        return pulumi_provisioner(settings)
    return docker_provisioner(settings, config, config.pools if pools is None else pools)


def docker_provisioner(
    settings: ControllerSettings, config: Config, pools: Iterable[str]
) -> Provisioner:
    """Docker machines, with the images of ``pools``' backends built or pulled."""
    from sp00ky_infra.controller.provisioners.docker import Build, DockerProvisioner, Pull

    docker = DockerProvisioner(settings.docker_network, settings.project or "dev")
    sources: dict[str, Build | Pull] = {}
    try:
        auths = load_auths(settings.registry_auth)
    except RegistryError as exc:
        raise SettingsError(str(exc)) from exc
    for pool in pools:
        backend = config.backend_for(pool)
        if backend.deploy.image:  # a registry image wins over a dockerfile, as on VMs
            reference = parse_image(backend.deploy.image)
            auth = auths.get(reference.registry)
            sources[backend.name] = Pull(str(reference), auth.as_dict() if auth else None)
        else:
            dockerfile = config.resolve(backend.deploy.dockerfile or "Dockerfile")
            sources[backend.name] = Build(dockerfile, str(Path(dockerfile).parent))
    docker.prepare(sources)
    return docker


def settle(
    settings: ControllerSettings, config: Config
) -> tuple[dict[str, PoolImage], ImageServer | None]:
    """Each pool's image, once per deploy, when machines fetch it (settings.settles_images):
    registry tags resolved to digests, dockerfile images built here and served. ImagesError
    (the start is refused) names the pool and what to set."""
    if not settings.settles_images(config.pools):
        return {}, None
    server, no_engine = None, ""
    if any(not config.backend_for(pool).deploy.image for pool in config.pools):
        try:
            server = ImageServer.connect(settings.project or "dev")
        except ImagesError as exc:
            no_engine = str(exc)
    resolver = Resolver(load_auths(settings.registry_auth))
    try:
        return settle_images(config, resolver, server, no_engine), server
    except Exception:
        if server is not None:
            server.close()
        raise


def pulumi_provisioner(settings: ControllerSettings) -> Provisioner:
    """The stack's machines, with the stack made to say what this controller says: one
    project (the machines' label and the guardian's heartbeat), one pool URL, one secret."""
    from sp00ky_infra.controller.provisioners.pulumi import PulumiProvisioner, automation_stack

    if not settings.project:
        raise SettingsError(
            "SPKY_PROJECT is not set: the stack labels its machines with the project, and the "
            "guardian reads this controller's heartbeat under the same name. Set it"
        )
    stack, folder = settings.pulumi_stack, settings.pulumi_dir
    provisioner = PulumiProvisioner(lambda: automation_stack(stack, folder))
    try:
        provisioner.pin(
            {
                "sp00ky:project": settings.project,
                "sp00ky:poolUrl": settings.agents_url,
                "sp00ky:poolSecret": settings.secret,
            }
        )
    except Refused as exc:
        provisioner.close()
        raise SettingsError(f"stack {stack} ({folder}): {exc}") from exc
    return provisioner


def _served_settings(settings: ControllerSettings, provisioner: Provisioner) -> ControllerSettings:
    """What the provisioners say of this host: where machine containers reach it (their
    network's gateway: listen there, unless told where), and a stack's sp00ky:provider."""
    for member in members(provisioner):
        if isinstance(member, HasGateway) and settings.pool_host == "127.0.0.1":
            settings = replace(settings, pool_host=member.gateway())
        runs_on = getattr(member, "runs_on", None)  # a pulumi stack's sp00ky:provider
        if isinstance(runs_on, str):
            settings = replace(settings, stack_provider=runs_on)
    return settings


class Dispatcher(threading.Thread):
    """Wakes the long-polls of pools that have due work, and machines with a kill to deliver.

    On an embedded store (SQLite) the event loop takes the other processes' wake-ups itself
    (``listen``) and looks at once: a job written reaches the poll that claims it without a
    thread in between (that hand-off was a fifth of a job's dispatch). This thread then only
    reads for changes every few milliseconds, for a wake-up lost or never sent, and for jobs
    that come due."""

    def __init__(self, controller: Controller, hub: Hub) -> None:
        super().__init__(name="dispatcher", daemon=True)
        self.controller = controller
        self.hub = hub
        self._halt = threading.Event()
        self._listener: Watcher | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def listen(self, loop: asyncio.AbstractEventLoop) -> None:
        """Before ``start()``, in ``loop``: take the wake-ups there, if the store is embedded
        (its reads take microseconds, so the loop may make them) and sends them."""
        store = self.controller.store
        if not store.embedded:
            return
        watcher = store.watch()
        fd = watcher.fileno()
        if fd is None:
            watcher.close()
            return
        loop.add_reader(fd, self._woken)
        self._listener, self._loop = watcher, loop

    def _woken(self) -> None:
        """Wake-ups that name the tables with work due wake those pools' polls with no read
        of the store (they run in the loop's next pass); any other looks at every waiting
        pool, then, after the polls it woke, for kills."""
        assert self._listener is not None and self._loop is not None
        due = self._listener.drain()
        if not self.controller.leader:
            return
        try:
            self.wake_pools(due)
        except Exception:  # the thread's next look finds it, or the tick's
            log.exception("dispatcher: cannot read the store")
        if due is None:
            self._loop.call_soon(self._woken_kills)

    def _woken_kills(self) -> None:
        if self.controller.leader:
            try:
                self.wake_cancelling()
            except Exception:
                log.exception("dispatcher: cannot read the store")

    def run(self) -> None:
        store = self.controller.store
        watcher = store.watch(wakeups=self._listener is None)
        try:
            while not self._halt.is_set():
                changed = watcher.wait(DISPATCH_INTERVAL_SECONDS)
                if not self.controller.leader:
                    continue
                try:
                    self.dispatch(changed)
                except Exception:  # the store may be briefly unreachable: try again
                    log.exception("dispatcher: cannot read the store")
                    self._halt.wait(1.0)
        finally:
            watcher.close()

    def dispatch(self, changed: bool) -> None:
        self.wake_pools()
        if changed:
            self.wake_cancelling()

    def wake_pools(self, due: frozenset[str] | None = None) -> None:
        """Wake the held polls of every pool with work due: of the pools whose tables are
        ``due``, or, without it, of those the store has due work for."""
        controller, now = self.controller, self.controller.clock()
        for pool in self.hub.waiting_pools():
            if pool not in controller.pools or controller.pool_states.paused(pool):
                continue
            table = controller.table_of(pool)
            if table in due if due is not None else controller.store.queued(table, now, 1):
                self.hub.notify_pool(pool)

    def wake_cancelling(self) -> None:
        """Wake the held polls of machines with a kill to deliver."""
        for machine in self.controller.store.cancelling_machines():
            self.hub.notify_machine(machine)

    def stop(self) -> None:
        """Stop listening (from the loop ``listen`` was given) and ask the thread to end."""
        if self._listener is not None and self._loop is not None:
            fd = self._listener.fileno()
            if fd is not None:
                self._loop.remove_reader(fd)
            self._listener.close()
            self._listener = None
        self._halt.set()


class Runtime:
    """A controller with its listeners bound: ``serve()`` until ``stop()``."""

    def __init__(
        self,
        settings: ControllerSettings,
        fresh: bool = False,
        provisioner: Provisioner | None = None,
    ) -> None:
        """``fresh`` (``dev``): remove every machine an earlier run left, live in the
        store or not; otherwise the live ones keep running and reconnect. ``provisioner``:
        made from the settings unless given (a benchmark's own)."""
        settings = settings.with_secrets()
        config = load_config(settings.config_path)
        if provisioner is None:  # its settings are checked first
            provisioner = make_provisioner(settings, config)
        try:
            images, image_server = settle(settings, config)
            bakes = start_bakes(settings, config, provisioner, images, image_server)
        except Exception:
            provisioner.close()
            raise
        settings = _served_settings(settings, provisioner)
        self.agents_socket = bind(settings.pool_host, settings.pool_port)
        self.admin_socket = bind(settings.admin_host, settings.admin_port)
        settings = replace(
            settings,
            pool_port=self.agents_socket.getsockname()[1],
            admin_port=self.admin_socket.getsockname()[1],
        )
        store = open_store(settings.store_url)
        store.checkpoint_in_background()  # SQLite: its checkpoints off the dispatch path
        self.controller = Controller(
            settings, config, store, provisioner, images=images, image_server=image_server
        )
        self.settings = settings
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._requested = threading.Event()  # a stop asked for before serve() began
        self._draining = False
        self.aborted = False
        self._owned: bool | None = None
        self.controller.on_leadership.append(self._leadership_changed)
        if bakes is not None:  # baked pools' snapshots, made by the leader
            self.controller.on_leadership.append(bakes.on_leadership)
        # Machines an earlier run left that the store does not know as live (all, ``fresh``)
        # are removed: say so. (The live ones are handed to the provisioner when this
        # controller starts leading: Controller.lead.) Only a leader does: a standby never
        # touches machines, which belong to the controller that leads.
        if self.controller.lead():
            self.controller.executor.reap(self.controller.clock(), keep_live=not fresh)

    @property
    def listen_url(self) -> str:
        """Where the agents' endpoint listens (SPKY_POOL_PUBLIC_URL may front it)."""
        return f"http://{self.settings.pool_host}:{self.settings.pool_port}"

    @property
    def admin_url(self) -> str:
        return f"http://{self.settings.admin_host}:{self.settings.admin_port}"

    def write_state(self) -> Path:
        """Where the CLI finds the leader's admin API (``.sp00ky/controller.json``): written
        by the leader only (and again whenever this controller gains leadership), so a
        standby never sends the CLI's admin writes to itself."""
        if not self.controller.leader:
            return state_file(self.settings.state_dir)
        return write_leader(
            self.settings.state_dir,
            LeaderRecord(
                role="leader",
                controller_id=self.settings.controller_id,
                pid=os.getpid(),
                admin_url=self.admin_url,
                agents_url=self.settings.agents_url,
            ),
        )

    def _leadership_changed(self, leader: bool) -> None:
        if leader:
            self.write_state()

    def stop(self) -> None:
        """Ask ``serve()`` to return at once (safe from any thread or a signal handler): held
        long-polls are answered, the listeners close; machines are left as they are."""
        self._requested.set()
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)

    def drain(self) -> None:
        """A draining stop (``dev``'s first Ctrl-C): nothing new is claimed or created, and
        ``serve()`` returns once the jobs running on machines have ended."""
        self._draining = True
        self.stop()

    def abort(self) -> None:
        """Stop now, a drain in progress included (``dev``'s second Ctrl-C)."""
        self.aborted = True
        self.stop()

    @property
    def owns_machines(self) -> bool:
        """Whether this controller led its store when it stopped (while serving: leads)."""
        return self._owned if self._owned is not None else self.controller.leader

    def run(
        self,
        on_tick: Callable[[TickReport], None] | None = None,
        on_progress: Callable[[str], None] | None = None,
    ) -> None:
        """``serve`` on a uvloop event loop (libuv's: less CPU a request than asyncio's)."""
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(self.serve(on_tick, on_progress))

    async def serve(
        self,
        on_tick: Callable[[TickReport], None] | None = None,
        on_progress: Callable[[str], None] | None = None,
    ) -> None:
        """Serve until ``stop()`` (or ``drain()``, which first waits for the running jobs,
        telling ``on_progress`` what is left). On the way out the controller resigns and the
        held long-polls are answered at once: the stop takes no longer than the last
        request in flight (bounded by GRACEFUL_SHUTDOWN_SECONDS)."""
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        if self._requested.is_set():
            self._stop.set()
        controller = self.controller
        hub = Hub(self._loop, controller.packs)
        controller.wake.attach(hub)
        servers = _servers(controller, hub)
        serving = [
            asyncio.create_task(server.serve(sockets=[sock]))
            for server, sock in zip(servers, (self.agents_socket, self.admin_socket), strict=True)
        ]
        dispatcher = Dispatcher(controller, hub)
        dispatcher.listen(self._loop)
        dispatcher.start()
        ticking = asyncio.create_task(self._tick_forever(on_tick))
        try:
            await self._stop.wait()
            await asyncio.gather(ticking, return_exceptions=True)  # ends its tick, then returns
            if self._draining and controller.leader and not self.aborted:
                await self._drain(on_progress)
        finally:
            ticking.cancel()
            self._owned = controller.leader
            controller.resign()  # agents' calls now answer 503, as a standby's do
            hub.close()
            for server in servers:
                server.should_exit = True
            dispatcher.stop()
            await asyncio.gather(*serving, ticking, return_exceptions=True)
            dispatcher.join(timeout=5)

    async def _drain(self, on_progress: Callable[[str], None] | None) -> None:
        """Serve the machines' polls and results, binding nothing new, until no job runs."""
        controller = self.controller
        controller.pool_states.hold()
        said = ""
        while not self.aborted:
            try:
                left = await asyncio.to_thread(progress, controller.store, controller.clock())
            except Exception:  # the store is briefly unreachable: look again
                log.exception("stopping: cannot read the store")
                await asyncio.sleep(DRAIN_POLL_SECONDS)
                continue
            line = left.line()
            if line != said and on_progress is not None:
                on_progress(line)
            said = line
            if left.running == 0:
                return
            await asyncio.sleep(DRAIN_POLL_SECONDS)

    def release_attempts(self) -> list[str]:
        """An aborted stop: the attempts running on the live machines back to the queue at
        once, without spending a retry (only for a controller that owns its machines)."""
        if not self.owns_machines:
            return []
        store = self.controller.store
        machines = [machine.name for machine in store.machines.live()]
        return release(store, machines, self.controller.clock())

    async def _tick_forever(self, on_tick: Callable[[TickReport], None] | None) -> None:
        assert self._loop is not None and self._stop is not None
        interval = self.settings.tick
        next_at = self._loop.time()
        while not self._stop.is_set():
            try:
                report = await asyncio.to_thread(tick, self.controller)
            except Exception:
                log.exception("tick failed; trying again next tick")
            else:
                if on_tick is not None:
                    on_tick(report)
            next_at = max(next_at + interval, self._loop.time())  # no burst after a slow tick
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), timeout=next_at - self._loop.time())

    def destroy_machines(self) -> int:
        """Destroy every live machine, all at once (``dev`` on Ctrl-C leaves no process)."""
        return self.controller.executor.shutdown(self.controller.clock())

    def close(self) -> None:
        lock = self.controller.leader_lock
        lock.release()
        self.controller.provisioner.close()
        if self.controller.image_server is not None:
            self.controller.image_server.close()
        self.controller.store.close()
        for sock in (self.agents_socket, self.admin_socket):
            sock.close()


def _servers(controller: Controller, hub: Hub) -> list[_Server]:
    """The agents' and the admin listeners' uvicorn servers, each behind its input limits."""
    servers = [
        _Server(
            uvicorn.Config(
                app,
                log_level="warning",
                lifespan="off",
                access_log=False,
                http="httptools",  # C parser: h11's pure Python was a fifth of a poll
                loop="none",  # run(): uvloop
                # Nothing reads a client's address (no X-Forwarded-* to trust: one ASGI
                # layer less a request), and no "server: uvicorn" to tell the world or
                # for each agent to parse on every poll.
                proxy_headers=False,
                server_header=False,
            )
        )
        for app in (
            InputLimits(agents_app(controller, hub), AGENTS_RULES),
            InputLimits(admin_app(controller), ADMIN_RULES),
        )
    ]
    for server in servers:  # a backstop: held polls end at once on their own (hub.close)
        server.config.timeout_graceful_shutdown = GRACEFUL_SHUTDOWN_SECONDS
    return servers

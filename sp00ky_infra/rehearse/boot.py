"""Boot mode: each server the fake cloud creates really boots, as a container.

A server is a container of the rehearsal image (``image.py``) with what ``--privileged``
gives (below), named after the server, on a Docker network of this cloud's own, with
systemd as PID 1. Its user-data and meta-data (``instance-id`` = the server's id,
``local-hostname`` = its name) are written into the NoCloud seed
(``/var/lib/cloud/seed/nocloud``) before the container starts, so cloud-init's generator
finds a datasource at boot and runs its stages in systemd's order: ``cloud-init-local``,
``cloud-init`` (network), ``cloud-config``, ``cloud-final``.

Which rehearsal image a server boots follows the Hetzner image it was created from
(``images``: image name or id -> rehearsal image; ``image`` for every other): an image
with Docker (``docker-ce``, the default) boots the rehearsal image, which has Docker too; one
without (``debian-12``) boots the variant without Docker when it is built, so its boot
installs docker.io as it would on Hetzner.

A snapshot (create_image) is the server's container committed, with a copy of its Docker
engine's disk (a volume, which a commit leaves out) in a volume of its own; a server created
from it starts from the committed image, that disk copied onto its own first, so its engine
has the images the snapshot's had, and it boots as a new instance (a new instance-id).

Why this is faithful to a Hetzner VM: the same user-data byte for byte, read by the same
cloud-init (Debian 12's) through the same modules and stages, ordered by the same systemd
units (so ``runcmd`` runs in ``cloud-final``, and a unit it starts waits for what it says it
waits for: ``network-online.target``); a fresh Docker engine of the
server's own (its storage a volume of its own), empty until the agent fetches the backend's
image; a machine-id and SSH host keys made at first boot; an address of its own that reaches
the controller only by dialling out, as a firewalled VM does. What differs: the datasource
(NoCloud's seed, not Hetzner's metadata service), the kernel (the host's, shared), the
network (Docker's bridge; no Hetzner firewall: nothing here dials in anyway), the hostname
(set by Docker to the server's name, as Hetzner's metadata would have cloud-init set it),
a power-off stops the container rather than a VM, and where the host's dockerd lacks a
capability the server lacks it too (here CAP_SYS_RESOURCE: dbus logs that it cannot raise its
file limit; nothing else noticed).

How systemd (and the inner dockerd) boot in Docker 20.10 on a cgroup v1 host, ``RUN``: what
``--privileged`` gives, spelled out, because ``--privileged`` asks for every capability and
fails ("unable to apply caps") where dockerd itself lacks one (here CAP_SYS_RESOURCE): every
capability but that one, no seccomp or AppArmor profile, ``/proc`` unmasked and writable
(``systempaths=unconfined``: the inner dockerd sets sysctls), every device allowed to the
device cgroup (the inner engine's containers get theirs), the host's cgroup namespace with
``/sys/fs/cgroup`` bound read-write (cgroup v1 has no private hierarchy: systemd makes its
own below the container's cgroup, as the inner dockerd does), tmpfs at ``/run``,
``/run/lock`` and ``/tmp`` (systemd expects them fresh at boot), and SIGRTMIN+3 as the stop
signal, systemd's clean halt.
"""

from __future__ import annotations

import contextlib
import io
import ipaddress
import json
import secrets
import tarfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import docker
from docker.errors import APIError, DockerException, NotFound
from docker.models.containers import Container

from sp00ky_infra import engine
from sp00ky_infra.rehearse.errors import BootError
from sp00ky_infra.rehearse.phases import Timeline

ROLE = "sp00ky-rehearse/role"  # server | network | snapshot
CLOUD = "sp00ky-rehearse/cloud"  # the fake cloud's id: one per FakeHetzner
SERVER = "sp00ky-rehearse/server"  # the server's id
DOCKER_DISK = "/var/lib/docker"  # the inner engine's storage: a volume, not in a commit
SEED = "var/lib/cloud/seed/nocloud"
TMPFS = {
    "/run": "rw,nosuid,nodev,mode=755",
    "/run/lock": "rw,nosuid,nodev,noexec",
    "/tmp": "rw,nosuid,nodev",
}
RUN: dict[str, Any] = {  # the host config (``docker run`` options in the module docstring)
    "cap_add": ["ALL"],
    "cap_drop": ["SYS_RESOURCE"],
    "security_opt": ["seccomp=unconfined", "apparmor=unconfined"],
    "device_cgroup_rules": ["a *:* rwm"],
    "cgroupns": "host",
    "binds": {"/sys/fs/cgroup": {"bind": "/sys/fs/cgroup", "mode": "rw"}},
    "tmpfs": TMPFS,
}
# ``--security-opt systempaths=unconfined`` is the CLI's: the API's is these two, empty
UNMASKED: dict[str, list[str]] = {"MaskedPaths": [], "ReadonlyPaths": []}
STOP_SIGNAL = "SIGRTMIN+3"  # systemd's clean halt
STOP_SECONDS = 10  # a graceful shutdown's grace before the container is killed
REMOVAL_SECONDS = 60  # a removal a server's DELETE began: how long its cloud's exit waits

Started = Callable[[int], None]
Failed = Callable[[int, str], None]


@dataclass
class _Server:
    id: int
    name: str
    container: str
    address: str
    requested: float  # unix time of POST /servers
    image: str  # the rehearsal image it boots
    snapshot: int | None = None  # the snapshot it boots, if any
    cancelled: bool = False
    error: str | None = None
    thread: threading.Thread | None = None


class Booter:
    """Makes, stops and inspects the containers of one fake cloud's servers."""

    def __init__(
        self, image: str, *, prefix: str = "sp00ky-rehearse",
        client: docker.DockerClient | None = None, images: Mapping[str, str] | None = None,
    ) -> None:  # fmt: skip
        self.image = image
        self.images = dict(images or {})  # Hetzner image -> rehearsal image (module docstring)
        self.prefix = prefix
        self.cloud = secrets.token_hex(4)
        self.network = f"{prefix}-{self.cloud}"
        self._client = client
        self._servers: dict[int, _Server] = {}
        self._taken: set[str] = set()
        self._lock = threading.Lock()
        self.subnet: ipaddress.IPv4Network | None = None
        # The host's address on the network, once open: a controller the servers should
        # reach listens there (SPKY_POOL_HOST) and is dialled there (SPKY_POOL_PUBLIC_URL).
        self.gateway = ""

    @property
    def client(self) -> docker.DockerClient:
        if self._client is None:
            try:
                self._client = docker.from_env()
                self._client.ping()
            except DockerException as exc:
                raise BootError(f"boot mode needs a Docker engine: {exc}") from exc
        return self._client

    def labels(self, **extra: str) -> dict[str, str]:
        return {CLOUD: self.cloud, **extra}

    # --- the network -------------------------------------------------------------------------

    def open(self) -> None:
        """Make this cloud's network with a subnet of its own, so that each server's address
        is known when POST /servers answers (as Hetzner's is). Docker picks a free subnet for
        a probe network; the real one is made with it."""
        for image in sorted({self.image, *self.images.values()}):
            try:
                self.client.images.get(image)
            except NotFound as exc:
                raise BootError(
                    f"the rehearsal image {image} is missing; build it: scripts/rehearsal-image"
                ) from exc
        probe = self.client.networks.create(
            f"{self.network}-probe", driver="bridge", labels=self.labels(**{ROLE: "network"})
        )
        try:
            probe.reload()
            config = probe.attrs["IPAM"]["Config"]
        finally:
            probe.remove()
        subnet, gateway = engine.ipv4_pool(config)
        ipam = docker.types.IPAMConfig(
            pool_configs=[docker.types.IPAMPool(subnet=subnet, gateway=gateway)]
        )
        self.client.networks.create(
            self.network, driver="bridge", ipam=ipam, labels=self.labels(**{ROLE: "network"})
        )
        self.subnet, self.gateway = ipaddress.IPv4Network(subnet), gateway

    def allocate(self) -> str:
        """A free address of the network for a new server."""
        if self.subnet is None:
            raise BootError("the boot mode's network is not open (use the fake as a context)")
        with self._lock:
            for host in self.subnet.hosts():
                text = str(host)
                if text != self.gateway and text not in self._taken:
                    self._taken.add(text)
                    return text
        raise BootError(f"no free address left in {self.subnet}")

    # --- servers -----------------------------------------------------------------------------

    def container_name(self, name: str) -> str:
        return f"{self.prefix}-{name}"

    def image_for(self, hetzner_image: str | None) -> str:
        """The rehearsal image a server of ``hetzner_image`` (a name, or an id) boots."""
        return self.images.get(hetzner_image or "", self.image)

    def start(
        self, server_id: int, name: str, user_data: str, address: str,
        on_started: Started, on_failed: Failed, image: str | None = None,
        snapshot: int | None = None,
    ) -> None:  # fmt: skip
        """Boot the server (of the Hetzner image ``image``) in a thread of its own; the
        callbacks say how it went. From ``snapshot`` (``commit``'s) its disk is that
        snapshot's, else the rehearsal image ``image`` maps to."""
        server = _Server(
            server_id, name, self.container_name(name), address, time.time(),
            self.image_for(image), snapshot,
        )  # fmt: skip
        server.thread = threading.Thread(
            target=self._boot, args=(server, user_data, on_started, on_failed),
            name=f"boot-{name}", daemon=True,
        )  # fmt: skip
        with self._lock:
            self._servers[server_id] = server
        server.thread.start()

    def _boot(self, server: _Server, user_data: str, started: Started, failed: Failed) -> None:
        try:
            api = self.client.api
            host_config = api.create_host_config(network_mode=self.network, **RUN)
            host_config.update(UNMASKED)
            endpoint = api.create_endpoint_config(ipv4_address=server.address)
            image = server.image if server.snapshot is None else self.snapshot_tag(server.snapshot)
            api.create_container(
                image, name=server.container, hostname=server.name, detach=True,
                labels=self.labels(**{ROLE: "server", SERVER: str(server.id)}),
                stop_signal=STOP_SIGNAL, host_config=host_config,
                networking_config={"EndpointsConfig": {self.network: endpoint}},
            )  # fmt: skip
            container = self.client.containers.get(server.container)
            if server.snapshot is not None:
                self._copy_disk(server.container, self.snapshot_volume(server.snapshot), False)
            container.put_archive("/", _seed(server, user_data))
            with self._lock:
                if server.cancelled:  # deleted while it was being made
                    container.remove(force=True, v=True)
                    return
            container.start()
        except Exception as exc:  # the thread's end: any failure is the server's, never silent
            server.error = f"server {server.name} did not boot: {exc}"
            failed(server.id, server.error)
            return
        started(server.id)

    def _get(self, server_id: int) -> _Server | None:
        with self._lock:
            return self._servers.get(server_id)

    def remove(self, server_id: int) -> None:
        """Delete: the container goes, at once and with its disk, as a deleted VM does."""
        server = self._get(server_id)
        if server is None:
            return
        with self._lock:
            server.cancelled = True
            self._taken.discard(server.address)
        if server.thread is not None:
            server.thread.join()
        with contextlib.suppress(NotFound):
            self.client.containers.get(server.container).remove(force=True, v=True)
        with self._lock:
            self._servers.pop(server_id, None)

    def power_off(self, server_id: int, graceful: bool) -> None:
        """``shutdown`` (graceful: systemd halts cleanly) or ``poweroff`` (the plug pulled)."""
        server = self._get(server_id)
        if server is None:
            return
        with contextlib.suppress(NotFound):
            container = self.client.containers.get(server.container)
            if graceful:
                container.stop(timeout=STOP_SECONDS)
            else:
                container.kill()

    def power_on(self, server_id: int) -> None:
        """A reboot of the same server: its disk, its instance-id (cloud-init's per-instance
        modules do not run again)."""
        server = self._get(server_id)
        if server is not None:
            self.client.containers.get(server.container).start()

    def running(self, server_id: int) -> bool | None:
        """Whether the server's container runs; None when it has none (yet, or any more)."""
        server = self._get(server_id)
        if server is None or server.error:
            return None
        try:
            container = self.client.containers.get(server.container)
        except NotFound:
            return None
        return bool(container.status == "running")

    # --- snapshots -----------------------------------------------------------------------------

    def snapshot_tag(self, image_id: int) -> str:
        return f"{self.prefix}-snapshot:{self.cloud}-{image_id}"

    def snapshot_volume(self, image_id: int) -> str:
        return f"{self.prefix}-snapshot-{self.cloud}-{image_id}"

    def commit(self, server_id: int, image_id: int) -> int:
        """create_image: the server's container committed as ``snapshot_tag``, and its Docker
        engine's disk (a volume, which a commit leaves out) copied into ``snapshot_volume``;
        the bytes the two hold, as a snapshot's size is its disk's data."""
        server = self._get(server_id)
        if server is None:
            raise BootError(f"server {server_id} has no container to snapshot")
        container = self.client.containers.get(server.container)
        repository, tag = self.snapshot_tag(image_id).split(":")
        changes = [f"LABEL {CLOUD}={self.cloud}", f"LABEL {ROLE}=snapshot"]
        committed = container.commit(repository=repository, tag=tag, changes=changes)
        self.client.volumes.create(
            self.snapshot_volume(image_id), labels=self.labels(**{ROLE: "snapshot"})
        )
        copied = self._copy_disk(server.container, self.snapshot_volume(image_id), True)
        return int(committed.attrs.get("Size") or 0) + copied

    def _copy_disk(self, container: str, volume: str, into_volume: bool) -> int:
        """Copy a server's Docker disk into ``volume`` (or ``volume`` onto it) in a helper
        container that mounts both; ``cp -a`` as root with the servers' capabilities keeps
        overlay2's xattrs and whiteouts. The bytes copied."""
        source, target = (DOCKER_DISK, "/snapshot") if into_volume else ("/snapshot", DOCKER_DISK)
        script = f"cp -a {source}/. {target}/ && du -sb {target} | cut -f1"
        output = self.client.containers.run(
            self.image, ["sh", "-c", script], remove=True, volumes_from=[container],
            volumes={volume: {"bind": "/snapshot", "mode": "rw"}},
            cap_add=RUN["cap_add"], cap_drop=RUN["cap_drop"], security_opt=RUN["security_opt"],
            labels=self.labels(**{ROLE: "server"}),
        )  # fmt: skip
        text = output.decode().strip() if isinstance(output, bytes) else ""
        return int(text) if text.isdigit() else 0

    def forget(self, image_id: int) -> None:
        """DELETE /images/{id}: the committed image and its disk go (a server booted from it
        keeps its own copy)."""
        with contextlib.suppress(NotFound):
            self.client.images.remove(self.snapshot_tag(image_id), force=True)
        with contextlib.suppress(NotFound):
            self.client.volumes.get(self.snapshot_volume(image_id)).remove(force=True)

    def close(self) -> None:
        """Every container and the network of this cloud removed (leftovers too)."""
        for server_id in list(self._servers):
            with contextlib.suppress(DockerException):
                self.remove(server_id)
        if self._client is not None:
            remove_leftovers(self._client, self.cloud)

    # --- inspection (the fake cloud's own, not the agent's) ---------------------------------

    def _container(self, name_or_id: int | str) -> Container:
        server = self._get(name_or_id) if isinstance(name_or_id, int) else None
        ref = server.container if server else self.container_name(str(name_or_id))
        try:
            return self.client.containers.get(ref)
        except NotFound as exc:
            raise BootError(f"server {name_or_id} has no container (deleted?)") from exc

    def exec(self, server: int | str, *command: str) -> tuple[int, str]:
        """Run a command in a running server: its exit code and output."""
        code, output = self._container(server).exec_run(list(command), demux=False)
        text = output.decode(errors="replace") if isinstance(output, bytes) else ""
        return int(code or 0), text

    def timeline(self, server: int | str) -> Timeline:
        """The times of one server's boot so far (see Timeline)."""
        container = self._container(server)
        labels = container.labels
        own = self._get(int(labels.get(SERVER, "0")))
        started = _docker_time(container.attrs["State"].get("StartedAt", ""))
        if container.status != "running":
            return Timeline(own.requested if own else None, started)
        status = _json(self.exec(server, "cat", "/run/cloud-init/status.json")).get("v1", {})
        result = _json(self.exec(server, "cat", "/run/cloud-init/result.json")).get("v1")
        stages = {
            stage: (status[stage].get("start"), status[stage].get("finished"))
            for stage in ("init-local", "init", "modules-config", "modules-final")
            if isinstance(status.get(stage), dict)
        }
        errors = tuple(
            str(error) for values in status.values() if isinstance(values, dict)
            for error in values.get("errors") or ()
        )  # fmt: skip
        done = None
        if result is not None:
            done = max((end for _, end in stages.values() if end is not None), default=None)
        return Timeline(
            requested=own.requested if own else None,
            container_started=started,
            stages=stages,
            cloud_init_done=done,
            cloud_init_errors=errors,
            runcmd_finished=self._runcmd_finished(server),
            agent_started=self._unit_started(server, "sp00ky-agent.service"),
        )

    def _runcmd_finished(self, server: int | str) -> float | None:
        code, output = self.exec(server, "cloud-init", "analyze", "dump")
        if code != 0:
            return None
        with contextlib.suppress(ValueError):
            for event in json.loads(output):
                name = str(event.get("name", ""))
                if event.get("event_type") == "finish" and name.endswith("scripts-user"):
                    return float(event["timestamp"])
                if event.get("event_type") == "finish" and name.endswith("scripts_user"):
                    return float(event["timestamp"])
        return None

    def _unit_started(self, server: int | str, unit: str) -> float | None:
        """A unit's ExecMainStartTimestamp, from its monotonic reading: the container shares
        the host's kernel, so its CLOCK_MONOTONIC is this process's ``time.monotonic``."""
        code, output = self.exec(
            server, "systemctl", "show", unit, "-p", "ExecMainStartTimestampMonotonic"
        )
        value = output.strip().partition("=")[2]
        if code != 0 or not value.isdigit() or int(value) == 0:
            return None
        return time.time() - (time.monotonic() - int(value) / 1e6)

    def console(self, server: int | str, lines: int = 80) -> str:
        """A console-ish log for a failure message: cloud-init's output, failed units, the
        agent's journal."""
        container = self._container(server)
        if container.status != "running":
            return f"(server {server} is not running: {container.status})\n" + _file(
                container, "/var/log/cloud-init-output.log", lines
            )
        parts = []
        for title, command in (
            ("cloud-init-output.log", ["tail", "-n", str(lines), "/var/log/cloud-init-output.log"]),
            ("failed units", ["systemctl", "--failed", "--no-legend", "--no-pager"]),
            ("sp00ky-agent journal", ["journalctl", "-u", "sp00ky-agent.service", "--no-pager",
                                      "-n", str(lines)]),
        ):  # fmt: skip
            parts.append(f"--- {title}\n{self.exec(server, *command)[1].rstrip()}")
        return "\n".join(parts) + "\n"


def _seed(server: _Server, user_data: str) -> bytes:
    """The NoCloud seed as a tar for ``put_archive``: user-data and meta-data."""
    meta = f"instance-id: {server.id}\nlocal-hostname: {server.name}\n"
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        parts = SEED.split("/")
        for depth in range(1, len(parts) + 1):
            info = tarfile.TarInfo("/".join(parts[:depth]))
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for name, text in (("user-data", user_data), ("meta-data", meta)):
            data = text.encode()
            info = tarfile.TarInfo(f"{SEED}/{name}")
            info.size, info.mode = len(data), 0o600
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _json(answer: tuple[int, str]) -> dict[str, Any]:
    code, output = answer
    if code != 0:
        return {}
    try:
        found = json.loads(output)
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def _docker_time(text: str) -> float | None:
    """Docker's RFC 3339 time with nanoseconds, as unix time."""
    if not text or text.startswith("0001-"):
        return None
    from datetime import datetime

    head, _, rest = text.partition(".")
    fraction = "0." + "".join(ch for ch in rest if ch.isdigit())[:6] if rest else "0"
    return datetime.fromisoformat(head + "+00:00").timestamp() + float(fraction)


def _file(container: Container, path: str, lines: int) -> str:
    """The last lines of a file in a container that is not running."""
    try:
        chunks, _ = container.get_archive(path)
        with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
            member = tar.extractfile(tar.getmembers()[0])
            text = member.read().decode(errors="replace") if member else ""
    except (APIError, tarfile.TarError, IndexError):
        return f"({path} cannot be read)\n"
    return "\n".join(text.splitlines()[-lines:]) + "\n"


def _gone(containers: list[Container], seconds: float) -> None:
    """Wait (at most ``seconds``) for containers another thread is removing to be gone."""
    deadline = time.monotonic() + seconds
    for container in containers:
        while time.monotonic() < deadline:
            try:
                container.reload()
            except NotFound:
                break
            time.sleep(0.2)


def remove_leftovers(client: docker.DockerClient, cloud: str | None = None) -> int:
    """Remove the containers and networks of one fake cloud (or, with None, of every
    rehearsal on this engine); how many containers there were."""
    selector = [f"{CLOUD}={cloud}"] if cloud else [ROLE]
    containers = client.containers.list(
        all=True, filters={"label": [*selector, f"{ROLE}=server"]}, ignore_removed=True
    )
    removing = []
    for container in containers:
        try:
            container.remove(force=True, v=True)
        except NotFound:
            pass
        except APIError as exc:  # a server's DELETE is removing it in the background
            if exc.status_code != 409 or "already in progress" not in str(exc):
                raise
            removing.append(container)
    _gone(removing, REMOVAL_SECONDS)  # its network goes only once it has
    for network in client.networks.list(filters={"label": [*selector, f"{ROLE}=network"]}):
        with contextlib.suppress(NotFound):
            network.remove()
    snapshots = {"label": [*selector, f"{ROLE}=snapshot"]}
    for image in client.images.list(filters=snapshots):
        with contextlib.suppress(NotFound, APIError):
            client.images.remove(str(image.id), force=True)
    for volume in client.volumes.list(filters=snapshots):
        with contextlib.suppress(NotFound, APIError):
            volume.remove(force=True)
    return len(containers)

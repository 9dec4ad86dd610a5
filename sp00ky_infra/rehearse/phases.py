"""Each rehearsed machine's create-to-ready time split into phases, read from three sides
that do not trust each other: the controller's machine row (requested, joined, ready), the
fake cloud's view of the server (POST /servers, container start, cloud-init's own status and
the agent unit's start), and the agent's journal inside the server (image fetched, image
ready); why a machine never became ready; and the estimate of the same phases on Hetzner
(``ESTIMATE`` gives its figures and their sources).

Pure: it reads what the rehearsal has gathered and does no I/O.
"""

from __future__ import annotations

import contextlib
import json
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from sp00ky_infra.config.machine_images import KNOWN_IMAGES, has_docker

PHASES = ("pulumi up", "create", "cloud-init", "agent install", "image", "healthcheck")
TOTAL = "create-to-ready"

# The image paths a rehearsal can take (``--paths``), and the ``machine.image`` each boots its
# machines from (baked: the pool's snapshot, which the controller bakes before the burst).
PATHS = ("default", "fallback", "baked")
PATH_IMAGES: dict[str, str] = {
    "default": "docker-ce",
    "fallback": "debian-12",
    "baked": "baked",  # the controller bakes it, as in production
}
SNAPSHOT_PATHS = ("baked",)  # the paths whose machines boot the pool's baked snapshot

# Hetzner's own log of a boot: the GitLab fleeting plugin tutorial (2024-11-13, two cpx21
# servers from debian-12 in hel1, cloud-init installing docker-ce from Docker's repository)
FLEETING_LOG = (
    "https://community.hetzner.com/tutorials/howto-setup-gitlab-ci-auto-scaling-infrastructure"
)


@dataclass(frozen=True, slots=True)
class Figure:
    """A phase's seconds on Hetzner (None: as measured here) and where the figure comes
    from: a source, or the word assumed and why."""

    seconds: float | None
    source: str


# The figures behind the Hetzner estimate, per phase. A phase measured here runs the same
# software on a VM with the same kind of CPU, so it is taken as is.
ESTIMATE: dict[str, Figure] = {
    "pulumi up": Figure(None, "the same engine and program on the controller's host"),
    "create": Figure(
        16.0,
        f"POST /servers to a running server, Hetzner's own log ({FLEETING_LOG}): "
        "'increasing instances amount=2' at 09:57:26, both 'instance discovery ... "
        "state=running' at 09:57:42 (cpx21, debian-12, hel1, 2024-11-13)",
    ),
    "cloud-init": Figure(None, "the same cloud-init (Debian 12's) and the same user-data"),
    "agent install": Figure(
        None,
        "the same install-agent.sh: on the default docker-ce image, as on the rehearsal image, "
        "Docker is there already; on an image without it, the variant without Docker measures "
        "the install of docker.io here (else DOCKER_INSTALL is added)",
    ),
    "image": Figure(
        None,
        "fetched over the host's bridge; in the cloud it crosses the internet from the "
        "controller (or a registry), so a large image takes longer on a slow uplink",
    ),
    "healthcheck": Figure(None, "the same backend on the same kind of engine"),
}

# What install-agent.sh's apt-get install docker.io adds to a boot on Hetzner, on an image
# without Docker, where the rehearsal could not measure it.
DOCKER_INSTALL_SECONDS = 30.0
DOCKER_INSTALL = Figure(
    DOCKER_INSTALL_SECONDS,
    "assumed: about 80 MB of docker.io and its dependencies from Hetzner's Debian mirror, then "
    f"unpacking. Hetzner's own log ({FLEETING_LOG}) has its servers ready 65 and 83 s after "
    "they ran ('instance is ready ... took=1m5.3s', 'took=1m22.7s') with docker-ce installed "
    "by cloud-init, but that span also holds the guest's boot and a full package_upgrade: it "
    "bounds the install from above without isolating it",
)

# A server made from a custom snapshot: Hetzner copies the snapshot to the server's host, so
# its create can take longer than from Hetzner's own images.
SNAPSHOT_CREATE = Figure(
    16.0,
    "assumed: as from one of Hetzner's own images (ESTIMATE's create), for a snapshot of a "
    "few GB stored in the server's location. Users report servers from custom snapshots taking "
    "longer: 40-60 min from 20-30 GB snapshots, where Hetzner's images were fast "
    "(github.com/hetznercloud/terraform-provider-hcloud/issues/312); slower from a snapshot "
    "stored in another location (same, issues/503); 'Hetzner is REALLY slow to start "
    "snapshots' (github.com/mrsimonemms/devpod-provider-hetzner/issues/17). No figure for a "
    "small snapshot was found",
)
SNAPSHOT_NOTE = (
    "booted from the pool's baked snapshot: on Hetzner a server made from a custom snapshot "
    "can take longer to create than one from Hetzner's own image (the estimate's create "
    "assumes it does not)"
)


def parse_paths(text: str) -> tuple[str, ...]:
    """``--paths``: ``all``, or path names joined by commas, each once, in the order given.
    ValueError names what is wrong."""
    if text.strip() == "all":
        return PATHS
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in PATHS]
    if unknown or not names:
        raise ValueError(
            f"unknown path {', '.join(unknown) or repr(text)}: say all, or some of "
            + ", ".join(PATHS)
        )
    return tuple(dict.fromkeys(names))


def image_notes(images: Mapping[str, str], installs_here: bool) -> list[str]:
    """What each pool's image (pool -> machine.image) means for its boots in the cloud;
    ``installs_here``: an image without Docker boots the rehearsal variant without it."""
    notes = []
    for pool, image in images.items():
        docker = has_docker(image)
        if docker is False:
            where = (
                "measured here on the rehearsal image without Docker"
                if installs_here
                else "rehearsed here with Docker present, so not measured (build the variant "
                "without it: scripts/rehearsal-image --without-docker)"
            )
            notes.append(
                f"{pool}: image {image} has no Docker: install-agent.sh installs docker.io at "
                f"boot, about {DOCKER_INSTALL_SECONDS:.0f} s on Hetzner (assumed); {where}"
            )
        elif docker:
            known = KNOWN_IMAGES[image]
            notes.append(
                f"{pool}: image {image} has Docker, so nothing is installed at boot; it is "
                f"{known.os_flavor} {known.os_version}, rehearsed here on Debian 12"
            )
        else:
            notes.append(
                f"{pool}: image {image} is a snapshot (or an image not known here), rehearsed "
                "on a stand-in with Docker; where it lacks Docker or python3-requests, "
                "install-agent.sh installs them at boot"
            )
    return notes


@dataclass(frozen=True, slots=True)
class Timeline:
    """When each phase of one server's boot happened (unix times; None: not yet, or not
    known). Read from inside the server by the fake cloud itself, never from the agent."""

    requested: float | None = None  # POST /servers
    container_started: float | None = None
    stages: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)
    cloud_init_done: float | None = None  # result.json written: every stage finished
    cloud_init_errors: tuple[str, ...] = ()
    runcmd_finished: float | None = None  # scripts-user ran install-agent.sh
    agent_started: float | None = None  # sp00ky-agent.service's ExecMainStartTimestamp


class MachineTimes(Protocol):
    """What the controller's machine row says of a boot (unix times)."""

    @property
    def created_at(self) -> float: ...
    @property
    def joined_at(self) -> float | None: ...
    @property
    def ready_at(self) -> float | None: ...
    @property
    def failed_reason(self) -> str | None: ...


def later(old: Timeline, new: Timeline) -> Timeline:
    """``new``, with what it does not know (a server no longer running tells only its start)
    taken from ``old``."""
    return Timeline(
        requested=new.requested or old.requested,
        container_started=new.container_started or old.container_started,
        stages={**old.stages, **new.stages},
        cloud_init_done=new.cloud_init_done or old.cloud_init_done,
        cloud_init_errors=new.cloud_init_errors or old.cloud_init_errors,
        runcmd_finished=new.runcmd_finished or old.runcmd_finished,
        agent_started=new.agent_started or old.agent_started,
    )


def agent_events(journal: str) -> dict[str, float]:
    """The first time of each agent event (``event=NAME``) in its journal (``-o json``)."""
    found: dict[str, float] = {}
    for line in journal.splitlines():
        with contextlib.suppress(ValueError, KeyError, TypeError):
            entry = json.loads(line)
            message = entry.get("MESSAGE")
            if isinstance(message, list):  # journald gives non-UTF-8 messages as bytes
                message = bytes(message).decode(errors="replace")
            matched = re.search(r"\bevent=(\w+)", str(message))
            if matched:
                found.setdefault(matched.group(1), int(entry["__REALTIME_TIMESTAMP"]) / 1e6)
    return found


def _span(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else round(max(end - start, 0.0), 2)


def phases(
    machine: MachineTimes, timeline: Timeline, events: dict[str, float]
) -> dict[str, float | None]:
    """Create-to-ready split at what each side saw: the controller's row, the cloud's server,
    the agent's journal."""
    final_start = (timeline.stages.get("modules-final") or (None, None))[0]
    joined = machine.joined_at or events.get("joined") or events.get("rejoined")
    image_ready = events.get("image_ready") or events.get("image_cached")
    return {
        "pulumi up": _span(machine.created_at, timeline.requested),
        "create": _span(timeline.requested, timeline.container_started),
        "cloud-init": _span(timeline.container_started, final_start),
        "agent install": _span(final_start, joined),
        "image": _span(joined, image_ready),
        "healthcheck": _span(image_ready, machine.ready_at),
    }


def cause(
    machine: MachineTimes,
    timeline: Timeline,
    events: dict[str, float],
    healthcheck: str | None = None,
) -> str:
    """Why a machine never became ready, from the last phase it reached."""
    if timeline.container_started is None:
        return f"the server never started ({machine.failed_reason or 'no reason given'})"
    if timeline.cloud_init_errors:
        return "cloud-init failed: " + "; ".join(timeline.cloud_init_errors)[:300]
    if timeline.agent_started is None and not machine.joined_at:
        return "cloud-init ran but the agent never started (see the server's console)"
    if not machine.joined_at:
        return "the agent started but never joined the controller (is the pool URL reachable?)"
    if not (events.get("image_ready") or events.get("image_cached")):
        return f"the backend's image never arrived ({machine.failed_reason or 'no reason given'})"
    asked = f"GET {healthcheck} with a 2xx" if healthcheck else "on its port"
    return (
        f"the backend started from its image but never answered its healthcheck ({asked}) "
        f"before the boot timeout ({machine.failed_reason or 'no reason given'})"
    )


def estimate_figures(
    ready: Sequence[Mapping[str, float | None]], unmeasured_install: bool = False,
    snapshot: bool = False,
) -> dict[str, Figure]:  # fmt: skip
    """Each phase on Hetzner with its source: ESTIMATE's figure (SNAPSHOT_CREATE's for a
    machine made from a ``snapshot``), else the median measured here over the phases of the
    machines that became ready; ``unmeasured_install``: an image without Docker was
    rehearsed with it, so the agent install gets DOCKER_INSTALL more."""
    found: dict[str, Figure] = {}
    for phase in PHASES:
        figure = SNAPSHOT_CREATE if snapshot and phase == "create" else ESTIMATE[phase]
        if figure.seconds is None:
            measured = [v for m in ready if (v := m.get(phase)) is not None]
            median = round(statistics.median(measured), 2) if measured else None
            figure = Figure(median, f"measured here (the ready machines' median): {figure.source}")
        found[phase] = figure
    install = found["agent install"].seconds
    if unmeasured_install and install is not None:
        found["agent install"] = Figure(
            round(install + DOCKER_INSTALL_SECONDS, 2),
            f"measured here with Docker present, plus {DOCKER_INSTALL_SECONDS:.0f} s "
            f"for docker.io: {DOCKER_INSTALL.source}",
        )
    return found


def estimate(
    ready: Sequence[Mapping[str, float | None]], unmeasured_install: bool = False,
    snapshot: bool = False,
) -> dict[str, float | None]:  # fmt: skip
    """``estimate_figures``' seconds and their total."""
    figures = estimate_figures(ready, unmeasured_install, snapshot)
    found: dict[str, float | None] = {phase: f.seconds for phase, f in figures.items()}
    known = [v for v in found.values() if v is not None]
    found["total"] = round(sum(known), 1) if known else None
    return found


def spread(values: Sequence[float]) -> tuple[float, float] | None:
    """The median and the maximum of ``values``; None for none."""
    return (round(statistics.median(values), 2), max(values)) if values else None


def side_by_side(
    paths: Mapping[str, Sequence[Mapping[str, float | None]]],
) -> dict[str, dict[str, tuple[float, float] | None]]:
    """A row per phase and one for the create-to-ready total (TOTAL), a column per path: the
    median and maximum over the path's ready machines (each a mapping of phase -> seconds,
    TOTAL included); None where no machine of the path saw that phase."""
    return {
        row: {
            path: spread([v for m in machines if (v := m.get(row)) is not None])
            for path, machines in paths.items()
        }
        for row in (*PHASES, TOTAL)
    }


BOOTSTRAP_EVENT = re.compile(r"sp00ky-bootstrap event=(\w+)")
DOWNLOADS = ("agent fetched", "agent present", "image fetched", "image cached")


def downloads(events: Mapping[str, float], bootstrap: Sequence[str]) -> dict[str, bool]:
    """What one machine's boot downloaded, from the agent's journal events and bootstrap's
    output lines: the agent archive fetched (``agent_fetched``, or ``installed`` from a
    bootstrap that always fetches) or already present (``agent_present``); the backend's
    image fetched (``image_ready``) or already in the engine (``image_cached``)."""
    said = {m.group(1) for line in bootstrap if (m := BOOTSTRAP_EVENT.search(line))}
    present = "agent_present" in said
    cached = "image_cached" in events
    return {
        "agent fetched": not present and bool(said & {"agent_fetched", "installed"}),
        "agent present": present,
        "image fetched": not cached and "image_ready" in events,
        "image cached": cached,
    }


def count_downloads(machines: Sequence[Mapping[str, bool]]) -> dict[str, int]:
    """How many machines fetched or found present the agent and the image (DOWNLOADS)."""
    return {kind: sum(1 for m in machines if m.get(kind)) for kind in DOWNLOADS}

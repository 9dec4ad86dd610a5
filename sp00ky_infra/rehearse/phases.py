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

# The figures behind the Hetzner estimate, per phase: (seconds or None = as measured here,
# what it is, where it comes from). A phase measured here runs the same software on a VM with
# the same kind of CPU, so it is taken as is.
ESTIMATE: dict[str, tuple[float | None, str]] = {
    "pulumi up": (None, "the same engine and program on the controller's host"),
    "create": (
        10.0,
        "POST /servers to a booted VM: 'it boots in about ten seconds' (alchemy.run, Hetzner "
        "Server docs); hcloud deploy actions wait 40 s for SSH (nicokempe/"
        "hetzner-cloud-deploy-action, startup-timeout default)",
    ),
    "cloud-init": (None, "the same cloud-init (Debian 12's) and the same user-data"),
    "agent install": (
        None,
        "the same install-agent.sh: on the default docker-ce image, as on the rehearsal image, "
        "Docker is there already; an image without it adds DOCKER_INSTALL_SECONDS where the "
        "rehearsal did not install it (the variant without Docker measures it here)",
    ),
    "image": (
        None,
        "measured here over the host's bridge; in the cloud it crosses the internet from the "
        "controller (or a registry), so a large image takes longer on a slow uplink",
    ),
    "healthcheck": (None, "the same backend on the same kind of engine"),
}


# What install-agent.sh's apt-get install docker.io adds to a boot on Hetzner, on an image
# without Docker: assumed, not measured (about 80 MB with its dependencies from Hetzner's
# Debian mirror, then unpacking).
DOCKER_INSTALL_SECONDS = 30.0


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


def estimate(
    ready: Sequence[Mapping[str, float | None]], unmeasured_install: bool = False
) -> dict[str, float | None]:
    """Each phase on Hetzner: ESTIMATE's figure, else the median measured here over the
    phases of the machines that became ready; ``unmeasured_install``: an image without
    Docker was rehearsed with it, so the agent install gets DOCKER_INSTALL_SECONDS more."""
    found: dict[str, float | None] = {}
    for phase in PHASES:
        figure, _ = ESTIMATE[phase]
        measured = [v for m in ready if (v := m.get(phase)) is not None]
        median = round(statistics.median(measured), 2) if measured else None
        found[phase] = figure if figure is not None else median
    install = found["agent install"]
    if unmeasured_install and install is not None:
        found["agent install"] = round(install + DOCKER_INSTALL_SECONDS, 2)
    known = [v for v in found.values() if v is not None]
    found["total"] = round(sum(known), 1) if known else None
    return found

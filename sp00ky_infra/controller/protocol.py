"""The agents' protocol, version 1: JSON shapes of /v1 on the pool listener.

The agent (standard library + requests only) mirrors every message here as a frozen dataclass
in ``agent/protocol.py``; ``tests/controller/test_protocol_agreement.py`` holds the two to the same
messages, fields, optional fields and defaults. Change both, or that test fails.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

AGENT_DESCRIPTION = (
    "The sha256 of the agent archive the agent runs, when it knows (it ran from an archive it "
    "upgraded to, or was told at its first join): the controller records it."
)


class JoinRequest(BaseModel):
    machine: str
    token: str = Field(description="The one-time join token from the machine's user-data.")
    agent: str | None = Field(default=None, max_length=64, description=AGENT_DESCRIPTION)


class RejoinRequest(BaseModel):
    """POST /v1/machines/{name}/rejoin: an agent back after a reboot or a restart."""

    credential: str = Field(
        description="The machine credential of its first join (from its credential file)."
    )
    agent: str | None = Field(default=None, max_length=64, description=AGENT_DESCRIPTION)


class RegistryCredentials(BaseModel):
    """What the Engine API's X-Registry-Auth carries; sent only in the join reply."""

    username: str
    password: str
    serveraddress: str = Field(description="The registry's host[:port].")


class ImageSource(BaseModel):
    """Where the machine gets the backend's image, pinned for this deploy."""

    source: Literal["registry", "controller"] = Field(
        description="`registry`: pull `reference` through the machine's engine; `controller`: "
        "GET /v1/machines/{name}/images/{reference} and load it."
    )
    reference: str = Field(description="registry: NAME@sha256:DIGEST; controller: the image id.")
    name: str | None = Field(default=None, description="A name to tag a loaded image with.")
    auth: RegistryCredentials | None = Field(default=None, description="For a private registry.")


class BackendInfo(BaseModel):
    name: str
    port: int | None = Field(description="deploy.port: where the backend listens in its image.")
    healthcheck: str | None
    command: list[str] = Field(description="deploy.command, for process machines.")
    image: str | None = Field(default=None, description="The image, for docker machines.")
    image_source: ImageSource | None = Field(
        default=None, description="Where docker machines fetch the image (when it is settled)."
    )
    env: dict[str, str] = Field(description="The backend's own env (never the store's secrets).")


class AgentSettings(BaseModel):
    slots: int
    lease: float = Field(description="Seconds an attempt's lease lasts without a renewal.")
    poll_wait: float = Field(description="The longest a poll waits for work.")
    recycle: Literal["job", "never"]
    boot_timeout: float
    max_offline: float = Field(description="Out of contact this long, the machine shuts down.")


class JoinReply(BaseModel):
    session: str = Field(description="Send as `Authorization: Bearer <session>` from now on.")
    machine: str
    pool: str
    backend: BackendInfo
    settings: AgentSettings
    credential: str | None = Field(
        default=None,
        description="The machine credential, issued at the first join only (a rejoin keeps "
        "it): the agent keeps it in a 0600 file and rejoins with it after a reboot.",
    )
    agent: str | None = Field(
        default=None,
        description="The sha256 of the agent archive this controller serves "
        "(GET /v1/machines/{name}/agent): an agent that runs another upgrades itself to it once "
        "it runs no job. An agent that does not know the field ignores it.",
    )


class ReadyRequest(BaseModel):
    ok: bool
    reason: str | None = None


class BootFailure(BaseModel):
    reason: str = Field(max_length=2000, description="Why the bootstrap did not install the agent.")


class Ack(BaseModel):
    """The answer to ready, drained and boot-failed."""

    ok: bool


class RunningAttempt(BaseModel):
    job: str
    attempt: str
    posted: float | None = Field(
        default=None,
        description="Seconds from the poll answer that assigned it to its POST being sent "
        "(the dispatch time's machine side; once sent).",
    )
    fresh: bool = Field(
        default=False,
        description="Its lease was renewed a moment ago (less than a thirtieth of the lease): "
        "this poll leaves it as it is, only checks that the attempt is still current, and the "
        "agent does not count it as a renewal.",
    )


class ErrorInfo(BaseModel):
    code: Literal["backend_error", "backend_unreachable", "timeout"]
    reason: str
    status: int | None = Field(default=None, description="The backend's HTTP status.")


class FinishedAttempt(BaseModel):
    """A result carried on a poll: recorded before the poll renews leases or claims work, so
    its slot counts as free in the same round trip."""

    job: str
    attempt: str
    status: Literal["success", "failed", "cancelled"]
    result: Any = None
    error: ErrorInfo | None = None
    posted: float | None = Field(
        default=None,
        description="Seconds from the poll answer that assigned it to its POST being sent.",
    )


class PollRequest(BaseModel):
    running: list[RunningAttempt] = Field(
        default_factory=list,
        description="Attempts the machine holds: running, or finished with a result not yet "
        "acknowledged. Their leases are renewed.",
    )
    free_slots: int = Field(default=0, ge=0, description="Jobs the machine can start now.")
    wait: float = Field(default=0.0, ge=0, le=60, description="Seconds to wait for work.")
    refill: bool = Field(
        default=False,
        description="The machine starts work in a slot that a result posted on its own frees "
        "while this poll is held (the held poll then answers with it); false: none.",
    )
    beside: bool = Field(
        default=False,
        description="Sent beside the machine's held poll, which stays held: it carries results "
        "and takes work for the slots they free, and is answered at once. When it leaves a "
        "slot unclaimed, or says no `refill` (those slots take no work now), the held poll "
        "answers, so that the agent polls again.",
    )
    results: list[FinishedAttempt] = Field(
        default_factory=list,
        description="Finished attempts' results, recorded first (each acknowledged in the "
        "reply's `results`); the same as POSTing each to .../result.",
    )


class Assignment(BaseModel):
    job: str
    attempt: str
    path: str
    payload: Any
    deadline: float | None = Field(description="Unix time by which the attempt must end.")
    lease_expires_at: float


class Stop(BaseModel):
    job: str
    attempt: str
    reason: Literal["cancelled", "stale"]


class ResultAck(BaseModel):
    job: str
    attempt: str
    job_status: str | None = Field(default=None, description="Recorded: the job's status now.")
    refused: str | None = Field(
        default=None, description="Never will be recorded (a stale attempt): why. Drop it."
    )


class PollReply(BaseModel):
    assignments: list[Assignment] = Field(default_factory=list)
    stop: list[Stop] = Field(default_factory=list)
    drain: bool = False
    lease: float
    now: float
    results: list[ResultAck] = Field(
        default_factory=list, description="One for each result the poll carried."
    )
    agent: str | None = Field(
        default=None,
        description="Only while the machine runs another agent than the one this controller "
        "serves (as its last join or rejoin said): that archive's sha256, as in the join reply.",
    )


class ResultRequest(BaseModel):
    status: Literal["success", "failed", "cancelled"]
    result: Any = None
    error: ErrorInfo | None = None
    posted: float | None = Field(
        default=None,
        description="Seconds from the poll answer that assigned it to its POST being sent.",
    )


class ResultReply(BaseModel):
    job_status: str


class Problem(BaseModel):
    error: str

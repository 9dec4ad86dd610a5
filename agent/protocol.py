"""The agents' protocol, version 1, as the agent speaks it: the JSON shapes of /v1.

A standard-library mirror of the controller's pydantic models
(``sp00ky_infra/controller/protocol.py``): the same messages, field names, optional fields and
defaults; ``tests/controller/test_protocol_agreement.py`` fails when the two differ. Each
message is a frozen dataclass; ``Message.from_json`` checks what the controller sent, field by
field, and raises ProtocolError naming the message, the field and what was expected;
``to_json`` gives what the agent sends. Fields the agent does not know are ignored, as the
controller does.

    agent sends                      controller answers
    POST /v1/join      JoinRequest   JoinReply (BackendInfo, AgentSettings, credential)
    POST .../rejoin    RejoinRequest JoinReply (no new credential)
    POST .../ready     ReadyRequest  Ack
    POST .../poll      PollRequest   PollReply (Assignment, Stop, ResultAck)
                       (results of finished attempts ride the poll: FinishedAttempt;
                       while a long-poll is held, they go on a poll ``beside`` it)
    POST .../result    ResultRequest ResultReply
    POST .../drained   (no body)     Ack
    GET  .../images/ID (no body)     the image as a docker save tar (ImageSource "controller")
    any error answer                 Problem

    GET  .../agent     (no body)     the agent archive (tar.bz2) an upgrade fetches, checked
                                     against the sha256 of the join or poll reply's ``agent``

    before the join, the bootstrap (agent/bootstrap.py), its join token as bearer:
    GET  .../agent     (no body)     the agent archive (tar.bz2), checked against the
                                     user-data's sha256 before it is unpacked
    POST .../boot-failed BootFailure Ack
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Self, TypeVar, Union, get_args, get_origin, get_type_hints

from agent.errors import ProtocolError


class Message:
    """A message of the protocol: parsed and dumped by its dataclass fields' annotations."""

    __slots__ = ()

    @classmethod
    def from_json(cls, data: object) -> Self:
        """The message in ``data`` (decoded JSON), checked; ProtocolError if it is not one."""
        return _message(cls, data, cls.__name__)

    def to_json(self) -> dict[str, Any]:
        """The message as JSON values, every field present."""
        dumped: dict[str, Any] = _dump(self)
        return dumped


@dataclass(frozen=True, slots=True, kw_only=True)
class JoinRequest(Message):
    machine: str
    token: str  # the one-time join token from the machine's user-data
    agent: str | None = None  # the sha256 of the agent archive it runs, when it knows


@dataclass(frozen=True, slots=True, kw_only=True)
class RejoinRequest(Message):
    credential: str  # the machine credential of its first join (from its credential file)
    agent: str | None = None  # the sha256 of the agent archive it runs, when it knows


@dataclass(frozen=True, slots=True, kw_only=True)
class RegistryCredentials(Message):
    username: str
    password: str
    serveraddress: str  # the registry's host[:port]


@dataclass(frozen=True, slots=True, kw_only=True)
class ImageSource(Message):
    source: Literal["registry", "controller"]  # pull through the engine, or fetch and load
    reference: str  # registry: NAME@sha256:DIGEST; controller: the image id
    name: str | None = None  # a name to tag a loaded image with
    auth: RegistryCredentials | None = None  # for a private registry


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendInfo(Message):
    name: str
    port: int | None  # deploy.port: where the backend listens in its image
    healthcheck: str | None
    command: tuple[str, ...]  # deploy.command, for process machines
    image: str | None = None  # the image, for docker machines
    image_source: ImageSource | None = None  # where docker machines fetch it, when settled
    env: Mapping[str, str]  # the backend's own env (never the store's secrets)


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentSettings(Message):
    slots: int
    lease: float  # seconds an attempt's lease lasts without a renewal
    poll_wait: float  # the longest a poll waits for work
    recycle: Literal["job", "never"]
    boot_timeout: float
    max_offline: float  # out of contact this long, the machine shuts down


@dataclass(frozen=True, slots=True, kw_only=True)
class JoinReply(Message):
    session: str  # send as `Authorization: Bearer <session>` from now on
    machine: str
    pool: str
    backend: BackendInfo
    settings: AgentSettings
    credential: str | None = None  # issued at the first join only: kept in a 0600 file
    agent: str | None = None  # the sha256 of the agent archive the controller serves


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadyRequest(Message):
    ok: bool
    reason: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class BootFailure(Message):
    reason: str  # why the bootstrap (agent/bootstrap.py) did not install the agent


@dataclass(frozen=True, slots=True, kw_only=True)
class Ack(Message):
    ok: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class RunningAttempt(Message):
    job: str
    attempt: str
    posted: float | None = None  # seconds from the poll answer that assigned it to its POST
    fresh: bool = False  # its lease renewed less than lease / 30 ago: this poll leaves it


ErrorCode = Literal["backend_error", "backend_unreachable", "timeout"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorInfo(Message):
    code: ErrorCode
    reason: str
    status: int | None = None  # the backend's HTTP status


@dataclass(frozen=True, slots=True, kw_only=True)
class FinishedAttempt(Message):
    job: str
    attempt: str
    status: Literal["success", "failed", "cancelled"]
    result: Any = None
    error: ErrorInfo | None = None
    posted: float | None = None  # seconds from the poll answer that assigned it to its POST


@dataclass(frozen=True, slots=True, kw_only=True)
class PollRequest(Message):
    running: tuple[RunningAttempt, ...] = ()  # held: running, or a result not yet acknowledged
    free_slots: int = 0  # jobs the machine can start now (slots of results sent here count)
    wait: float = 0.0  # seconds to wait for work
    refill: bool = False  # work may start in a slot a result posted on its own frees meanwhile
    beside: bool = False  # sent beside the held poll (which stays held): answered at once
    results: tuple[FinishedAttempt, ...] = ()  # recorded before anything else of the poll


@dataclass(frozen=True, slots=True, kw_only=True)
class Assignment(Message):
    job: str
    attempt: str
    path: str
    payload: Any
    deadline: float | None  # unix time by which the attempt must end
    lease_expires_at: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Stop(Message):
    job: str
    attempt: str
    reason: Literal["cancelled", "stale"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ResultAck(Message):
    job: str
    attempt: str
    job_status: str | None = None  # recorded: the job's status now
    refused: str | None = None  # never will be (a stale attempt): why; the agent drops it


@dataclass(frozen=True, slots=True, kw_only=True)
class PollReply(Message):
    assignments: tuple[Assignment, ...] = ()
    stop: tuple[Stop, ...] = ()
    drain: bool = False
    lease: float
    now: float
    results: tuple[ResultAck, ...] = ()  # one for each result the poll carried
    agent: str | None = None  # only while the machine runs another agent than the one served


@dataclass(frozen=True, slots=True, kw_only=True)
class ResultRequest(Message):
    status: Literal["success", "failed", "cancelled"]
    result: Any = None
    error: ErrorInfo | None = None
    posted: float | None = None  # seconds from the poll answer that assigned it to its POST


@dataclass(frozen=True, slots=True, kw_only=True)
class ResultReply(Message):
    job_status: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Problem(Message):
    error: str


# --- reading and writing, driven by the annotations ------------------------------------------

_SCALARS: dict[type, str] = {str: "a string", bool: "true or false", int: "an integer"}
_ADVICE = (
    "the agent and the controller must speak the same protocol (v1): "
    "install the agent this controller ships"
)

# Each message's fields as (name, resolved annotation, required), and each annotation's
# (origin, args): worked out once, not on every message parsed (a poll's answer is parsed
# several times a second under load).
_FIELDS: dict[type[Message], tuple[tuple[str, Any, bool], ...]] = {}
_SHAPES: dict[Any, tuple[Any, tuple[Any, ...]]] = {}


def _fields(cls: type[Message]) -> tuple[tuple[str, Any, bool], ...]:
    known = _FIELDS.get(cls)
    if known is None:
        hints = get_type_hints(cls)
        known = _FIELDS[cls] = tuple(
            (
                field.name,
                hints[field.name],
                field.default is dataclasses.MISSING
                and field.default_factory is dataclasses.MISSING,
            )
            for field in dataclasses.fields(cls)  # type: ignore[arg-type]
        )
    return known


def _shape(kind: Any) -> tuple[Any, tuple[Any, ...]]:
    known = _SHAPES.get(kind)
    if known is None:
        known = _SHAPES[kind] = (get_origin(kind), get_args(kind))
    return known


M = TypeVar("M", bound=Message)
_PLAIN = frozenset({str, int, float, bool})


def _message(cls: type[M], data: object, where: str) -> M:
    if not isinstance(data, dict):
        raise _wrong(where, f"an object ({cls.__name__})", data)
    values: dict[str, Any] = {}
    for name, kind, required in _fields(cls):
        if name in data:
            values[name] = _value(kind, data[name], where, name)
        elif required:
            raise ProtocolError(f"{where}.{name}: missing from the controller's answer; {_ADVICE}")
    return cls(**values)


def _place(parent: str, key: str | int) -> str:
    """Where a value sits, for a message: built only when one is needed."""
    return f"{parent}[{key}]" if isinstance(key, int) else f"{parent}.{key}"


def _value(kind: Any, data: object, parent: str, key: str | int) -> Any:
    if kind is Any:
        return data
    origin, args = _shape(kind)
    if origin in (Union, types.UnionType):
        if data is None and type(None) in args:
            return None
        (inner,) = (arg for arg in args if arg is not type(None))
        return _value(inner, data, parent, key)
    if origin is Literal:
        if data not in args:
            raise _wrong(_place(parent, key), "one of " + ", ".join(map(repr, args)), data)
        return data
    if origin is tuple:
        if not isinstance(data, list):
            raise _wrong(_place(parent, key), "a list", data)
        where = _place(parent, key)
        return tuple(_value(args[0], item, where, i) for i, item in enumerate(data))
    if origin is Mapping:
        if not isinstance(data, dict):
            raise _wrong(_place(parent, key), "an object", data)
        where = _place(parent, key)
        return {str(k): _value(args[1], v, where, str(k)) for k, v in data.items()}
    if isinstance(kind, type) and issubclass(kind, Message):
        return _message(kind, data, _place(parent, key))
    if kind is float:
        if isinstance(data, int | float) and not isinstance(data, bool):
            return float(data)
        raise _wrong(_place(parent, key), "a number", data)
    if type(data) is not kind:  # bool is an int to isinstance, never to the protocol
        raise _wrong(_place(parent, key), _SCALARS[kind], data)
    return data


def _wrong(where: str, expected: str, got: object) -> ProtocolError:
    shown = repr(got) if len(repr(got)) <= 60 else repr(got)[:57] + "..."
    return ProtocolError(f"{where}: expected {expected}, got {shown}; {_ADVICE}")


def _dump(value: object) -> Any:
    if value is None or type(value) in _PLAIN:  # most values: before the ABC's isinstance
        return value
    if isinstance(value, Message):
        return {name: _dump(getattr(value, name)) for name, _, _ in _fields(type(value))}
    if isinstance(value, list | tuple):
        return [_dump(item) for item in value]
    if isinstance(value, Mapping):
        return {key: _dump(item) for key, item in value.items()}
    return value

"""Machine rows and pool state (pause, breaker, incidents): what the controller rebuilds from.

A machine moves as the lifecycle table (``policy.machines``) allows, and only so: every move
names its reason, the table gives the states it may come from and the one it goes to, and the
store applies it with one compare-and-set on the state. The columns a move sets follow from
its target; callers never name columns.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from sp00ky_infra.policy.breaker import Breaker
from sp00ky_infra.policy.machines import INITIAL, LIVE_STATES, MachineState, Reason, Rule, rule
from sp00ky_infra.store.dialect import Dialect, Later
from sp00ky_infra.store.model import Conflict, StoreError

MACHINE_COLUMNS = (
    "name, pool, provider, state, revision, slots, created_at, updated_at, joined_at, ready_at, "
    "last_seen_at, idle_since, drain_reason, drained, failed_reason, destroyed_at, provider_id, "
    "provider_state, session_hash, credential_hash, failed_at, agent"
)
IncidentKind = Literal["pool_breaker_open"]


class MachineNotFound(StoreError):
    pass


def machine_key(name: str) -> str:
    """The key (``transaction(key=...)``) every transaction that moves a machine's running
    jobs holds from its start: its polls, its results, the sweep's change of one of its jobs.
    Such a transaction locks job rows and, through the busy-slots trigger, the machine's row,
    in an order that depends on what it carries (a result of a job: the job's row, then the
    machine's; a poll that renews it: the machine's, then the job's); without the key two of
    them can deadlock on PostgreSQL."""
    return f"machine:{name}"


@dataclass(frozen=True, slots=True)
class Machine:
    name: str
    pool: str
    provider: str
    state: MachineState
    revision: str
    slots: int
    created_at: float
    updated_at: float
    joined_at: float | None
    ready_at: float | None
    last_seen_at: float | None
    idle_since: float | None
    drain_reason: str | None
    drained: bool
    failed_reason: str | None
    destroyed_at: float | None
    provider_id: str | None
    provider_state: str | None
    session_hash: str | None
    credential_hash: str | None = None  # the machine credential's, issued at its first join
    failed_at: float | None = None  # when it failed (a destroy moves updated_at on, not this)
    agent: str | None = None  # the sha256 of the agent archive it runs, as its last join said

    def as_json(self) -> dict[str, Any]:
        data = {name: getattr(self, name) for name in MACHINE_COLUMNS.replace(" ", "").split(",")}
        data.pop("session_hash")
        data.pop("credential_hash")
        return data


@dataclass(frozen=True, slots=True)
class Incident:
    id: str
    pool: str
    kind: str
    message: str
    opened_at: float
    closed_at: float | None

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "pool": self.pool,
            "kind": self.kind,
            "message": self.message,
            "opened_at": self.opened_at,
            "closed_at": self.closed_at,
        }


@dataclass(frozen=True, slots=True)
class Lifetime:
    """One machine's life, as billing sees it."""

    name: str
    provider: str
    created_at: float
    destroyed_at: float | None
    busy_seconds: float  # closed busy periods
    busy_since: float | None  # an open one

    def seconds(self, now: float) -> float:
        return max((self.destroyed_at or now) - self.created_at, 0.0)

    def busy(self, now: float) -> float:
        """Time with at least one job on it (the open period up to ``now`` or its end)."""
        open_period = 0.0
        if self.busy_since is not None:
            open_period = max((self.destroyed_at or now) - self.busy_since, 0.0)
        return min(self.busy_seconds + open_period, self.seconds(now))


@dataclass(frozen=True, slots=True)
class PoolState:
    pool: str
    paused: bool = False
    breaker: Breaker = field(default_factory=Breaker)


@dataclass(frozen=True, slots=True)
class Change:
    """What a move records beside the state: the provisioner's id of the machine (PROVISIONED),
    and a failed machine's reason in words when it says more than its Reason."""

    provider_id: str | None = None
    provider_state: str | None = None
    detail: str | None = None


NO_CHANGE = Change()


def _columns(found: Rule, now: float, change: Change) -> list[tuple[str, Any]]:
    """The columns a move sets, from where it goes."""
    reason = change.detail or found.reason.value
    if found.target == "booting" and change.provider_id is not None:
        return [("provider_id", change.provider_id), ("provider_state", change.provider_state)]
    if found.target == "ready":
        return [("ready_at", now), ("idle_since", now)]
    if found.target == "draining":
        return [("drain_reason", reason)]
    if found.target == "failed":
        return [("failed_reason", reason), ("failed_at", now)]
    if found.target == "destroyed" and found.reason == Reason.LEFT_BEHIND:
        return [("destroyed_at", now), ("failed_reason", reason), ("failed_at", now)]
    if found.target == "destroyed":
        return [("destroyed_at", now)]
    return []


def _machine(row: Sequence[Any]) -> Machine:
    (name, pool, provider, state, revision, slots, created_at, updated_at, joined_at, ready_at,
     last_seen_at, idle_since, drain_reason, drained, failed_reason, destroyed_at, provider_id,
     provider_state, session_hash, credential_hash, failed_at, agent) = row  # fmt: skip
    return Machine(
        name=name,
        pool=pool,
        provider=provider,
        state=state,
        revision=revision,
        slots=slots,
        created_at=created_at,
        updated_at=updated_at,
        joined_at=joined_at,
        ready_at=ready_at,
        last_seen_at=last_seen_at,
        idle_since=idle_since,
        drain_reason=drain_reason,
        drained=bool(drained),
        failed_reason=failed_reason,
        destroyed_at=destroyed_at,
        provider_id=provider_id,
        provider_state=provider_state,
        session_hash=session_hash,
        credential_hash=credential_hash,
        failed_at=failed_at,
        agent=agent,
    )


class MachineTable:
    """The machines table, on the store's connections."""

    def __init__(self, db: Dialect) -> None:
        self._db = db

    def add(
        self, name: str, pool: str, provider: str, revision: str, slots: int, now: float
    ) -> Machine:
        """A new machine row, ``requested`` (SCALE_UP: the executor asks a provisioner next)."""
        with self._db.read() as sql:
            sql.execute(
                "INSERT INTO machines (name, pool, provider, state, revision, slots, created_at, "
                "updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (name, pool, provider, INITIAL, revision, slots, now, now),
            )
        return self.get(name)

    def get(self, name: str) -> Machine:
        return self.send_get(name).result()

    def send_get(self, name: str) -> Later[Machine]:
        """``get``, sent (``Later``: MachineNotFound comes when the outcome is asked for)."""

        def machine(rows: list[Any]) -> Machine:
            if not rows:
                raise MachineNotFound(
                    f"no machine {name!r}; `sp00ky-infra pools get POOL` lists them"
                )
            return _machine(rows[0])

        rows = self._db.send(f"SELECT {MACHINE_COLUMNS} FROM machines WHERE name = ?", (name,))
        return rows.then(machine)

    def live(self, pool: str | None = None) -> list[Machine]:
        """Machines not yet destroyed (failed ones too, until they are), oldest first."""
        where = " AND pool = ?" if pool else ""
        with self._db.read() as sql:
            sql.execute(
                f"SELECT {MACHINE_COLUMNS} FROM machines WHERE state <> 'destroyed'{where} "
                "ORDER BY created_at, name",
                (pool,) if pool else (),
            )
            return [_machine(row) for row in sql.fetchall()]

    def count_live(self) -> int:
        """How many machines are not yet destroyed (``live()``'s length, without its rows)."""
        with self._db.read() as sql:
            sql.execute("SELECT COUNT(*) FROM machines WHERE state <> 'destroyed'")
            row = sql.fetchone()
            return int(row[0]) if row else 0

    def recent(self, pool: str, limit: int = 50) -> list[Machine]:
        with self._db.read() as sql:
            sql.execute(
                f"SELECT {MACHINE_COLUMNS} FROM machines WHERE pool = ? "
                "ORDER BY created_at DESC, name LIMIT ?",
                (pool, limit),
            )
            return [_machine(row) for row in sql.fetchall()]

    def move(self, name: str, reason: Reason, now: float, change: Change = NO_CHANGE) -> bool:
        """Move the machine as ``reason`` allows, if it is in a state the table allows it from;
        False when it is not (the compare-and-set lost). ForbiddenMove for a reason that moves
        no machine."""
        found = rule(reason)
        assignments = [("state", found.target), ("updated_at", now), *_columns(found, now, change)]
        marks = ", ".join("?" for _ in found.sources)
        with self._db.read() as sql:
            sql.execute(
                f"UPDATE machines SET {', '.join(f'{column} = ?' for column, _ in assignments)} "
                f"WHERE name = ? AND state IN ({marks})",
                (*(value for _, value in assignments), name, *found.sources),
            )
            return bool(sql.rowcount == 1)

    def join(
        self, name: str, session_hash: str, now: float, credential_hash: str | None = None
    ) -> Machine:
        """The machine's agent joined (JOINED): bind its session and its machine credential.
        Only once, only while booting."""
        found = rule(Reason.JOINED)
        marks = ", ".join("?" for _ in found.sources)
        with self._db.read() as sql:
            sql.execute(
                "UPDATE machines SET session_hash = ?, credential_hash = ?, joined_at = ?, "
                "last_seen_at = ?, state = ?, updated_at = ? WHERE name = ? "
                f"AND session_hash IS NULL AND state IN ({marks})",
                (session_hash, credential_hash, now, now, found.target, now, name, *found.sources),
            )
            if sql.rowcount != 1:
                raise Conflict(f"machine {name!r} cannot join: it joined already or is not booting")
        return self.get(name)

    def rejoin(self, name: str, credential_hash: str, session_hash: str, now: float) -> Machine:
        """Its agent came back (a reboot, a restart) with the credential of its first join:
        a new session replaces the old one, and the state stays as it is (no move). Only for
        a live machine whose credential matches; Conflict otherwise."""
        marks = ", ".join("?" for _ in LIVE_STATES)
        with self._db.read() as sql:
            sql.execute(
                "UPDATE machines SET session_hash = ?, last_seen_at = ?, updated_at = ? "
                f"WHERE name = ? AND credential_hash = ? AND state IN ({marks})",
                (session_hash, now, now, name, credential_hash, *LIVE_STATES),
            )
            if sql.rowcount != 1:
                raise Conflict(f"machine {name!r} cannot rejoin: not live, or another credential")
        return self.get(name)

    def ran_agent(self, name: str, agent: str) -> None:
        """Its agent said at a join or rejoin that it runs the agent archive ``agent``."""
        self._set(name, ("agent", agent))

    def seen(self, name: str, now: float) -> None:
        """Its agent polled at ``now``."""
        self._set(name, ("last_seen_at", now))

    def set_idle(self, name: str, since: float | None) -> None:
        """Start (``since``) or stop (None) the machine's idle clock. Starting it closes the
        machine's busy period, if one is open (its time goes to busy_seconds)."""
        if since is None:
            self._set(name, ("idle_since", None))
            return
        with self._db.read() as sql:
            sql.execute(
                "UPDATE machines SET idle_since = ?, busy_seconds = busy_seconds + "
                "CASE WHEN busy_since IS NULL OR busy_since > ? THEN 0 ELSE ? - busy_since END, "
                "busy_since = NULL WHERE name = ?",
                (since, since, since, name),
            )

    def busy(self, name: str, now: float) -> None:
        """The machine took work at ``now``: its idle clock stops and a busy period opens
        (unless one is open already)."""
        with self._db.read() as sql:
            sql.execute(
                "UPDATE machines SET idle_since = NULL, busy_since = coalesce(busy_since, ?) "
                "WHERE name = ?",
                (now, name),
            )

    def lifetimes(self, pool: str) -> list[Lifetime]:
        """Every machine the pool ever had: created, destroyed (None while live) and busy
        time; what its bill is made of (policy/cost.py applies the rule)."""
        with self._db.read() as sql:
            sql.execute(
                "SELECT name, provider, created_at, destroyed_at, busy_seconds, busy_since "
                "FROM machines WHERE pool = ? ORDER BY created_at, name",
                (pool,),
            )
            return [Lifetime(*row) for row in sql.fetchall()]

    def set_provider(self, name: str, provider_id: str | None, provider_state: str) -> None:
        """What the provisioner reported of it after the move (an asynchronous provisioner)."""
        self._set(name, ("provider_id", provider_id), ("provider_state", provider_state))

    def set_provider_state(self, name: str, provider_state: str) -> None:
        self._set(name, ("provider_state", provider_state))

    def mark_drained(self, name: str, now: float) -> None:
        """Its agent finished its jobs and left: the tick destroys it."""
        self._set(name, ("drained", 1), ("updated_at", now))

    def _set(self, name: str, *assignments: tuple[str, Any]) -> None:
        """Bookkeeping that does not change the state (column names are this module's own)."""
        sets = ", ".join(f"{column} = ?" for column, _ in assignments)
        with self._db.read() as sql:
            sql.execute(
                f"UPDATE machines SET {sets} WHERE name = ?",
                (*(value for _, value in assignments), name),
            )

    def machine_seconds(self, pool: str, now: float) -> float:
        """Machine time from creation to destruction (or now), summed over the pool's machines."""
        with self._db.read() as sql:
            sql.execute(
                "SELECT coalesce(sum(coalesce(destroyed_at, ?) - created_at), 0) "
                "FROM machines WHERE pool = ?",
                (now, pool),
            )
            return float(sql.fetchone()[0])

    def use_nonce(self, nonce: str, machine: str, now: float) -> bool:
        """Record a join token's nonce; False when it was used before (a replay)."""
        with self._db.read() as sql:
            sql.execute(
                "INSERT INTO join_nonces (nonce, machine, used_at) VALUES (?, ?, ?) "
                "ON CONFLICT (nonce) DO NOTHING",
                (nonce, machine, now),
            )
            return bool(sql.rowcount == 1)


class PoolTable:
    """Pause flags, breakers and incidents of pools."""

    def __init__(self, db: Dialect) -> None:
        self._db = db

    def state(self, pool: str) -> PoolState:
        with self._db.read() as sql:
            sql.execute(
                "SELECT paused, breaker_failures, breaker_opened, breaker_open_until "
                "FROM pool_state WHERE pool = ?",
                (pool,),
            )
            row = sql.fetchone()
        if row is None:
            return PoolState(pool)
        return PoolState(pool, bool(row[0]), Breaker(int(row[1]), int(row[2]), row[3]))

    def _upsert(self, pool: str, now: float, column_values: dict[str, Any]) -> None:
        columns = ", ".join(column_values)
        marks = ", ".join("?" for _ in column_values)
        updates = ", ".join(f"{name} = excluded.{name}" for name in column_values)
        with self._db.read() as sql:
            sql.execute(
                f"INSERT INTO pool_state (pool, updated_at, {columns}) VALUES (?, ?, {marks}) "
                f"ON CONFLICT (pool) DO UPDATE SET updated_at = excluded.updated_at, {updates}",
                (pool, now, *column_values.values()),
            )

    def set_paused(self, pool: str, paused: bool, now: float) -> None:
        self._upsert(pool, now, {"paused": int(paused)})

    def save_breaker(self, pool: str, breaker: Breaker, now: float) -> None:
        self._upsert(
            pool,
            now,
            {
                "breaker_failures": breaker.failures,
                "breaker_opened": breaker.opened,
                "breaker_open_until": breaker.open_until,
            },
        )

    def open_incident(self, pool: str, kind: IncidentKind, message: str, now: float) -> bool:
        """Open an incident unless one of that kind is open for the pool; True if opened."""
        with self._db.write() as sql:
            sql.execute(
                "SELECT id FROM incidents WHERE pool = ? AND kind = ? AND closed_at IS NULL",
                (pool, kind),
            )
            if sql.fetchone() is not None:
                return False
            sql.execute(
                "INSERT INTO incidents (id, pool, kind, message, opened_at) VALUES (?, ?, ?, ?, ?)",
                (f"incident:{secrets.token_hex(8)}", pool, kind, message, now),
            )
            return True

    def close_incidents(self, pool: str, kind: IncidentKind, now: float) -> int:
        with self._db.read() as sql:
            sql.execute(
                "UPDATE incidents SET closed_at = ? WHERE pool = ? AND kind = ? "
                "AND closed_at IS NULL",
                (now, pool, kind),
            )
            return int(sql.rowcount)

    def incidents(self, pool: str | None = None, limit: int = 50) -> list[Incident]:
        where = " WHERE pool = ?" if pool else ""
        with self._db.read() as sql:
            sql.execute(
                f"SELECT id, pool, kind, message, opened_at, closed_at FROM incidents{where} "
                "ORDER BY opened_at DESC LIMIT ?",
                (*((pool,) if pool else ()), limit),
            )
            return [Incident(*row) for row in sql.fetchall()]


__all__ = [
    "LIVE_STATES",
    "NO_CHANGE",
    "Change",
    "Incident",
    "Machine",
    "MachineNotFound",
    "MachineTable",
    "PoolState",
    "PoolTable",
]

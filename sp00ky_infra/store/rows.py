"""Job rows: the columns, the statements that write whole rows, and the mapping to ``Job``.

``UPDATE_JOB`` and ``update_row`` (and ``INSERT_JOB`` and ``insert_row``) agree column by column.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sp00ky_infra.store.model import Job, NewJob

COLUMNS = (
    "id, backend, tbl, path, payload, status, retries, max_retries, retry_strategy, delay_ms, "
    "timeout, errors, result, assignee, assigned_to, created_at, updated_at, pool, priority, "
    "slots, run_after, queue_timeout, queue_deadline, max_job_duration, attempt, "
    "attempt_number, machine, lease_expires_at, deadline, cancel_requested, started_at, "
    "finished_at, attempts"
)
_COLUMN_NAMES = [name.strip() for name in COLUMNS.split(",")]
QUEUE_ORDER = "priority DESC, created_at, id"
UPDATE_JOB = (
    "UPDATE jobs SET status = ?, retries = ?, errors = ?, result = ?, assignee = ?, "
    "updated_at = ?, run_after = ?, queue_deadline = ?, attempt = ?, attempt_number = ?, "
    "machine = ?, lease_expires_at = ?, deadline = ?, cancel_requested = ?, started_at = ?, "
    "finished_at = ?, attempts = ? "
    "WHERE id = ? AND status = ? AND attempt IS NOT DISTINCT FROM ? AND cancel_requested = ? "
    "AND lease_expires_at IS NOT DISTINCT FROM ?"
)
INSERT_JOB = (
    "INSERT INTO jobs (id, backend, tbl, path, payload, status, max_retries, retry_strategy, "
    "delay_ms, timeout, assigned_to, created_at, updated_at, pool, priority, slots, run_after, "
    "queue_timeout, queue_deadline, max_job_duration) "
    "VALUES (?, ?, ?, ?, ?, 'pending', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


def job_from_row(row: Sequence[Any]) -> Job:
    values = dict(zip(_COLUMN_NAMES, row, strict=True))
    return Job(
        id=values["id"],
        backend=values["backend"],
        table=values["tbl"],
        path=values["path"],
        payload=json.loads(values["payload"]),
        status=values["status"],
        retries=values["retries"],
        max_retries=values["max_retries"],
        retry_strategy=values["retry_strategy"],
        delay_ms=values["delay_ms"],
        timeout=values["timeout"],
        errors=tuple(json.loads(values["errors"])),
        result=None if values["result"] is None else json.loads(values["result"]),
        assignee=values["assignee"],
        assigned_to=values["assigned_to"],
        created_at=values["created_at"],
        updated_at=values["updated_at"],
        pool=values["pool"],
        priority=values["priority"],
        slots=values["slots"],
        run_after=values["run_after"],
        queue_timeout=values["queue_timeout"],
        queue_deadline=values["queue_deadline"],
        max_job_duration=values["max_job_duration"],
        attempt=values["attempt"],
        attempt_number=values["attempt_number"],
        machine=values["machine"],
        lease_expires_at=values["lease_expires_at"],
        deadline=values["deadline"],
        cancel_requested=bool(values["cancel_requested"]),
        started_at=values["started_at"],
        finished_at=values["finished_at"],
        attempts=tuple(json.loads(values["attempts"])),
    )


def filters(**columns: Any) -> tuple[str, tuple[Any, ...]]:
    present = {name: value for name, value in columns.items() if value is not None}
    if not present:
        return "", ()
    return " WHERE " + " AND ".join(f"{name} = ?" for name in present), tuple(present.values())


def insert_row(new: NewJob, job_id: str, now: float) -> tuple[Any, ...]:
    run_after = now + new.delay_ms / 1000.0
    queue_deadline = None if new.queue_timeout is None else run_after + new.queue_timeout
    return (
        job_id,
        new.backend,
        new.table,
        new.path,
        json.dumps(new.payload),
        new.max_retries,
        new.retry_strategy,
        new.delay_ms,
        new.timeout,
        new.assigned_to,
        now,
        now,
        new.pool,
        new.priority,
        new.slots,
        run_after,
        new.queue_timeout,
        queue_deadline,
        new.max_job_duration,
    )


def update_row(before: Job, after: Job) -> tuple[Any, ...]:
    return (
        after.status,
        after.retries,
        json.dumps(list(after.errors)),
        None if after.result is None else json.dumps(after.result),
        after.assignee,
        after.updated_at,
        after.run_after,
        after.queue_deadline,
        after.attempt,
        after.attempt_number,
        after.machine,
        after.lease_expires_at,
        after.deadline,
        int(after.cancel_requested),
        after.started_at,
        after.finished_at,
        json.dumps(list(after.attempts)),
        before.id,
        before.status,
        before.attempt,
        int(before.cancel_requested),
        before.lease_expires_at,
    )

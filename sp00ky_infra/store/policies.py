"""Each outbox table's job policy, kept in the store so it can be retuned live (the Jobs docs:
"the policy lives in the database ... retune live, no redeploy"): how many of the table's jobs
run at once (``concurrency``), and the retries of a new job that does not set its own
(``max_retries``, ``retry_strategy``).

sp00ky.yml declares a table's policy (``method.concurrency``, ``method.maxRetries``,
``method.retryStrategy``); a controller that starts writes it only where the file's
declaration changed since the one it last wrote (``declared``), so a live change
(``sp00ky-infra jobs policy``, the admin API, MCP) outlives restarts and deploys that leave the
table's lines alone, and a deploy that changes them wins. Every controller reads the table
at each tick; admission uses what it read.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from sp00ky_infra.config import Config
from sp00ky_infra.policy.jobs import RETRY_STRATEGIES, RetryStrategy
from sp00ky_infra.store.dialect import Dialect
from sp00ky_infra.store.model import InvalidJob

COLUMNS = "tbl, concurrency, max_retries, retry_strategy, declared, updated_at, updated_by"
DEFAULT_MAX_RETRIES = 3  # the Jobs docs' job table: max_retries DEFAULT ALWAYS 3
DEFAULT_RETRY_STRATEGY: RetryStrategy = "linear"
FROM_FILE = "sp00ky.yml"


@dataclass(frozen=True, slots=True)
class TablePolicy:
    """A table's policy; None: no cap beyond the pool's slots, or the jobs docs' default."""

    concurrency: int | None = None
    max_retries: int | None = None
    retry_strategy: RetryStrategy | None = None

    def checked(self) -> TablePolicy:
        """Itself, or InvalidJob naming the value and what it may be."""
        if self.concurrency is not None and self.concurrency < 1:
            raise InvalidJob(f"concurrency {self.concurrency}: at least 1 (or none: no cap)")
        if self.max_retries is not None and self.max_retries < 0:
            raise InvalidJob(f"max_retries {self.max_retries}: 0 or more")
        if self.retry_strategy is not None and self.retry_strategy not in RETRY_STRATEGIES:
            raise InvalidJob(
                f"retry_strategy {self.retry_strategy!r}: one of {', '.join(RETRY_STRATEGIES)}"
            )
        return self

    @property
    def retries(self) -> tuple[int, RetryStrategy]:
        """What a new job of the table that sets none takes: max_retries, retry_strategy."""
        max_retries = DEFAULT_MAX_RETRIES if self.max_retries is None else self.max_retries
        return max_retries, self.retry_strategy or DEFAULT_RETRY_STRATEGY

    def to_json(self) -> dict[str, Any]:
        return {
            "concurrency": self.concurrency,
            "max_retries": self.max_retries,
            "retry_strategy": self.retry_strategy,
        }


@dataclass(frozen=True, slots=True)
class KeptPolicy:
    """A table's policy as kept, with who wrote it last and when."""

    table: str
    policy: TablePolicy
    updated_at: float
    updated_by: str

    def to_json(self) -> dict[str, Any]:
        return {
            "table": self.table,
            **self.policy.to_json(),
            "updated_at": self.updated_at,
            "updated_by": self.updated_by,
        }


class PolicyTable:
    """The tables' job policies (migration 12's ``job_policies``)."""

    def __init__(self, db: Dialect) -> None:
        self._db = db

    def declare(self, declared: Mapping[str, TablePolicy], now: float) -> list[str]:
        """sp00ky.yml's policies, written where the file's declaration of a table changed since
        the last one written (or the table has none yet); the tables written."""
        written = []
        with self._db.write() as sql:
            for table, policy in sorted(declared.items()):
                text = json.dumps(asdict(policy), sort_keys=True)
                row = sql.execute(
                    "SELECT declared FROM job_policies WHERE tbl = ?", (table,)
                ).fetchone()
                if row is not None and row[0] == text:
                    continue  # unchanged in the file: a live change stands
                sql.execute("DELETE FROM job_policies WHERE tbl = ?", (table,))
                sql.execute(
                    f"INSERT INTO job_policies ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (table, *_values(policy), text, now, FROM_FILE),
                )
                written.append(table)
        return written

    def retune(self, table: str, changes: Mapping[str, Any], now: float, by: str) -> KeptPolicy:
        """Change some of a table's policy live (``changes``: TablePolicy's fields; a None
        value clears one); the policy as kept. InvalidJob for a bad value."""
        unknown = sorted(set(changes) - set(TablePolicy.__dataclass_fields__))
        if unknown:
            raise InvalidJob(f"no policy setting {', '.join(unknown)}")
        with self._db.write() as sql:
            row = sql.execute(f"SELECT {COLUMNS} FROM job_policies WHERE tbl = ?", (table,))
            found = row.fetchone()
            before = _kept(found).policy if found else TablePolicy()
            policy = replace(before, **changes).checked()
            if found is None:
                sql.execute(
                    f"INSERT INTO job_policies ({COLUMNS}) VALUES (?, ?, ?, ?, NULL, ?, ?)",
                    (table, *_values(policy), now, by),
                )
            else:
                sql.execute(
                    "UPDATE job_policies SET concurrency = ?, max_retries = ?, "
                    "retry_strategy = ?, updated_at = ?, updated_by = ? WHERE tbl = ?",
                    (*_values(policy), now, by, table),
                )
        return KeptPolicy(table, policy, now, by)

    def read(self) -> dict[str, KeptPolicy]:
        """Every table's kept policy, by table."""
        with self._db.read() as sql:
            rows = sql.execute(f"SELECT {COLUMNS} FROM job_policies ORDER BY tbl").fetchall()
        return {row[0]: _kept(row) for row in rows}


def _values(policy: TablePolicy) -> tuple[int | None, int | None, str | None]:
    return policy.concurrency, policy.max_retries, policy.retry_strategy


def _kept(row: Any) -> KeptPolicy:
    table, concurrency, max_retries, strategy, _, updated_at, updated_by = row
    policy = TablePolicy(
        None if concurrency is None else int(concurrency),
        None if max_retries is None else int(max_retries),
        strategy,
    )
    return KeptPolicy(table, policy, float(updated_at), updated_by)


def declared_policies(config: Config) -> dict[str, TablePolicy]:
    """Each pool backend's outbox table's policy as sp00ky.yml declares it."""
    return {
        backend.method.table: TablePolicy(
            backend.method.concurrency, backend.method.max_retries, backend.method.retry_strategy
        )
        for backend in config.backends.values()
        if backend.method is not None and backend.pool is not None
    }


def policy_json(table: str, kept: KeptPolicy | None, declared: TablePolicy) -> dict[str, Any]:
    """What `jobs policy` and the admin API show of a table: the kept policy, or the file's
    until a controller wrote it; the defaults filled in."""
    policy = kept.policy if kept else declared
    max_retries, strategy = policy.retries
    return {
        "table": table,
        "concurrency": policy.concurrency,
        "max_retries": max_retries,
        "retry_strategy": strategy,
        "updated_by": kept.updated_by if kept else "sp00ky.yml (no controller has written it yet)",
        "updated_at": kept.updated_at if kept else None,
    }


def policy_rows(
    kept: Mapping[str, KeptPolicy], declared: Mapping[str, TablePolicy], table: str | None = None
) -> list[dict[str, Any]]:
    """``policy_json`` of each table sp00ky.yml declares, by name (of ``table`` alone, when
    given)."""
    names = [table] if table is not None else sorted(declared)
    return [policy_json(name, kept.get(name), declared[name]) for name in names]
